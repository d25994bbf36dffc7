"""``keyformer-bench --long``: batch search, bytes model, measured memory, and a quick end-to-end run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from keyformer import tiny_model
from keyformer.lab.bench import long as lb

ROOT = Path(__file__).resolve().parents[1]


def _naive_largest(bytes_of, limit: int, max_batch: int) -> int:
    """Linear scan: the largest b in [1, max_batch] whose bytes fit (0 if none)."""
    best = 0
    for b in range(1, max_batch + 1):
        if bytes_of(b) <= limit:
            best = b
    return best


@pytest.mark.parametrize("limit", [50, 100, 420, 455, 1000, 10**6])
def test_largest_batch_matches_a_linear_scan(limit):
    bytes_of = lambda b: 100 * b + (60 if b > 3 else 0)  # noqa: E731 - not linear: the first guess overshoots
    b, probes = lb.largest_batch(bytes_of, limit, max_batch=16)
    assert b == _naive_largest(bytes_of, limit, 16)
    measured = dict((x, y) for x, y in probes)
    if 0 < b < 16:
        assert measured[b] <= limit < measured[b + 1]  # both sides of the answer were measured


def test_parse_errors_name_the_bad_value():
    assert lb.parse_settings("512+2048, 2048+2048") == [lb.Setting(512, 2048), lb.Setting(2048, 2048)]
    assert lb.parse_budgets("256,0.5") == [256, 0.5]
    with pytest.raises(ValueError, match="'512x2048'"):
        lb.parse_settings("512x2048")
    with pytest.raises(ValueError, match="'1.5'"):
        lb.parse_budgets("256,1.5")


def test_attended_slots_by_hand():
    # full, L=4, 4 tokens: the 3 decode steps attend 5, 6, 7 slots
    assert lb.attended_avg("full", None, 4, 4) == 6
    # h2o keeping 3 of 4: every step attends the 3 held + the new token
    assert lb.attended_avg("h2o", 3, 4, 4) == 4
    # absolute budget 6 above a 4-token prompt: 5, 6, 7 (grows to 6 held + the new one)
    assert lb.attended_avg("h2o", 6, 4, 4) == 6
    # SnapKV compresses once: 2 held (budget 0.5 of 4), then every generated token is kept: 3, 4, 5
    assert lb.attended_avg("snapkv", 0.5, 4, 4) == 4
    # a hybrid model (sliding, global, sliding; window 2): the sliding layers attend min(L + t, 2) = 2
    # whatever the policy, the global layer as above; the mean over layers
    assert lb.attended_avg("full", None, 4, 4, [2, None, 2]) == pytest.approx((2 + 6 + 2) / 3)
    assert lb.attended_avg("h2o", 3, 4, 4, [2, None, 2]) == pytest.approx((2 + 4 + 2) / 3)
    # a window above the context: slides nowhere, 5, 6, 7 as full
    assert lb.attended_avg("h2o", 3, 4, 4, [100, None]) == pytest.approx((6 + 4) / 2)


def test_long_bench_runs_a_hybrid_model(tmp_path):
    """--quick on the tiny hybrid Gemma 3 (2 sliding layers of window 12, 1 global): the bytes model counts
    the sliding layers at their window, so its predicted gain for H2O is below the all-global formula's."""
    out = tmp_path / "g"
    report = lb.run(lb.parse_args(["--quick", "--model", "tiny_gemma3", "--beams", "0", "--out", str(out)]),
                    log=lambda m: None)
    rows = {(r["policy"], r["budget"]): r for r in report["rows"]}
    h2o = rows[("h2o", 16)]
    assert h2o["attended_slots_avg"] == pytest.approx(lb.attended_avg("h2o", 16, 32, 8, [12, None, 12]))
    assert h2o["attended_slots_avg"] < lb.attended_avg("h2o", 16, 32, 8)
    assert h2o["bytes_model_gain"] > 0 and (out / "long.txt").is_file()


def test_peak_kv_bytes_is_measured_from_the_cache():
    model = tiny_model("llama", seed=0)
    c = model.config
    per_token = c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 2 * 4
    ids = torch.randint(3, 256, (3, 20), generator=torch.Generator().manual_seed(0))
    # full preallocates prompt + generation for every sample
    assert lb.peak_kv_bytes(model, ids, "full", None, 6) == 3 * (20 + 6) * per_token
    # h2o at 10 of 20: the budget plus the spare slot
    assert lb.peak_kv_bytes(model, ids, "h2o", 10, 6) == 3 * 11 * per_token
    # an absolute budget above the prompt grows during the decode: its peak exceeds what the prompt left
    assert lb.peak_kv_bytes(model, ids, "h2o", 24, 8) >= 3 * 25 * per_token


def test_quick_run_writes_only_its_out_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lb.main(["--quick", "--beams", "0", "--memory-ref", "32+8"])  # = the default here (the longest setting)
    out = tmp_path / "outputs" / "bench_long"
    assert sorted(p.name for p in out.iterdir()) == ["command.txt", "journal.jsonl", "long.json", "long.txt"]
    assert not (tmp_path / "results").exists()
    report = json.loads((out / "long.json").read_text())
    limit = report["kv_memory_budget_bytes"]
    rows = {(r["policy"], r["budget"]): r for r in report["rows"]}
    assert set(rows) == {("full", None), ("h2o", 16), ("h2o", 0.5)}
    assert rows[("full", None)]["batch"] == 2  # the default budget is full's batch at the longest setting
    for r in rows.values():
        fits = dict((b, v) for b, v in r["batch_probes"])
        assert fits[r["batch"]] <= limit and (r["batch"] + 1 not in fits or fits[r["batch"] + 1] > limit)
        for key in ("batch_gain", "seq_gain", "decode_gain", "bytes_model_gain", "share_of_bytes_model",
                    "bound_gain", "e2e_gain", "e2e_model_gain", "floor_step_ms"):
            assert r[key] is not None, key
        assert r["decode_gain"] == pytest.approx(r["batch_gain"] * r["seq_gain"])
        assert r["batch_capped"] is False  # --quick's max batch (8) is above every fit
        # budgeted memory: the probe's peak at the run's batch = the timed run's cache at its end
        assert r["peak_kv_bytes"] == fits[r["batch"]] == r["kv_tensor_bytes_end"]
    assert rows[("h2o", 16)]["agreement"]["rows"] == 2
    assert rows[("h2o", 16)]["batch_probes"] == rows[("h2o", 0.5)]["batch_probes"]  # 0.5 of 32 = 16
    text = (out / "long.txt").read_text()
    assert "h2o@16" in text and "model" in text
    head = next(ln.split() for ln in text.splitlines() if ln.startswith("setting"))
    row = next(ln.split() for ln in text.splitlines() if ln.startswith("32+8") and "h2o@16" in ln)
    assert head[-2:] == ["kvMB", "rssMB"]
    assert row[-2] == f"{rows[('h2o', 16)]['peak_kv_bytes'] / 2**20:.0f}"


def test_timed_run_measures_rss_from_a_trimmed_heap(monkeypatch):
    """Each timed run starts its peak-RSS measurement with .memory.start_peak (heap trimmed, mark reset), so
    its increase does not count memory an earlier run freed but the allocator kept."""
    calls = []
    real = lb.start_peak
    monkeypatch.setattr(lb, "start_peak", lambda: calls.append(1) or real())
    model = lb.load_bench_model({"model_name": "tiny", "dtype": "float32", "prompt": "random",
                                 "data_dir": None})[0]
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    r = lb.timed_run(model, ids, "h2o", 6, 3)
    assert calls == [1] and r["peak_rss_delta_mb"] >= 0


def test_quick_run_with_beams_via_keyformer_bench(tmp_path, monkeypatch):
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["keyformer-bench", "--long", "--quick", "--out", str(tmp_path / "o")])
    lb.bench_main()  # the keyformer-bench entry point
    report = json.loads((tmp_path / "o" / "long.json").read_text())
    assert report["beams"]["num_beams"] == 2
    assert all(r["same_sequences"] for r in report["beams"]["rows"])


def test_journal_resumes_refuses_other_settings_and_drops_a_torn_line(tmp_path):
    from keyformer.lab.bench.journal import Journal

    path = tmp_path / "j" / "journal.jsonl"
    j = Journal(path, {"model": "tiny", "seed": 0}, log=lambda m: None)
    calls = []
    assert j.once("a", lambda: calls.append(1) or {"x": 1.5}) == {"x": 1.5}
    assert j.once("a", lambda: calls.append(1) or {"x": 9}) == {"x": 1.5} and len(calls) == 1
    j.check("prompts", "abc", "the prompts")
    with open(path, "a") as f:
        f.write('{"key": "b", "val')  # a kill in the middle of a write
    logs = []
    j2 = Journal(path, {"model": "tiny", "seed": 0}, log=logs.append)
    assert j2.resumed == 2 and j2.get("a") == {"x": 1.5} and "b" not in j2
    assert any("cut short" in m for m in logs)
    assert all(json.loads(line) for line in path.read_text().splitlines())  # the torn line is gone
    with pytest.raises(SystemExit, match="the prompts changed.*'abc' there, 'abd' now"):
        j2.check("prompts", "abd", "the prompts")
    with pytest.raises(SystemExit, match="seed: 0 there, 1 now"):
        Journal(path, {"model": "tiny", "seed": 1}, log=lambda m: None)


def test_quick_run_resumes_from_its_journal(tmp_path, monkeypatch):
    """A run killed during its second timed run resumes: what finished is reused (same numbers), only the rest
    is measured; a finished run re-run measures nothing; more rounds measure only the new rounds."""
    real = lb.timed_run
    timed, floors = [], []  # the timed runs (8 tokens in --quick) and the compute-floor runs (9 tokens)

    def counting(model, ids, name, budget, n_new, seed=0):
        if n_new == 8:
            timed.append((name, budget))
            if kill and len(timed) == 2:
                raise KeyboardInterrupt  # the kill
        elif n_new == 9:
            floors.append(ids.shape[0])
        return real(model, ids, name, budget, n_new, seed)

    args = ["--quick", "--beams", "0", "--out", str(tmp_path / "o"), "--budgets", "16"]
    monkeypatch.setattr(lb, "timed_run", counting)
    kill = True
    with pytest.raises(KeyboardInterrupt):
        lb.main(args)
    kill = False
    lines = (tmp_path / "o" / "journal.jsonl").read_text().splitlines()
    first = {r["key"]: r["value"] for r in map(json.loads, lines[1:])}
    runs = [k for k in first if k.startswith("run/")]
    assert len(runs) == 1 and runs[0].startswith("run/32+8/full/B2/r0")
    assert timed == [("full", None), ("h2o", 16)] and floors == []
    timed.clear()
    report = lb.run(lb.parse_args(args), log=lambda m: None)
    assert timed == [("h2o", 16)]  # only the run that was killed
    assert len(floors) == len({r["batch"] for r in report["rows"]})
    full = next(r for r in report["rows"] if r["policy"] == "full")
    assert full["decode_tok_s"]["median"] == pytest.approx(2 * 7 / first[runs[0]]["decode_s"])  # reused
    assert report["complete"] and report["journal"]["resumed_measurements"] == len(first)
    timed.clear(), floors.clear()
    again = lb.run(lb.parse_args(args), log=lambda m: None)
    assert timed == [] and floors == []  # every measurement from the journal
    assert again["rows"] == report["rows"]
    report = lb.run(lb.parse_args([*args, "--rounds", "2"]), log=lambda m: None)
    assert timed == [("full", None), ("h2o", 16)]  # round 2 only
    assert all(r["policy"] == "full" or r["agreement"]["rows"] == 2 for r in report["rows"])
    with pytest.raises(SystemExit, match="max_batch: 8 there, 4 now"):
        lb.run(lb.parse_args([*args, "--max-batch", "4"]), log=lambda m: None)


@pytest.mark.slow
def test_gpu_script_dry_run(tmp_path):
    """scripts/gpu_bench.sh --dry-run: the prepared GPU run's steps on CPU with tiny shapes (a few
    minutes)."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    subprocess.run(["bash", str(root / "scripts" / "gpu_bench.sh"), "--dry-run"], cwd=root, env=env,
                   check=True,
                   timeout=1200)
    for name in ("log.txt", "tests_graphs.txt", "tests_on_device.txt", "latency/gpu_bench.json",
                 "static/static_full.json", "static/static_full.txt", "fixed/gpu_long.json",
                 "fixed/gpu_long.txt"):
        assert (tmp_path / name).is_file(), name
    assert len([f for f in tmp_path.rglob("*") if f.is_file()]) <= 10  # what the device tool brings back
    assert (tmp_path / "log.txt").read_text().count("exit 0") == 4  # four steps ran (the fifth: GPU only)
    static = json.loads((tmp_path / "static" / "static_full.json").read_text())["cells"]
    assert [c["model"] for c in static] == ["gptj", "llama3"]
    assert all(c["runs"]["static_full_eager"]["same_tokens_as_full"] for c in static)
    assert "static_full" in json.loads((tmp_path / "fixed" / "gpu_long.json").read_text())["settings"][0]
    fixed = json.loads((tmp_path / "fixed" / "gpu_long.json").read_text())["settings"][0]
    rows = {r["policy"]: r for r in fixed["rows"]}
    assert list(rows) == ["full", "keyformer", "h2o", "window"] and not fixed["skipped"]
    for p, r in rows.items():  # the memory budget caps every batch; the policies fit more than full
        assert r["peak_kv_bytes"] <= fixed["memory_budget_bytes"] and r["mode"] == "eager" and r["reason"], p
        if p != "full":
            assert r["batch"] > rows["full"]["batch"] and r["bytes_model_gain"] > 1, p
            assert r["share_of_bound"] > 0 and 0 <= r["agreement"]["match"] <= 1, p
    cells = json.loads((tmp_path / "latency" / "gpu_bench.json").read_text())["cells"]
    graphs = [c for c in cells if c.get("kind") == "graphs"]
    assert {c["model"] for c in graphs} == {"gptj", "llama3"}
    for c in graphs:  # on CPU every policy falls back to eager, with the reason, and the tokens agree
        for p, r in c["runs"].items():
            assert r["same_tokens"] and r["captured"]["captured_steps"] == 0 and r["captured"]["reason"], p
    tests = (tmp_path / "tests_graphs.txt").read_text()
    assert re.search(r"\d+ skipped", tests)  # CPU: the captured == eager tests skip (summary line)


def test_code_tree_ignores_results_and_docs_but_not_code(tmp_path):
    """The journal's code identity: a commit that changes only a results or docs file keeps it; a change to
    keyformer/ or pyproject.toml (committed or not) changes it."""
    import subprocess

    from keyformer.run.results import code_tree

    def git(*a):
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *a], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "keyformer").mkdir()
    (tmp_path / "keyformer" / "a.py").write_text("x = 1\n")
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "README.md").write_text("v1\n")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "one")
    first = code_tree(tmp_path)
    assert first and "-dirty" not in first
    (tmp_path / "README.md").write_text("v2\n")
    assert code_tree(tmp_path) == first  # a dirty README is not dirty code
    git("commit", "-qam", "docs")
    assert code_tree(tmp_path) == first
    (tmp_path / "keyformer" / "a.py").write_text("x = 2\n")
    dirty = code_tree(tmp_path)
    assert dirty.startswith(first + "-dirty.")
    (tmp_path / "keyformer" / "a.py").write_text("x = 3\n")
    assert code_tree(tmp_path).startswith(first + "-dirty.") and code_tree(tmp_path) != dirty  # other changes
    (tmp_path / "keyformer" / "a.py").write_text("x = 2\n")
    git("commit", "-qam", "code")
    second = code_tree(tmp_path)
    assert second != first and "-dirty" not in second
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    git("commit", "-qam", "deps")
    assert code_tree(tmp_path) not in (first, second)
    # narrower paths (the long benchmark's BENCH_CODE): a change outside them keeps the identity
    (tmp_path / "keyformer" / "core").mkdir()
    (tmp_path / "keyformer" / "core" / "b.py").write_text("y = 1\n")
    git("add", "-A")
    git("commit", "-qm", "core")
    core = code_tree(tmp_path, paths=("keyformer/core", "pyproject.toml"))
    (tmp_path / "keyformer" / "a.py").write_text("x = 4\n")
    git("commit", "-qam", "analysis")
    assert code_tree(tmp_path, paths=("keyformer/core", "pyproject.toml")) == core
    (tmp_path / "keyformer" / "core" / "b.py").write_text("y = 2\n")
    assert code_tree(tmp_path, paths=("keyformer/core", "pyproject.toml")).startswith(core + "-dirty.")
    assert code_tree(tmp_path, paths=("keyformer/missing",)) is None


def test_bench_beams_script_quick(tmp_path):
    """scripts/bench_beams.py (the beam section on its own) on the tiny model: both modes give the same
    sequences, the table and the JSON are written, and the JSON names the code it measured."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_beams", ROOT / "scripts" / "bench_beams.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.main(["--quick", "--policies", "h2o", "--out", str(tmp_path)])
    assert [row["policy"] for row in r["rows"]] == ["full", "h2o"] and r["num_beams"] == 4
    assert all(row["same_sequences"] for row in r["rows"])
    assert all(row["per_beam_prompt"]["prefill_s"]["n"] == 2 for row in r["rows"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["beams.json", "beams.txt", "command.txt"]
    assert json.loads((tmp_path / "beams.json").read_text())["code"] == r["code"]
    assert "h2o@0.5" in (tmp_path / "beams.txt").read_text()


@pytest.mark.parametrize("L, n", [(30, 20), (8, 20), (8, 3)])
def test_hybrid_peak_and_sliding_capacity(L, n):
    """Tiny hybrid Gemma 3 (window 12 on layers 0 and 2): a sliding layer's buffer never exceeds its window
    nor the prompt plus the generation (it doubled past both when a short prompt grew during decode: 9 -> 18
    slots for 11 tokens), and peak_kv_bytes equals the
    peak seen over a whole generation, full included (its sliding layers grow after the prompt)."""
    from keyformer.core.generate import make_cache
    from keyformer.core.models import TINY_WINDOW
    from keyformer.core.policies import make_policy

    model = tiny_model("gemma3_text", seed=0)
    ids = torch.randint(3, 256, (2, L), generator=torch.Generator().manual_seed(0))
    for name, budget in (("full", None), ("h2o", 0.5), ("snapkv", 0.5)):
        pol = make_policy(name) if budget is None else make_policy(name, budget=budget)
        cache = make_cache(model, pol, torch.ones_like(ids), max_new_tokens=n)
        with torch.inference_mode():
            out = model(input_ids=ids, cache=cache, logits_to_keep=1)
            peak = cache.tensor_bytes()
            for _ in range(n - 1):
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
                out = model(input_ids=tok, cache=cache, logits_to_keep=1)
                peak = max(peak, cache.tensor_bytes())
        assert all(lay.capacity <= min(TINY_WINDOW, L + n) for lay in cache.layers if lay.window), name
        assert lb.peak_kv_bytes(model, ids, name, budget, n) == peak, name


def test_mask_mode_sliding_layer_still_grows_by_doubling():
    """The mask simulation keeps every token of a sliding layer (alive flags), so its buffer must keep
    doubling: capping it at the window would reallocate at every decode step past W."""
    from keyformer.core.generate import make_cache
    from keyformer.core.policies import make_policy

    model = tiny_model("gemma3_text", seed=0)
    ids = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    cache = make_cache(model, make_policy("h2o", budget=0.5), torch.ones_like(ids), max_new_tokens=40,
                       mode="mask")
    caps = []
    with torch.inference_mode():
        out = model(input_ids=ids, cache=cache, logits_to_keep=1)
        for _ in range(39):
            out = model(input_ids=out.logits[:, -1].argmax(-1, keepdim=True), cache=cache, logits_to_keep=1)
            caps.append(cache.layers[0].capacity)
    assert len(set(caps)) <= 4 and max(caps) >= 47  # 8 + 39 slots held, in a few doublings


@pytest.mark.slow
def test_rss_history_script_quick():
    """scripts/rss_history.py: the same runs from an untrimmed and a trimmed heap, one line per run."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rss_history", ROOT / "scripts" / "rss_history.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = mod.main(["--model", "tiny", "--batch", "2", "--prompt-len", "32", "--budget", "8"])
    rows = [ln.split() for ln in text.splitlines()[3:]]
    assert [r[1] for r in rows] == ["h2o", "keyformer", "h2o"]
    assert all(float(x) >= 0 for r in rows for x in r[2:])


def test_rss_probe_script_quick(tmp_path, monkeypatch):
    """scripts/rss_probe.py: a header naming the run, its code and glibc's ``MALLOC_*`` settings, then a row
    at the prompt, every ``--every`` decode steps and the last; the probe itself holds no tensors across steps
    (the live count is flat)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rss_probe", ROOT / "scripts" / "rss_probe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "probe.jsonl"
    monkeypatch.setenv("MALLOC_PROBE_TEST_", "7")
    rows = mod.main(["--model", "tiny", "--batch", "2", "--prompt-len", "16", "--budget", "8", "--new", "20",
                     "--every", "8", "--out", str(out)])
    head, steps = rows[0], rows[1:]
    assert [json.loads(ln) for ln in out.read_text().splitlines()] == rows
    assert (head["policy"], head["budget"], head["batch"], head["new"]) == ("keyformer", 8, 2, 20)
    assert head["code"] and head["cpu"] and head["base_rss_mb"] > 0
    assert head["malloc_env"].get("MALLOC_PROBE_TEST_") == "7"
    assert [r["step"] for r in steps] == [0, 8, 16, 19]
    assert all(r["hwm_mb"] >= r["rss_mb"] > 0 for r in steps)
    assert len({r["tensors"] for r in steps[1:]}) == 1


@pytest.mark.parametrize("share, bound, compute_bound, want", [
    (0.93, 1.20, False, "met (bytes model)"),      # bytes-bound and at 93 % of the model
    (0.89, 1.20, False, "not met"),                # not compute-bound: the bound is not the bar
    (0.63, 1.09, True, "met (compute floor)"),     # compute-bound, at 109 % of max(bytes model, floor)
    (0.63, 0.85, True, "not met"),                 # compute-bound but 85 % of the bound
    (None, None, False, "-"),                      # no full row to compare with
])
def test_long_verdict_applies_the_issues_target(share, bound, compute_bound, want):
    from keyformer.lab.report import long_verdict

    row = {"share_of_bytes_model": share, "share_of_bound": bound, "compute_bound": compute_bound}
    assert long_verdict(row) == want


def test_bench_long_section_reads_every_setting(tmp_path):
    """``keyformer-report --section bench_long`` prints one row per configuration of every setting's
    long.json, settings ordered by prompt then generated tokens, partial runs marked, each row's commit where
    the settings ran at different ones, and the beam line."""
    from keyformer.lab.report import render

    def run(prompt: int, new: int, complete: bool, beams: dict | None) -> dict:
        row = lambda p, b, g: {"setting": f"{prompt}+{new}", "policy": p, "budget": b, "batch": 4,  # noqa: E731
                               "decode_tok_s": {"median": 10.0 * g, "n": 1}, "decode_gain": g,
                               "bytes_model_gain": 2.0 * g, "share_of_bytes_model": 0.5, "bound_gain": g,
                               "share_of_bound": 1.0, "compute_bound": p != "full", "e2e_gain": g}
        return {"environment": {"git_commit": "abcdef0123", "cpu": "cpu", "threads": 2},
                "kv_memory_budget_bytes": 2**20, "settings": [{"prompt_len": prompt, "new_tokens": new}],
                "bandwidth": {"read_gbs": 20.0}, "complete": complete, "beams": beams,
                "rows": [row("full", None, 1.0), row("h2o", 256, 3.0)]}

    beams = {"num_beams": 4, "prompt_len": 512, "new_tokens": 64,
             "rows": [{"policy": "full", "prefill_speedup": 4.0, "same_sequences": True}]}
    for prompt, new, complete, bm in ((2048, 2048, False, None), (512, 2048, True, beams)):
        (tmp_path / "bench" / "long" / f"{prompt}_{new}").mkdir(parents=True)
        (tmp_path / "bench" / "long" / f"{prompt}_{new}" / "long.json").write_text(
            json.dumps(run(prompt, new, complete, bm)))
    text = render("bench_long", tmp_path)
    rows = [ln for ln in text.splitlines() if ln.startswith("| 512") or ln.startswith("| 2048")]
    assert [r.split("|")[1].strip() for r in rows] == ["512+2048"] * 2 + ["2048+2048 (partial)"] * 2
    assert rows[1].rstrip().endswith("| met (compute floor) | - |") and "| 3.00x | 6.00x | 50 % |" in rows[1]
    assert "git abcdef0" in text and "full 4.00x faster" in text
    later = json.loads((tmp_path / "bench" / "long" / "512_2048" / "long.json").read_text())
    later["environment"]["git_commit"] = "1234567890"
    (tmp_path / "bench" / "long" / "512_2048" / "long.json").write_text(json.dumps(later))
    rows = [ln.split("|")[1].strip() for ln in render("bench_long", tmp_path).splitlines()
            if ln.startswith("| 512") or ln.startswith("| 2048")]
    assert rows == ["512+2048 (git 1234567)"] * 2 + ["2048+2048 (partial) (git abcdef0)"] * 2
    # with its journal, a setting's rows say when and at which commit each was measured, not the run's label
    lines = [{"header": {}, "time": "2026-12-04T14:54:32+0000"},
             {"key": "run/512+2048/full/B4/r0", "value": {}, "time": "2026-12-04T15:03:10+0000"},
             {"key": "session/1", "value": {"git_commit": "fedcba9876"}, "time": "2026-12-04T22:10:00+0000"},
             {"key": "run/512+2048/h2o@256/B4/r0", "value": {}, "time": "2026-12-04T22:23:59+0000"},
             {"key": "run/512+2048/h2o@256/B4/r1", "value": {}, "time": "2026-12-05T01:00:00+0000"}]
    (tmp_path / "bench" / "long" / "512_2048" / "journal.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in lines) + '{"key": "run/cut')
    rows = [ln.split("|") for ln in render("bench_long", tmp_path).splitlines() if ln.startswith("| 512")]
    assert [(r[1].strip(), r[2].strip(), r[15].strip()) for r in rows] == [
        ("512+2048", "full", "12-04 15:03 1234567"), ("512+2048", "h2o@256", "12-04 22:23 fedcba9")]
