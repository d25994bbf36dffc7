"""The captured full baseline (:mod:`experiments.gpu_studies.static_full`): full attention over transformers'
``StaticCache``, the GPU comparison that separates eviction's gain from the capture's.

On CPU: its greedy tokens equal our full policy's (an independent path: transformers' own sdpa attention and
cache, against our attention function and evicting cache), it holds the same K/V bytes, it restores the
model's attention, and the CLI and ``gpu_long``'s baseline row run (eager, with the reason). On a GPU
(``KEYFORMER_TEST_DEVICE=cuda pytest -m on_device``): the captured steps give the eager steps' tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from experiments.gpu_studies.gpu_long import timed_run
from experiments.gpu_studies.static_full import main, static_decode
from keyformer.lab.bench.gpu import build_model

RES = Path(__file__).resolve().parents[2] / "results"


def _model(arch: str, device: torch.device, dtype: torch.dtype = torch.float32):
    return build_model(arch, True, 96, device, dtype)


def _ids(b: int, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.randint(10, 500, (b, n), generator=torch.Generator().manual_seed(b * 100 + n)).to(device)


@pytest.mark.parametrize("arch", ["gptj", "llama3"])
def test_static_full_equals_our_full(arch):
    model = _model(arch, torch.device("cpu"))
    before = model.config._attn_implementation
    ids = _ids(3, 40)
    r = static_decode(model, ids, 12)
    ours = timed_run(model, ids, "full", None, 12, capture=False)
    assert model.config._attn_implementation == before  # our attention is back
    assert r["tokens"].shape == (3, 12) and torch.equal(r["tokens"], ours["tokens"])
    assert r["kv_tensor_bytes"] == ours["kv_tensor_bytes_end"]  # prompt + new slots: the same K/V budget
    assert r["captured_steps"] == 0 and r["eager_steps"] == 11 and "CUDA" in r["reason"]
    assert static_decode(model, ids, 12, capture=False)["reason"] == "capture off"


def test_static_full_is_not_a_copy_of_the_policy_path():
    """A planted change to the weights between the two runs shows: the comparison reads both paths."""
    model = _model("llama3", torch.device("cpu"))
    ids = _ids(2, 40)
    ref = timed_run(model, ids, "full", None, 10, capture=False)["tokens"]
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)
    assert not torch.equal(static_decode(model, ids, 10)["tokens"], ref)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A GPU run folder with the committed run's latency cells, and this module's two outputs from tiny CPU
    runs (static/, fixed/)."""
    import shutil

    from experiments.gpu_studies import gpu_long

    src = RES / "bench" / "gpu" / "2026-12-04"
    res = tmp_path_factory.mktemp("res")
    d = res / "bench" / "gpu" / "2099-01-01"
    (d / "latency").mkdir(parents=True)
    for f in ("log.txt", "latency/gpu_bench.json"):
        shutil.copy(src / f, d / f)
    main(["--tiny", "--models", "gptj", "llama3", "--lengths", "16", "--gen-cap", "6", "--rounds", "2",
          "--policies", "keyformer", "h2o", "--out", str(d / "static")])
    gpu_long.main(["--tiny", "--settings", "24+8", "--budgets", "8", "--policies", "window",
                   "--full-batch", "2", "--max-batch", "4", "--out", str(d / "fixed")])
    return res, d


@pytest.mark.slow
def test_cli_tiny(tiny_run):
    _, d = tiny_run
    rep = json.loads((d / "static" / "static_full.json").read_text())
    assert [c["model"] for c in rep["cells"]] == ["gptj", "llama3"]
    for c in rep["cells"]:
        runs = c["runs"]
        assert list(runs) == ["static_full_eager", "static_full_captured", "full", "keyformer", "h2o"]
        assert runs["static_full_captured"]["speed_vs_captured_full"] == 1.0
        assert all(r["ms_per_step"]["n"] == 2 and r["ms_per_step"]["median"] > 0 for r in runs.values())
        assert runs["static_full_eager"]["same_tokens_as_full"]
        assert "CUDA" in runs["static_full_captured"]["reason"]
        k = runs["keyformer"]
        assert k["speed_vs_captured_full"] == pytest.approx(
            runs["static_full_captured"]["ms_per_step"]["median"] / k["ms_per_step"]["median"])
    text = (d / "static" / "static_full.txt").read_text()
    assert "gptj 16+6 batch 1" in text and "of captured full" in text


@pytest.mark.slow
def test_gpu_long_has_the_baseline_row(tiny_run):
    _, d = tiny_run
    sec = json.loads((d / "fixed" / "gpu_long.json").read_text())["settings"][0]
    st = sec["static_full"]
    assert st["batch"] == 2 and st["agreement"]["match"] == 1.0 and st["mode"] == "eager"
    assert st["kv_tensor_bytes"] <= sec["memory_budget_bytes"]
    for row in sec["rows"]:
        assert row["gain_vs_captured_full"] == pytest.approx(
            row["decode_tok_s"]["median"] / st["decode_tok_s"]["median"])
    assert "the captured baseline" in (d / "fixed" / "gpu_long.txt").read_text()


@pytest.mark.slow
def test_report_reads_the_baseline(tiny_run):
    """keyformer-report's GPU section: the captured-full table, its target judged against the baseline, and
    the fixed-memory column, from the run's files; the committed run (without them) says so."""
    from keyformer.lab import report

    res, d = tiny_run
    table = report.render("bench_gpu", res)
    rep = json.loads((d / "static" / "static_full.json").read_text())
    for c in rep["cells"]:
        k = c["runs"]["keyformer"]
        verdict = "met" if k["speed_vs_captured_full"] >= 1.0 else "not met"
        head = f"| {c['model']} | 16+6 | keyformer@0.5 |"
        row = next(ln for ln in table.splitlines() if ln.startswith(head))
        assert f"| {k['speed_vs_captured_full']:.2f}x |" in row and row.endswith(f"| {verdict} |")
    sec = json.loads((d / "fixed" / "gpu_long.json").read_text())["settings"][0]
    assert "| fixed | 24+8 | full, static cache | eager | 2 |" in table
    win = next(r for r in sec["rows"] if r["policy"] == "window")
    assert f"| {win['gain_vs_captured_full']:.2f}x |" in table
    assert "No captured full baseline" not in table
    assert "No captured full baseline in this run" in report.render("bench_gpu", RES)


@pytest.mark.parametrize("arch", ["gptj", "llama3"])
def test_captured_static_full_equals_eager(device, arch):
    """On a GPU: the replayed full step gives the eager steps' tokens (CPU: skipped)."""
    if device.type != "cuda":
        pytest.skip("CUDA graphs need a CUDA device (KEYFORMER_TEST_DEVICE=cuda)")
    model = _model(arch, device, torch.bfloat16)
    ids = _ids(2, 48, device)
    eager = static_decode(model, ids, 16, capture=False)
    cap = static_decode(model, ids, 16, capture=True)
    assert cap["reason"] is None and cap["captured_steps"] == 14 and cap["eager_steps"] == 1
    assert torch.equal(cap["tokens"], eager["tokens"])
