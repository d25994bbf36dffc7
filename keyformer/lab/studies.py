"""The lab's studies: each ``experiments/<study>/`` folder with a ``findings.py``, found at run time.

The library never imports a study by name. :func:`studies` imports each ``experiments/<study>/findings.py`` as
``experiments.<study>.findings`` (the ``experiments`` package loaded from its folder, default
``./experiments``), in experiment order; the report engine, the pages and the brief read what they define.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from keyformer.lab import findings as fnd

EXPERIMENTS = Path("experiments")  # the studies' folder, relative to the checkout's root (the working folder)


def _study_key(name: str) -> tuple[int, str]:
    m = re.match(r"exp(\d+)_", name)
    return (int(m[1]) if m else 1000, name)


def studies(root: Path | None = None) -> list[ModuleType]:
    """The ``findings`` module of every study under ``root`` (default ``./experiments``), in experiment order.

    A study is a folder ``experiments/<study>/`` with a ``findings.py`` defining ``SECTIONS`` (and optionally
    ``brief(res) -> list[str]``). The library never imports a study by name: it finds them here and imports
    each as ``experiments.<study>.findings``, the ``experiments`` package loaded from ``root``.
    """
    root = (root or EXPERIMENTS).resolve()
    if not (root / "__init__.py").is_file():
        return []
    pkg = sys.modules.get(root.name)
    if pkg is None or Path(next(iter(getattr(pkg, "__path__", [])), "")).resolve() != root:
        spec = importlib.util.spec_from_file_location(root.name, root / "__init__.py",
                                                      submodule_search_locations=[str(root)])
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[root.name] = pkg
        spec.loader.exec_module(pkg)
    names = sorted((d.name for d in root.iterdir() if (d / "findings.py").is_file()), key=_study_key)
    return [importlib.import_module(f"{root.name}.{n}.findings") for n in names]


def study_name(study: ModuleType) -> str:
    return study.__name__.split(".")[-2]


def results_folder(study: ModuleType) -> str:
    return getattr(study, "RESULTS", study_name(study))


def answers(res: Path, root: Path | None = None) -> list[tuple[ModuleType, str]]:
    """Each study's one-line answer, read from its committed ``findings.json`` (studies without one are left
    out)."""
    out = []
    for study in studies(root):
        if not Path(study.__file__).with_name("page.md").is_file():
            continue
        f = res / results_folder(study) / "findings.json"
        if f.is_file() and hasattr(study, "answer"):
            out.append((study, study.answer(fnd.load(f))))
        elif hasattr(study, "answer_rows"):  # a descriptive study: no comparisons, its answer read from rows
            out.append((study, study.answer_rows(res)))
    return out
