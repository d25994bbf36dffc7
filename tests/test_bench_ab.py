"""The A/B tool (``keyformer-bench --against REV``): its statistics on synthetic data with known answers, and
one tiny end-to-end run against HEAD (slow)."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from keyformer.lab.bench.ab import compare, parse_args, side_order, sign_ci_rank, summarize

ROOT = Path(__file__).resolve().parents[1]


def test_sign_interval_ranks_match_hand_computed_binomial_tails():
    # n=6: P(X <= 0) = 1/64, so [x_(1), x_(6)] covers with 1 - 2/64
    assert sign_ci_rank(6, 0.95) == (1, pytest.approx(1 - 2 / 64))
    # n=5: the widest interval covers 1 - 2/32 = 0.9375 < 0.95; at 0.90 it is enough
    assert sign_ci_rank(5, 0.95) is None
    assert sign_ci_rank(5, 0.90) == (1, pytest.approx(1 - 2 / 32))
    # n=10: r=2 covers 1 - 2*(1+10)/1024 = 0.9785; r=3 only 1 - 2*(1+10+45)/1024 = 0.8906
    assert sign_ci_rank(10, 0.95) == (2, pytest.approx(1 - 22 / 1024))
    with pytest.raises(ValueError, match="confidence"):
        sign_ci_rank(10, 1.0)


def test_known_shift_is_resolved_with_the_right_sign_and_size():
    rng = random.Random(0)
    a = [math.exp(rng.gauss(0, 0.2)) for _ in range(8)]  # a noisy machine: 20% spread between rounds
    b = [x * 1.25 * math.exp(rng.gauss(0, 0.01)) for x in a]  # B is 25% slower, paired noise 1%
    c = compare(a, b)
    assert c.verdict == "B slower"
    assert c.ratio == pytest.approx(1.25, rel=0.02)
    assert c.ci_low <= 1.25 <= c.ci_high and c.ci_low > 1.0
    r = compare(b, a)  # the same data the other way round
    assert r.verdict == "B faster" and r.ratio == pytest.approx(1 / 1.25, rel=0.02)


def test_identical_distributions_are_unresolved_at_the_nominal_rate():
    # under no difference, "resolved" must happen with probability 1 - coverage = 2/256 at n = 8
    rng = random.Random(1)
    trials, hits = 4000, 0
    for _ in range(trials):
        a = [math.exp(rng.gauss(0, 0.3)) for _ in range(8)]
        b = [math.exp(rng.gauss(0, 0.3)) for _ in range(8)]
        hits += compare(a, b).verdict != "unresolved"
    expected = 2 / 256
    sd = math.sqrt(expected * (1 - expected) / trials)
    assert abs(hits / trials - expected) < 4 * sd


def test_interval_covers_a_true_shift_at_least_at_its_coverage():
    rng = random.Random(2)
    trials, covered = 2000, 0
    for _ in range(trials):
        a = [math.exp(rng.gauss(0, 0.3)) for _ in range(10)]
        b = [x * 0.9 * math.exp(rng.gauss(0, 0.2)) for x in a]
        c = compare(a, b)
        covered += c.ci_low <= 0.9 <= c.ci_high
    cov = 1 - 22 / 1024
    assert covered / trials > cov - 4 * math.sqrt(cov * (1 - cov) / trials)


def test_too_few_rounds_and_bad_inputs():
    assert compare([1.0, 1.1], [2.0, 2.2]).verdict == "too few rounds"
    with pytest.raises(ValueError, match="same positive number"):
        compare([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="> 0"):
        compare([1.0, 0.0], [1.0, 1.0])


def test_sides_alternate_and_rows_pair_rounds():
    assert [side_order(r) for r in range(4)] == [("A", "B"), ("B", "A"), ("A", "B"), ("B", "A")]
    mk = [{"metrics": {"full": {"prefill_s": 1.0 + i, "decode_ms": 10.0, "prefill_vs_full": 1.0},
                       "h2o": {"prefill_s": 2.0, "decode_ms": 5.0, "prefill_vs_full": 2.0 / (1.0 + i)}}}
          for i in range(6)]
    rows = summarize({"A": mk, "B": mk}, 0.95)
    assert {(r["config"], r["metric"]) for r in rows} == {("full", "prefill_s"), ("full", "decode_ms"),
                                                          ("h2o", "prefill_s"), ("h2o", "decode_ms"),
                                                          ("h2o", "prefill_vs_full")}
    assert all(r["ratio"] == 1.0 and r["verdict"] == "unresolved" for r in rows)


def _runs(values: dict[str, list[float]]) -> list[dict]:
    """Runs of one side: ``values[config]`` is that configuration's decode_ms per round."""
    n = len(next(iter(values.values())))
    return [{"metrics": {c: {"decode_ms": v[i]} for c, v in values.items()}} for i in range(n)]


def test_family_wise_intervals_are_simultaneous_over_the_tested_metrics():
    # 12 configurations, 10 rounds. "all": B slower in all 10 rounds; "nine": in 9 of 10 (one round faster);
    # "same": identical on both sides (not a test); the other 9 alternate.
    a = {c: [10.0] * 10 for c in ["all", "nine", "same", *(f"x{i}" for i in range(9))]}
    b = {"all": [11.0 + 0.1 * i for i in range(10)], "nine": [9.0] + [11.0 + 0.1 * i for i in range(9)],
         "same": [10.0] * 10, **{f"x{i}": [11.0 if j % 2 else 9.0 for j in range(10)] for i in range(9)}}
    rows = {r["config"]: r for r in summarize({"A": _runs(a), "B": _runs(b)}, 0.95)}
    assert {r["family_size"] for r in rows.values()} == {11}  # "same" is not counted
    assert all(r["family_confidence"] == pytest.approx(1 - 0.05 / 11) for r in rows.values())
    # per metric at 95 %, n = 10 uses [d_(2), d_(9)] (coverage 1 - 22/1024): both resolve
    assert rows["all"]["verdict"] == rows["nine"]["verdict"] == "B slower"
    # family-wise, each interval needs coverage 1 - 0.05/11 > 1 - 22/1024, so [d_(1), d_(10)] (1 - 2/1024)
    assert rows["all"]["family_coverage"] == pytest.approx(1 - 2 / 1024)
    assert rows["all"]["family_verdict"] == "B slower"
    assert (rows["all"]["family_ci_low"], rows["all"]["family_ci_high"]) == pytest.approx((1.1, 1.19))
    assert rows["nine"]["family_verdict"] == "unresolved"
    assert rows["nine"]["family_ci_low"] == pytest.approx(0.9)
    assert rows["same"]["family_verdict"] == "not a test"
    assert all(rows[f"x{i}"]["family_verdict"] == "unresolved" for i in range(9))


def test_family_wise_error_rate_is_at_most_its_level():
    # 12 metrics, no difference anywhere: the chance that any is resolved family-wise is at most 5 %
    # (here 12 x 2/1024, about 2.3 %), while per-metric verdicts resolve one in about 21 % of runs
    rng = random.Random(3)
    trials, family_hits, metric_hits = 1000, 0, 0
    for _ in range(trials):
        a = {f"c{i}": [math.exp(rng.gauss(0, 0.3)) for _ in range(10)] for i in range(12)}
        b = {f"c{i}": [math.exp(rng.gauss(0, 0.3)) for _ in range(10)] for i in range(12)}
        rows = summarize({"A": _runs(a), "B": _runs(b)}, 0.95)
        family_hits += any(r["family_verdict"] != "unresolved" for r in rows)
        metric_hits += any(r["verdict"] != "unresolved" for r in rows)
    expected = 1 - (1 - 2 / 1024) ** 12
    assert abs(family_hits / trials - expected) < 4 * math.sqrt(expected * (1 - expected) / trials)
    per_metric = 1 - (1 - 22 / 1024) ** 12
    assert abs(metric_hits / trials - per_metric) < 4 * math.sqrt(per_metric * (1 - per_metric) / trials)


@pytest.mark.parametrize("bad", [["--rounds", "0"], ["--budget", "1.5"], ["--confidence", "1"],
                                 ["--rows", "6", "--batch", "4"], ["--rows", "2", "--batch", "4"],
                                 ["--decode-rounds", "0"]])
def test_bad_options_are_refused(bad):
    with pytest.raises(SystemExit, match=bad[0]):
        parse_args(["--against", "HEAD", *bad])


def test_worker_widens_the_decode_batch(capsys, monkeypatch):
    """``rows``: the decode runs at that many rows, each prompt row repeated (the cache's rows are copies,
    so the first decode steps of the copies agree), and ``decode_rounds`` decodes are timed."""
    from keyformer.lab.bench import ab_worker, cpu

    widths = []
    real_decode = cpu.decode

    def spy(model, snap, n):
        widths.append((snap.first_token.shape[0], snap.cache.layers[0].keys.shape[0]))
        return real_decode(model, snap, n)

    monkeypatch.setattr(cpu, "decode", spy)
    spec = {"tree": str(ROOT), "model": "tiny", "dtype": "float32", "prompt": "random", "prompt_len": 24,
            "batch": 2, "budget": 0.5, "new_tokens": 2, "policies": ["window", "h2o"], "warmup_len": 8,
            "threads": 1, "seed": 0, "rows": 6, "decode_rounds": 3}
    ab_worker.main([json.dumps(spec)])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out["metrics"]) == {"full", "window", "h2o"}
    timed = widths[-4 * 3:]  # full, window, h2o, full: 3 timed decodes each (the warm-up's come first)
    assert timed == [(6, 6)] * 12


@pytest.mark.slow
def test_tiny_ab_against_head_end_to_end(tmp_path):
    out = tmp_path / "ab"
    p = subprocess.run([sys.executable, "-m", "keyformer.lab.bench.ab", "--against", "HEAD", "--rounds", "1",
                        "--model", "tiny", "--prompt", "random", "--prompt-len", "24", "--batch", "1",
                        "--new-tokens", "2", "--warmup-len", "8", "--policies", "window,h2o",
                        "--tmp", str(tmp_path / "trees"), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rep = json.loads((out / "ab.json").read_text())
    assert len(rep["runs"]["A"]) == len(rep["runs"]["B"]) == 1
    assert {r["verdict"] for r in rep["rows"]} == {"too few rounds"}
    assert not (tmp_path / "trees" / f"keyformer-{rep['A'][:12]}").exists()  # the worktree was removed


def test_worker_rotates_the_policy_order(capsys, monkeypatch):
    """``rotate``: round r times the policies from the (r mod m)-th on, between the two full runs."""
    from keyformer.lab.bench import ab_worker, cpu

    seen = []
    real_prefill = cpu.prefill

    def spy(model, ids, c, n_new, seed):
        seen.append(c.policy)
        return real_prefill(model, ids, c, n_new, seed)

    monkeypatch.setattr(cpu, "prefill", spy)
    spec = {"tree": str(ROOT), "model": "tiny", "dtype": "float32", "prompt": "random", "prompt_len": 16,
            "batch": 1, "budget": 0.5, "new_tokens": 1, "policies": ["window", "h2o", "keyformer"],
            "warmup_len": 8, "threads": 1, "seed": 0, "rotate": True}
    for rnd, want in ((0, ["window", "h2o", "keyformer"]), (1, ["h2o", "keyformer", "window"]),
                      (5, ["keyformer", "window", "h2o"])):
        seen.clear()
        ab_worker.main([json.dumps({**spec, "round": rnd})])
        capsys.readouterr()
        assert seen[-5:] == ["full", *want, "full"]  # the timed runs, after the warm-up's


def test_an_earlier_ab_is_not_overwritten(tmp_path):
    out = tmp_path / "ab"
    parse_args(["--against", "HEAD", "--out", str(out)])  # an empty or missing folder is fine
    out.mkdir()
    (out / "ab.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"holds an earlier A/B \(ab.json\); valid: .*--overwrite"):
        parse_args(["--against", "HEAD", "--out", str(out)])
    assert parse_args(["--against", "HEAD", "--out", str(out), "--overwrite"]).overwrite
