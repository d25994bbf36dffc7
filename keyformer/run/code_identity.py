"""The code part of a run's identity: a hash of every project module a task imports.

A resumed run reuses finished rows only when this hash is unchanged, so it must cover all the code that can
change an output: the task's module and, transitively, every ``keyformer`` module it imports. The closure is
read from the source (``import``/``from`` statements at any depth, relative ones included, the ``__init__`` of
each parent package, module names written as strings such as ``"keyformer.run.tasks.generate:GenerateTask"``,
and every submodule of a package that imports its submodules by iterating ``__path__``), never listed by
hand. A module or data path that does not exist is an error, not a silent skip.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from keyformer.run.paths import PACKAGE

TOP = "keyformer"
_MODULE_STRING = re.compile(rf"^{TOP}(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?$")


class CodeIdentityError(RuntimeError):
    """A module or path the identity must hash does not exist."""


def module_file(name: str, root: Path = PACKAGE) -> Path | None:
    """The source file of module ``name`` (``keyformer.x.y``) under the package folder ``root``, or None."""
    parts = name.split(".")
    if parts[0] != TOP:
        return None
    rel = root.joinpath(*parts[1:])
    for f in (rel / "__init__.py", rel.with_suffix(".py") if len(parts) > 1 else None):
        if f is not None and f.is_file():
            return f
    return None


def _imports(tree: ast.AST, module: str, is_package: bool) -> tuple[list[str], list[str]]:
    """``(required, optional)`` module names a module's source names: an ``import`` or ``from X`` must
    exist; ``from X import y`` may name a submodule ``X.y`` or an attribute of ``X``."""
    package = module if is_package else module.rsplit(".", 1)[0]
    required, optional = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            required += [a.name for a in node.names if a.name.split(".")[0] == TOP]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                src = f"{base}.{node.module}" if node.module else base
            else:
                src = node.module or ""
            if src.split(".")[0] != TOP:
                continue
            required.append(src)
            optional += [f"{src}.{a.name}" for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and _MODULE_STRING.match(node.value):
            required.append(node.value.split(":")[0])
    return required, optional


def import_closure(modules: Iterable[str], root: Path = PACKAGE) -> dict[str, Path]:
    """Every project module reachable from ``modules`` by import, with its file (sorted by name)."""
    seen: dict[str, Path] = {}
    todo = [(m, True) for m in modules]
    while todo:
        mod, required = todo.pop()
        if mod in seen:
            continue
        f = module_file(mod, root)
        if f is None:
            if required:
                raise CodeIdentityError(f"code identity: module {mod!r} not found under {root}")
            continue  # ``from pkg import name``: an attribute, not a submodule
        seen[mod] = f
        parts = mod.split(".")
        todo += [(".".join(parts[:i]), True) for i in range(1, len(parts))]  # parent packages run first
        is_package = f.name == "__init__.py"
        text = f.read_text(encoding="utf-8")
        req, opt = _imports(ast.parse(text, filename=str(f)), mod, is_package)
        todo += [(m, True) for m in req] + [(m, False) for m in opt]
        if is_package and "iter_modules(__path__)" in text:  # imports every submodule it holds
            todo += [(f"{mod}.{p.stem}", True) for p in f.parent.glob("*.py") if p.name != "__init__.py"]
    return dict(sorted(seen.items()))


def code_files(modules: Sequence[str], data: Sequence[str] = (), root: Path = PACKAGE) -> list[Path]:
    """The files a task's identity hashes: the import closure of ``modules`` plus the non-Python ``data``
    paths (files or folders, relative to ``root``) the task reads."""
    files = list(import_closure(modules, root).values())
    for rel in data:
        p = root / rel
        if not p.exists():
            raise CodeIdentityError(f"code identity: data path {rel!r} not found under {root}")
        files += sorted(f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts) \
            if p.is_dir() else [p]
    return files


@functools.cache
def code_hash(modules: tuple[str, ...], data: tuple[str, ...] = (), root: Path = PACKAGE) -> str:
    """12 hex digits of a SHA-256 over each file's path (relative to ``root``) and bytes. Taken once per
    process: a sweep's later jobs run the code imported by its first, whatever is on disk by then."""
    h = hashlib.sha256()
    for f in code_files(modules, data, root):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


# -- inputs from outside the project: an outside policy's module, dataset files ---------------------------
_MODULE_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def locate_module(name: str) -> Path | None:
    """The source file of module ``name`` found on the Python path without importing it or its packages (None
    when absent or not a Python source file)."""
    from importlib.machinery import PathFinder

    search: list[str] | None = None
    spec = None
    for part in name.split("."):
        spec = PathFinder.find_spec(part, search)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or []) or None
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") else None


def defines(source: Path, name: str) -> bool:
    """Whether the module source binds ``name`` at top level (a class, a function, an assignment or an
    import); a module that builds its names dynamically (``__getattr__``, ``globals()``) counts as binding
    it."""
    tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.name in (
                name, "__getattr__"):
            return True
        if isinstance(node, ast.Import | ast.ImportFrom) and any(
                (a.asname or a.name.split(".")[0]) == name or a.name == "*" for a in node.names):
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id in (name, "__all__") for t in targets):
            return True
        if "globals()" in ast.unparse(node):
            return True
    return False


def check_outside_target(target: str) -> str | None:
    """Why ``policy._target_`` cannot name an outside policy class, found without importing anything: not a
    ``module.Class`` path, a module not on the Python path, a module that defines no such name; None when it
    may (the import then checks it is a ``Policy`` subclass). Names without a dot and ``keyformer.*`` paths
    are the core's to check."""
    if "." not in target or target.split(".")[0] == TOP:
        return None
    if not _MODULE_PATH.match(target):
        return "not a module.Class path of Python identifiers"
    module, _, cls = target.rpartition(".")
    source = locate_module(module)
    if source is None:
        from importlib.machinery import PathFinder

        if PathFinder.find_spec(module.split(".")[0]) is None and module.split(".")[0] not in sys_modules():
            top = module.split(".")[0]
            return (f"cannot be imported (ModuleNotFoundError: no module {top!r} on the Python path; is its "
                    "folder on PYTHONPATH?)")
        return None  # a compiled or namespace module: the import decides
    try:
        if not defines(source, cls):
            return f"module {module!r} has no {cls!r} (read from {source}, not imported)"
    except (OSError, SyntaxError, UnicodeDecodeError) as e:
        return f"module {module!r} ({source}) cannot be read: {type(e).__name__}"
    return None


def sys_modules() -> set[str]:
    import sys

    return set(sys.modules) | set(sys.builtin_module_names)


def outside_files(target: str) -> list[Path]:
    """The files of an outside policy's module: every ``.py`` of its top-level package (the module's helpers
    included), or the module's single file; empty for ``keyformer.*`` classes and names without a dot."""
    if "." not in target or target.split(".")[0] == TOP:
        return []
    module = target.rpartition(".")[0]
    top = locate_module(module.split(".")[0])
    if top is not None and top.name == "__init__.py":
        return sorted(f for f in top.parent.rglob("*.py") if "__pycache__" not in f.parts)
    source = locate_module(module)
    return [source] if source is not None else []


def outside_code(target: str) -> str | None:
    """``<module>@<12 hex>``: a hash of :func:`outside_files` (paths relative to their root, and bytes), read
    now (an edit between two calls changes it); None for built-in policies."""
    files = outside_files(target)
    if not files:
        return None
    root = files[0].parent if len(files) == 1 else Path(os.path.commonpath([f.parent for f in files]))
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return f"{target.rpartition('.')[0]}@{h.hexdigest()[:12]}"


_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_digest(path: str | os.PathLike) -> str:
    """16 hex digits of the SHA-256 of a file's bytes (memoised per path, size and mtime in this process)."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _DIGESTS[key] = h.hexdigest()[:16]
    return _DIGESTS[key]
