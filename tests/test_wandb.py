"""W&B as a view of the same data: the group rule, the per-step history, the findings table, and
``keyformer-collect --wandb`` reading a group back from W&B's offline files (WANDB_MODE=offline, no
network)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from keyformer.run.paths import CONF_DIR
from keyformer.run.wandb_log import group_name, step_history

pytestmark = pytest.mark.usefixtures("one_thread")


# -- the group --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("cfg", "out", "experiment", "group"), [
    ({"logger": {"group": "mine"}, "name": "n"}, "multirun/x/0_a", "exp", "mine"),  # logger.group first
    ({"name": "budget_study"}, "multirun/2026-12-06/13-02-10/0_a", "exp1", "budget_study"),  # then name=
    ({"name": None}, "multirun/2026-12-06/13-02-10/0_a", "exp1_cnndm", "exp1_cnndm"),  # the experiment
    ({}, "multirun/my_sweep/0_policy=h2o", None, "my_sweep"),  # a sweep folder of your own
    ({"dataset": {"name": "sample"}}, "multirun/2026-12-06/13-02-10/0_a", None, "sample-2026-12-06_13-02-10"),
    ({"dataset": {"name": "sample"}}, "outputs/2026-12-06/13-02-10", None, "sample-2026-12-06_13-02-10"),
])
def test_group_is_the_sweeps_name_never_a_bare_time(cfg, out, experiment, group, tmp_path):
    assert group_name(cfg, tmp_path / out, experiment) == group


def test_jobs_of_one_default_sweep_share_a_group_and_two_sweeps_do_not(tmp_path):
    cfg = {"dataset": {"name": "sample"}}
    a = {group_name(cfg, tmp_path / f"multirun/2026-12-06/13-02-10/{j}", None) for j in ("0_x", "1_y")}
    b = group_name(cfg, tmp_path / "multirun/2026-12-07/13-02-10/0_x", None)
    assert len(a) == 1 and b not in a


# -- the per-step history -----------------------------------------------------------------------------------
def test_step_history_averages_the_calls_that_reached_each_step():
    steps = [{"rows": 2, "step_s": [0.010, 0.030], "kv_bytes": [100.0, 110.0, 120.0]},
             {"rows": 1, "step_s": [0.020], "kv_bytes": [400.0, 410.0]}]
    h = step_history(steps)
    assert [r["decode_step"] for r in h] == [0, 1, 2]
    assert "step/decode_ms" not in h[0] and h[0]["step/kv_bytes"] == pytest.approx((2 * 100 + 400) / 3)
    assert h[1]["step/decode_ms"] == pytest.approx(15.0)  # mean of 10 and 20 ms
    assert h[1]["step/tokens_per_s"] == pytest.approx(3 / 0.030)  # 3 samples' tokens in 30 ms of steps
    assert h[1]["step/kv_bytes"] == pytest.approx((2 * 110 + 410) / 3) and h[1]["step/samples"] == 3
    assert h[2] == {"decode_step": 2, "step/kv_bytes": 120.0, "step/decode_ms": pytest.approx(30.0),
                    "step/tokens_per_s": pytest.approx(2 / 0.030), "step/samples": 2}


@pytest.mark.parametrize("policy", ["full", "window"])
def test_generate_records_kv_bytes_after_every_forward(policy):
    """A full cache grows by one token's K/V bytes per decode step; a window holds its budget."""
    from keyformer import generate, make_policy, tiny_model

    model = tiny_model("llama", seed=0)
    ids = torch.randint(3, 256, (2, 20), generator=torch.Generator().manual_seed(0))
    pol = make_policy(policy, budget=0.5)
    out = generate(model, ids, None, pol, max_new_tokens=6, min_new_tokens=6, step_trace=True)
    c = model.config
    per_token = c.num_hidden_layers * c.num_key_value_heads * 2 * (c.hidden_size // c.num_attention_heads) * 4
    held = 20 if policy == "full" else 10
    grow = 1 if policy == "full" else 0
    assert out.step_kv_bytes == [per_token * (held + grow * t) for t in range(6)]
    assert len(out.step_s) == out.n_decode_steps == 5 and all(s > 0 for s in out.step_s)
    assert sum(out.step_s) <= out.decode_s
    plain = generate(model, ids, None, pol, max_new_tokens=6, min_new_tokens=6)
    assert plain.step_kv_bytes is None and torch.equal(plain.sequences, out.sequences)


# -- a sweep logged offline, read back ---------------------------------------------------------------------
def _cfg(out, *overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        c = compose("config", overrides=[f"output_dir={out}", "model=tiny_llama", "progress=false",
                                         "dataset.n_paragraphs=2", "n_samples=2", "batch_size=2",
                                         "generation.max_new_tokens=4", "warmup=false", *overrides])
    return OmegaConf.to_container(c, resolve=True)


@pytest.fixture(scope="module")
def logged_sweep(tmp_path_factory):
    pytest.importorskip("wandb")
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    from keyformer.run.tasks.generate import run

    sweep = tmp_path_factory.mktemp("wb") / "multirun" / "2026-12-06" / "13-02-10"
    try:
        for i, pol in enumerate(("full", "window")):
            run(_cfg(sweep / f"{i}_{pol}", f"policy={pol}", "logger=wandb", "name=my_study"))
    finally:
        mp.undo()
    return sweep


def test_offline_runs_carry_the_group_and_per_step_curves(logged_sweep):
    from keyformer.run.wandb_offline import OfflineApi

    runs = OfflineApi(logged_sweep).runs("any/project", filters={"group": "my_study"})
    assert sorted(r.name for r in runs) == ["0_full", "1_window"]
    for r in runs:
        steps = [h for h in r.history if "decode_step" in h]
        assert [h["decode_step"] for h in steps] == list(range(len(steps))) and len(steps) >= 2
        assert all(h["step/decode_ms"] > 0 and h["step/tokens_per_s"] > 0 for h in steps[1:])
        kv = [h["step/kv_bytes"] for h in steps]
        assert (kv[-1] > kv[0]) if r.summary["policy"] == "full" else (kv[-1] == kv[0])
        m = json.loads((logged_sweep / r.name / "metrics.json").read_text())
        assert r.summary["kv_bytes"] == m["kv_bytes"] and r.summary["policy"] == m["policy"]
    assert OfflineApi(logged_sweep).runs("p", filters={"group": "13-02-10"}) == []


def test_collect_reads_the_group_back_as_the_local_folder_gives(logged_sweep, tmp_path):
    from keyformer.lab import collect

    local_points, local_samples = collect.collect(logged_sweep)
    points, samples = collect.collect_wandb(str(logged_sweep), "my_study")
    cols = ["point", "policy", "budget", "n_samples", "complete", "kv_bytes", "rouge2", "accuracy"]
    pd.testing.assert_frame_equal(points[cols], local_points[cols], check_dtype=False)
    scols = ["point", "id", "prompt_tokens", "generated_tokens", "kv_bytes", "rouge2", "prediction"]
    pd.testing.assert_frame_equal(samples[scols].reset_index(drop=True),
                                  local_samples[scols].reset_index(drop=True), check_dtype=False)
    out = tmp_path / "from_wandb"
    assert collect.main(["my_study", str(out), "--wandb", str(logged_sweep)]) == 0
    assert len(pd.read_csv(out / "points.csv")) == 2


def test_no_step_record_without_wandb(tmp_path, monkeypatch):
    """The per-step KV record costs nothing when W&B is off: generate is not asked for it."""
    import keyformer.core.generate as core_generate
    from keyformer.run.tasks.generate import run

    seen = []
    real = core_generate.generate

    def spy(*a, **k):
        seen.append(k.get("step_trace", False))
        return real(*a, **k)

    monkeypatch.setattr(core_generate, "generate", spy)
    run(_cfg(tmp_path / "plain", "policy=window"))
    assert seen and not any(seen)


def test_findings_table_is_logged_into_the_group(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from keyformer.run.wandb_log import log_findings_table
    from keyformer.run.wandb_offline import OfflineApi

    monkeypatch.setenv("WANDB_SILENT", "true")
    doc = {"schema": 1, "study": "my_study", "definition": {"metric": "accuracy"},
           "findings": [{"id": "h2o@0.5-full", "a": "h2o@0.5", "b": "full", "estimate": -12.5, "p_adj": 0.01,
                         "verdict": "worse", "meta": {"budget": 0.5, "policy": "h2o"}}]}
    log_findings_table("my_study", doc, mode="offline", directory=tmp_path)
    (run,) = OfflineApi(tmp_path).runs(filters={"group": "my_study"})
    assert run.name == "findings" and run.config["definition"] == {"metric": "accuracy"}
    with run.file(run.summary["findings"]["path"]).download() as f:
        table = json.load(f)
    rows = [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]
    assert rows == [{"id": "h2o@0.5-full", "a": "h2o@0.5", "b": "full", "estimate": -12.5, "p_adj": 0.01,
                     "verdict": "worse", "meta_budget": 0.5, "meta_policy": "h2o"}]
    with pytest.raises(ValueError, match="no findings"):
        log_findings_table("my_study", {"study": "x", "findings": []}, mode="offline", directory=tmp_path)


def test_a_run_file_counts_as_written_only_with_its_exit_record(tmp_path, monkeypatch):
    """W&B's service closes an offline run's file after ``finish`` returns; ``wait_written`` (which the
    findings table and the job logger call) sees a file cut before its exit record as not yet written."""
    pytest.importorskip("wandb")
    from keyformer.run.wandb_log import log_findings_table
    from keyformer.run.wandb_offline import is_written, records, wait_written

    monkeypatch.setenv("WANDB_SILENT", "true")
    doc = {"study": "s", "findings": [{"id": "x", "a": "h2o@0.5", "b": "full", "estimate": 1.0}]}
    log_findings_table("s", doc, mode="offline", directory=tmp_path)
    (done,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    assert is_written(done)
    data = done.read_bytes()
    cut = tmp_path / "cut.wandb"
    cut.write_bytes(data[:7])  # the header alone: what a reader can find before the service flushes
    assert list(records(cut)) == [] and not is_written(cut)
    assert not is_written(tmp_path / "missing.wandb")
    with pytest.raises(TimeoutError, match="cut.wandb"):
        wait_written(cut, timeout=0.2)


def test_a_renamed_sweep_still_resumes(tmp_path):
    """``name`` is not part of a run's identity: the same point under another name resumes, never refused."""
    from keyformer.run.tasks.generate import run

    out = tmp_path / "point"
    first = run(_cfg(out, "policy=window", "name=a", "stop_after=1"))
    assert not first["complete"]
    assert run(_cfg(out, "policy=window", "name=b"))["complete"]
