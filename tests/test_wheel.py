"""The installed library is the library: the built wheel holds no study's code (experiments/ stays in the
checkout), and nothing in keyformer/ imports a study."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MOVED = ("gpu_long.py", "gpu_decode.py", "static_full.py", "kvpress_compare.py", "kvpress_crosscheck.py",
         "kvpress_kvzip.py", "compile_probe.py", "findings.py")  # the library's own is lab/findings.py


def test_library_never_imports_a_study() -> None:
    for f in (ROOT / "keyformer").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "experiments" for n in names), f


@pytest.mark.slow
def test_wheel_holds_no_experiment_module(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = tmp_path.glob("keyformer_lab-*.whl")
    files = zipfile.ZipFile(wheel).namelist()
    code = [f for f in files if f.endswith(".py")]
    assert code and not [f for f in code if not f.startswith("keyformer/")]
    assert "keyformer/lab/findings.py" in code and "keyformer/core/cache.py" in code
    leaked = [f for f in code if Path(f).name in MOVED and f != "keyformer/lab/findings.py"]
    assert not leaked, leaked
    assert not any(f.startswith(("experiments/", "scripts/", "tests/", "results/")) for f in files)
