"""The resume identity's code hash covers every module a task imports, found from its import closure."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from keyformer.run.code_identity import CodeIdentityError, code_files, code_hash, import_closure
from keyformer.run.paths import PACKAGE

GENERATE = ("keyformer.run.tasks.generate",)
LM_EVAL = ("keyformer.run.tasks.lm_eval.task",)


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A copy of the installed package's source, to edit."""
    root = tmp_path / "keyformer"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _hash(root: Path, modules=GENERATE, data=()) -> str:
    return code_hash.__wrapped__(modules, data, root)  # uncached: the files change between calls


def _edit(f: Path) -> None:
    f.write_text(f.read_text() + "\n# an edit\n")


@pytest.mark.parametrize("rel", ["run/metrics.py", "run/data/loaders.py", "run/data/prompts.py",
                                 "run/tasks/generate.py", "core/cache.py", "core/policies/h2o.py",
                                 "run/loading.py"])
def test_editing_a_module_the_task_imports_changes_the_hash(package: Path, rel: str) -> None:
    before = _hash(package)
    _edit(package / rel)
    assert _hash(package) != before


def test_editing_code_the_task_never_imports_keeps_the_hash(package: Path) -> None:
    before = _hash(package)
    _edit(package / "lab" / "report.py")  # the report engine: no task imports it
    assert _hash(package) == before


def test_lm_eval_task_yaml_is_data_of_its_identity(package: Path) -> None:
    data = ("run/tasks/lm_eval/tasks",)
    before = _hash(package, LM_EVAL, data)
    _edit(next((package / "run/tasks/lm_eval/tasks").glob("*.yaml")))
    assert _hash(package, LM_EVAL, data) != before


def test_closure_holds_lazy_relative_and_parent_imports(tmp_path: Path) -> None:
    """On a hand-made package: a function-level import, a relative import, a module named in a string and
    a parent package's ``__init__`` are all reached; a module nothing imports is not."""
    root = tmp_path / "keyformer"
    (root / "a").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "a" / "__init__.py").write_text("")
    (root / "a" / "task.py").write_text("def f():\n    from .helper import g\n    return g\n"
                                        "REG = {'x': 'keyformer.a.named:Cls'}\n")
    (root / "a" / "helper.py").write_text("from keyformer.a.deep import h\n")
    (root / "a" / "deep.py").write_text("h = 1\n")
    (root / "a" / "named.py").write_text("class Cls: ...\n")
    (root / "a" / "unused.py").write_text("")
    got = set(import_closure(["keyformer.a.task"], root))
    assert got == {"keyformer", "keyformer.a", "keyformer.a.task", "keyformer.a.helper", "keyformer.a.deep",
                   "keyformer.a.named"}


def test_a_missing_module_or_path_is_an_error(package: Path) -> None:
    with pytest.raises(CodeIdentityError, match="keyformer.run.nope"):
        import_closure(["keyformer.run.nope"], package)
    (package / "run" / "metrics.py").unlink()  # imported by the generate task
    with pytest.raises(CodeIdentityError, match="keyformer.run.metrics"):
        _hash(package)
    with pytest.raises(CodeIdentityError, match="no_such_dir"):
        code_files(LM_EVAL, ("no_such_dir",), PACKAGE)
