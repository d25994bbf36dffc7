"""The policy is carried once: the scaffold builds it, the task runs it, metrics.json records it
(``policy_spec``: its name and every parameter), and keyformer-collect reads that record; a run recorded
before ``policy_spec`` collects exactly as it always did (points.csv stays the same)."""

from __future__ import annotations

import dataclasses

import pytest

from keyformer.core.policies import POLICIES, build_policy
from keyformer.lab.collect import point_config
from keyformer.run.paths import CONF_DIR, compose
from keyformer.run.scaffold import Job, policy_fields, uses_recent

# what each policy's kept tokens are made of: a recent share of the budget (H2O family) or not
RECENT_SHARE = {"h2o", "keyformer", "tova", "adakv_keyformer"}
NO_RECENT_SHARE = {"full", "window", "streaming", "snapkv", "pyramidkv", "adakv_snapkv"}


def _cfg(name: str) -> dict:
    return compose([f"policy={name}", "budget=0.4", "recent=0.25", "model=tiny_llama"])


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_metrics_record_the_policy_itself(name):
    if not (CONF_DIR / "policy" / f"{name}.yaml").is_file():
        pytest.fail(f"policy {name!r} has no conf/policy/{name}.yaml")
    cfg = _cfg(name)
    policy = build_policy(cfg["policy"])
    rec = policy_fields(policy)
    assert rec["policy_spec"] == {"name": name, **dataclasses.asdict(policy)}
    assert rec["policy"] == name and rec["budget"] == policy.budget
    if name in RECENT_SHARE:
        assert uses_recent(type(policy)) and rec["recent"] == policy.recent
    if name in NO_RECENT_SHARE:  # SnapKV recorded recent 0.3 (the global knob) before, yet keeps its window
        assert not uses_recent(type(policy)) and rec["recent"] is None
    if name == "full":
        assert rec["budget"] == 1.0


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_collect_reads_the_record_and_points_stay_the_same(name):
    """points.csv's policy columns from metrics.json's record equal those of the config-node path every
    committed points.csv was collected with (no column changes meaning, none appears or disappears)."""
    cfg = _cfg(name)
    metrics = policy_fields(build_policy(cfg["policy"]))
    assert point_config(cfg, metrics) == point_config(cfg)


def test_collect_prefers_the_record():
    """The record wins over the config node: the policy that ran is what the point is."""
    cfg = _cfg("snapkv")
    metrics = policy_fields(build_policy({**cfg["policy"], "window_size": 32}))
    row = point_config(cfg, metrics)
    assert row["policy.window_size"] == 32 and row["recent"] is None and row["budget"] == 0.4
    on = policy_fields(build_policy({**cfg["policy"], "prefill_only": True}))
    assert point_config(cfg, on)["policy.prefill_only"] is True
    assert "policy.prefill_only" not in point_config(cfg, metrics)  # shown only when on, as before


def test_job_builds_the_policy_once(tmp_path):
    cfg = {**_cfg("h2o"), "output_dir": str(tmp_path / "run")}
    job = Job(cfg, None, {})  # type: ignore[arg-type]
    assert job.policy is job.policy and job.policy.budget == 0.4 and job.policy.recent == 0.25
    given = build_policy(cfg["policy"])
    assert Job(cfg, None, {}, policy=given).policy is given  # type: ignore[arg-type]
