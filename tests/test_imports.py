"""Light, acyclic imports: the package and its non-model modules load without torch; no import cycles."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "keyformer"
LIGHT = ["keyformer", "keyformer.run.metrics", "keyformer.run.data", "keyformer.run.results",
         "keyformer.run.validate",
         "keyformer.run.loading", "keyformer.lab.analysis", "keyformer.lab.bench", "keyformer.run.paths"]


def test_light_modules_do_not_load_torch() -> None:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in LIGHT)
            + "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
            + "assert not heavy, heavy\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_lazy_exports() -> None:
    import keyformer
    from keyformer import generate, make_policy

    assert (callable(generate) and keyformer.generate is generate
            and generate.__module__ == "keyformer.core.generate")
    assert make_policy is keyformer.core.policies.make_policy
    assert set(keyformer.__all__) == set(keyformer._EXPORTS) and set(keyformer.__all__) <= set(dir(keyformer))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """keyformer module -> the keyformer modules it imports (at module level or inside functions)."""
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for t in targets:
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert graph["keyformer.run.validate"] and "keyformer.lab.bench.cpu" in graph
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append([*stack[stack.index(n):], n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


WINGS = ("core", "run", "lab")  # lab -> run -> core: a wing imports only from the wings after it


def test_wings_import_downhill_only() -> None:
    graph = import_graph()
    top = {m for m in graph if m.count(".") == 1 and not m.endswith("__init__")}
    assert top <= {f"keyformer.{w}" for w in WINGS}, f"modules outside the three wings: {sorted(top)}"
    bad = []
    for mod, deps in graph.items():
        if mod == "keyformer":
            continue
        wing = WINGS.index(mod.split(".")[1])
        for d in deps:
            if d != "keyformer" and WINGS.index(d.split(".")[1]) > wing:
                bad.append(f"{mod} -> {d}")
    assert not bad, "imports running uphill (core < run < lab): " + "; ".join(sorted(bad))


def test_no_sys_path_edits() -> None:
    """Modules import each other as modules: no sys.path edits, no scripts loaded by path with runpy."""
    hits = [str(p.relative_to(ROOT)) for d in ("keyformer", "scripts", "experiments", "tests")
            for p in (ROOT / d).rglob("*.py")
            if ("sys.path" in p.read_text() or "runpy" in p.read_text()) and p.name != "test_imports.py"]
    assert not hits, f"sys.path edited or runpy used in {hits}"


def test_the_library_names_no_study_and_its_tests_import_none() -> None:
    """Studies declare themselves (experiments/registry.py); the library never names one (a study's name,
    its folder or its module path), and the library's tests never import one (a study's tests live in its
    folder). ``fewshot.csv``/``fewshot.json`` are the lm-eval collector's file names, not the study."""
    import re

    names = [p.parent.name for p in (ROOT / "experiments").glob("*/findings.py")]
    assert names, "no study found"
    word = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, names)) + r")(?![\w]|\.csv|\.json)")
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "keyformer").rglob("*.py")
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if word.search(line)]
    assert not hits, f"the library names a study at {hits}"
    imports = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
               if re.search(r"^\s*(from|import) experiments\b", p.read_text(encoding="utf-8"), re.M)]
    assert not imports, f"library tests import a study: {imports}"
