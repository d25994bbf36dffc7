"""The lab's studies, declared through one plug-in point: a registry module.

A registry is an importable module with ``STUDIES``, the import paths of its studies' ``findings`` modules in
the order the report shows them (kvpress's ``evaluate_registry`` is the model). The checkout's own is
``experiments.registry``; ``KEYFORMER_STUDIES=mypkg.registry`` (or ``keyformer-report --studies``) names
another. The library never names a study: the report engine, the pages and the brief read what each
registered ``findings`` module defines (``SECTIONS``, ``comparisons``, ``answer``, ...).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from keyformer.lab import findings as fnd

REGISTRY = "experiments.registry"  # the checkout's studies (experiments/registry.py)
REGISTRY_ENV = "KEYFORMER_STUDIES"


def registry_name(registry: str | None = None) -> str:
    return registry or os.environ.get(REGISTRY_ENV) or REGISTRY


def studies(registry: str | None = None) -> list[ModuleType]:
    """The ``findings`` module of every study the registry lists (default :data:`REGISTRY`, or
    ``$KEYFORMER_STUDIES``), in its order; none when its package is nowhere (a checkout without studies).
    The package is imported as usual, else from the working folder, as ``python -m`` would."""
    name = registry_name(registry)
    top = name.split(".")[0]
    if top not in sys.modules and importlib.util.find_spec(top) is None:
        spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])  # as ``python -m`` would find it
        if spec is None or spec.loader is None:
            return []
        sys.modules[top] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    reg = importlib.import_module(name)
    return [importlib.import_module(m) for m in reg.STUDIES]


def registry_folder(registry: str | None = None) -> Path:
    """The folder of the registry module (where the results index's template ``index.md`` lives)."""
    studies(registry)
    mod = sys.modules.get(registry_name(registry))
    return Path(mod.__file__).parent if mod is not None and mod.__file__ else Path(".")


def study_name(study: ModuleType) -> str:
    return study.__name__.split(".")[-2]


def results_folder(study: ModuleType) -> str:
    return getattr(study, "RESULTS", study_name(study))


def answers(res: Path, registry: str | None = None,
            fresh: dict[Path, str] | None = None) -> list[tuple[ModuleType, str]]:
    """Each study's one-line answer, read from its committed ``findings.json`` (or its text in ``fresh``,
    the files being generated; studies without one are left out)."""
    out = []
    for study in studies(registry):
        if not Path(study.__file__).with_name("page.md").is_file():
            continue
        f = res / results_folder(study) / "findings.json"
        if fresh and f in fresh and hasattr(study, "answer"):
            out.append((study, study.answer(fnd.loads(fresh[f], f))))
        elif f.is_file() and hasattr(study, "answer"):
            out.append((study, study.answer(fnd.load(f))))
        elif hasattr(study, "answer_rows"):  # a descriptive study: no comparisons, its answer read from rows
            out.append((study, study.answer_rows(res)))
    return out
