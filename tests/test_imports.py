"""Light, acyclic imports: the package and its non-model modules load without torch; no import cycles."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "keyformer"
LIGHT = ["keyformer", "keyformer.metrics", "keyformer.data", "keyformer.results", "keyformer.errors",
         "keyformer.loading", "keyformer.analysis", "keyformer.bench", "keyformer.tools"]


def test_light_modules_do_not_load_torch() -> None:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in LIGHT)
            + "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
            + "assert not heavy, heavy\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_lazy_exports() -> None:
    import keyformer
    import keyformer.generate  # the submodule import must not rebind the package attribute
    from keyformer import generate, make_policy

    assert callable(generate) and keyformer.generate is generate and generate.__module__ == "keyformer.generate"
    assert make_policy is keyformer.policies.make_policy
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
    assert graph["keyformer.errors"] and "keyformer.bench.cpu" in graph
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
