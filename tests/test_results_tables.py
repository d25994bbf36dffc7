"""Self-describing results: provenance columns, ``keyformer-collect --replace``, and the README tables that
``keyformer-report`` regenerates from the committed data (issue 24, part 4)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from keyformer.lab import collect, report

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "results"
PROV = ["code_version", "git_commit", "device", "dtype", "batch_size", "provenance", "committed_in"]


def _sweep(root: Path, points: dict[str, float], metrics: dict | None = None) -> Path:
    """A sweep folder with one finished 2-sample run per ``point name -> rouge2``."""
    for name, r2 in points.items():
        d = root / name
        d.mkdir(parents=True)
        (d / "config.yaml").write_text(
            "policy:\n  name: h2o\n  budget: 0.5\n  recent: 0.3\nbudget: 0.5\nn_samples: 2\nbatch_size: 2\n"
            "dataset: {name: cnn_dailymail}\nmodel: {name: m}\ngeneration: {max_new_tokens: 8, num_beams: "
            "1}\n"
            "resolved: {device: cpu, dtype: float32, versions: {keyformer: cfghash}}\n")
        rows = [{"id": f"a{i}", "prompt_tokens": 10, "truncated_tokens": 0, "generated_tokens": 8,
                 "rouge1": 1.0,
                 "rouge2": r2, "rougeL": 1.0, "rougeLsum": 1.0, "kv_bytes": 50, "kv_bytes_full": 100,
                 "prediction": "x"} for i in range(2)]
        (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        m = {"complete": True} if metrics is None else {"complete": True, **metrics}
        (d / "metrics.json").write_text(json.dumps(m))
    return root


def test_collect_writes_provenance_from_metrics(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path / "s", {"a": 1.0}, {"code_version": "abc123", "git_commit": "f" * 40,
                                                "device": "cuda", "dtype": "bfloat16"})
    assert collect.main([str(sweep), str(tmp_path / "out")]) == 0
    row = pd.read_csv(tmp_path / "out" / "points.csv").iloc[0]
    assert set(PROV) <= set(row.index)
    assert (row["code_version"], row["git_commit"], row["device"], row["dtype"], row["batch_size"],
            row["provenance"]) == ("abc123", "f" * 40, "cuda", "bfloat16", 2, "run")
    assert pd.isna(row["committed_in"])


def test_collect_provenance_falls_back_to_resolved_and_never_guesses(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path / "s", {"a": 1.0}, {})  # an old run: metrics.json without provenance
    collect.main([str(sweep), str(tmp_path / "out")])
    row = pd.read_csv(tmp_path / "out" / "points.csv").iloc[0]
    assert (row["device"], row["dtype"], row["code_version"]) == ("cpu", "float32", "cfghash")
    assert pd.isna(row["git_commit"])  # recorded nowhere: left empty


def test_collect_replace_merges_and_logs_old_and_new_provenance(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    collect.main([str(_sweep(tmp_path / "old", {"a": 1.0, "b": 2.0}, {"git_commit": "old"})), str(out)])
    new = _sweep(tmp_path / "new", {"b": 5.0, "c": 7.0}, {"git_commit": "new", "device": "cuda"})
    assert collect.main([str(new), str(out), "--replace"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("replaced b" in x and "old:" in x and "new:" in x for x in lines)
    assert any("added c" in x for x in lines)
    points = pd.read_csv(out / "points.csv").set_index("point")
    samples = pd.read_csv(out / "samples.csv")
    assert list(points.index) == ["a", "b", "c"]  # replaced in place, new appended, others kept
    assert list(points["rouge2"]) == [1.0, 5.0, 7.0]
    assert points.loc["a", "git_commit"] == "old" and points.loc["b", "git_commit"] == "new"
    assert sorted(samples.groupby("point")["rouge2"].first().items()) == [("a", 1.0), ("b", 5.0), ("c", 7.0)]
    assert len(samples) == 6
    log = pd.read_csv(out / "replaced.csv")
    b = log.set_index("point").loc["b"]
    assert (b["action"], b["old_git_commit"], b["new_git_commit"], b["new_device"]) == ("replaced", "old",
                                                                                        "new",
                                                                                        "cuda")
    assert log.set_index("point").loc["c", "action"] == "added"
    before = [(out / f).read_text() for f in ("points.csv", "samples.csv")]
    collect.main([str(new), str(out), "--replace"])  # the same folder again: nothing changed, nothing logged
    assert len(pd.read_csv(out / "replaced.csv")) == 2
    assert [(out / f).read_text() for f in ("points.csv", "samples.csv")] == before
    newer = _sweep(tmp_path / "newer", {"b": 5.0, "c": 8.0}, {"git_commit": "new", "device": "cuda"})
    collect.main([str(newer), str(out), "--replace"])  # c's rows changed, b's did not: only c is logged
    log = pd.read_csv(out / "replaced.csv")
    assert len(log) == 3 and (log.iloc[-1]["point"], log.iloc[-1]["action"]) == ("c", "replaced")


def test_collect_replace_ignores_columns_only_other_points_have(tmp_path: Path) -> None:
    """A curated file holds the union of every point's columns: re-collecting one point whose rows are the
    same is not a change, although its own frame lacks the others' columns and its integer knob reads back
    as a float beside their empty cells."""
    def knob(sweep: Path, name: str, line: str) -> None:
        cfg = sweep / name / "config.yaml"
        cfg.write_text(cfg.read_text().replace("  recent: 0.3\n", f"  recent: 0.3\n  {line}\n"))

    out = tmp_path / "out"
    both = _sweep(tmp_path / "both", {"a": 1.0, "b": 2.0})
    knob(both, "a", "only_a: 0.5")
    knob(both, "b", "k: 5")
    collect.main([str(both), str(out)])
    assert {"policy.only_a", "policy.k"} <= set(pd.read_csv(out / "points.csv").columns)
    alone = _sweep(tmp_path / "alone", {"b": 2.0})
    knob(alone, "b", "k: 5")
    collect.main([str(alone), str(out), "--replace"])
    assert not (out / "replaced.csv").is_file()  # nothing changed: no log
    knob(alone, "b", "k2: 1")  # a real change (a new knob) is logged
    collect.main([str(alone), str(out), "--replace"])
    assert list(pd.read_csv(out / "replaced.csv")["point"]) == ["b"]


def test_collect_replace_keeps_numeric_answers_as_text(tmp_path: Path) -> None:
    """A point whose generated answers are all digit strings (RULER's values, some longer than a float holds)
    is compared as text: re-collecting it is not a change, and a changed answer is."""
    def answers(sweep: Path, texts: list[str]) -> None:
        f = sweep / "a" / "predictions.jsonl"
        rows = [json.loads(ln) for ln in f.read_text().splitlines()]
        f.write_text("".join(json.dumps({**r, "prediction": t}) + "\n"
                             for r, t in zip(rows, texts, strict=True)))

    out = tmp_path / "out"
    big = ["1" * 127 + ".", "1000000."]  # as the model answers: digits and a full stop
    first = _sweep(tmp_path / "first", {"a": 1.0})
    answers(first, big)
    collect.main([str(first), str(out)])
    again = _sweep(tmp_path / "again", {"a": 1.0})
    answers(again, big)
    assert collect.main([str(again), str(out), "--replace"]) == 0
    assert not (out / "replaced.csv").is_file()  # the same answers: nothing logged
    assert "1" * 127 + "." in (out / "samples.csv").read_text()  # the curated text kept verbatim
    answers(again, ["1" * 126 + "2.", "1000000."])  # one digit of 127 differs: a float would not see it
    assert collect.main([str(again), str(out), "--replace"]) == 0
    assert list(pd.read_csv(out / "replaced.csv")["point"]) == ["a"]


def test_collect_refuses_to_drop_points_without_replace(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    collect.main([str(_sweep(tmp_path / "old", {"a": 1.0, "b": 2.0})), str(out)])
    before = (out / "points.csv").read_text()
    assert collect.main([str(_sweep(tmp_path / "new", {"b": 5.0})), str(out)]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "a" in err.split("does not:")[1] and "--replace" in err
    assert (out / "points.csv").read_text() == before  # nothing written
    grown = _sweep(tmp_path / "grown", {"a": 1.0, "b": 2.0, "c": 3.0})  # a superset rewrites as before
    assert collect.main([str(grown), str(out)]) == 0
    assert list(pd.read_csv(out / "points.csv")["point"]) == ["a", "b", "c"]


def test_collect_complete_only_leaves_unfinished_points_out(tmp_path: Path, capsys) -> None:
    sweep = _sweep(tmp_path / "s", {"a": 1.0, "b": 2.0})
    (sweep / "b" / "metrics.json").write_text(json.dumps({"complete": False}))  # b is still running
    out = tmp_path / "out"
    assert collect.main([str(sweep), str(out), "--replace", "--complete-only"]) == 0
    assert "left out 1 unfinished point(s)" in capsys.readouterr().out
    assert list(pd.read_csv(out / "points.csv")["point"]) == ["a"]
    assert set(pd.read_csv(out / "samples.csv")["point"]) == {"a"}
    collect.main([str(sweep), str(tmp_path / "all")])  # without the flag the partial point is collected
    assert list(pd.read_csv(tmp_path / "all" / "points.csv")["point"]) == ["a", "b"]
    (sweep / "a" / "metrics.json").write_text(json.dumps({"complete": False}))
    assert collect.main([str(sweep), str(tmp_path / "none"), "--complete-only"]) == 1
    assert "no finished runs" in capsys.readouterr().err


def test_merge_script_is_gone() -> None:
    assert not (ROOT / "scripts" / "merge_results.py").exists()


def test_every_committed_points_csv_has_provenance() -> None:
    files = sorted(RES.glob("**/points.csv"))
    assert len(files) >= 14
    for f in files:
        p = pd.read_csv(f)
        missing = [c for c in PROV if c not in p.columns]
        assert not missing, f"{f.relative_to(ROOT)} lacks {missing}"
        assert p["provenance"].notna().all(), f"{f.relative_to(ROOT)}: a row without provenance"
        assert p["provenance"].map(lambda v: v == "run" or v.startswith("backfilled:")).all()
        assert set(p["device"]) <= {"cpu", "cuda"} and set(p["dtype"]) <= {"float32", "bfloat16", "float16"}
        backfilled = p[p["provenance"].str.startswith("backfilled:")]
        assert backfilled["code_version"].isna().all()  # no committed record names it: never invented
        assert backfilled["committed_in"].map(lambda c: bool(re.fullmatch(r"[0-9a-f]{40}", str(c)))).all()


def test_fewshot_rows_have_provenance(tmp_path: Path) -> None:
    rows = pd.read_csv(RES / "fewshot" / "fewshot.csv")
    assert {"dtype", "batch_size", "git_commit", "device", "code_version", "provenance"} <= set(rows.columns)
    assert rows["provenance"].notna().all() and set(rows["device"]) <= {"cpu", "cuda"}
    run = tmp_path / "sweep" / "policy=full"  # a fresh lm-eval run: provenance from its own files
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("policy: {_target_: x.full}\ndtype: float32\ndevice: auto\n"
                                     "resolved: {device: cpu, versions: {keyformer: h1}}\n")
    (run / "metrics.json").write_text(json.dumps({"task": "lm_eval", "complete": True, "git_commit": "c1",
                                                  "tasks": {"piqa": {"acc": 0.5, "n_samples": 2}}}))
    collect.main([str(tmp_path / "sweep"), str(tmp_path / "out")])
    r = pd.read_csv(tmp_path / "out" / "fewshot.csv").iloc[0]
    assert (r["device"], r["code_version"], r["git_commit"], r["provenance"]) == ("cpu", "h1", "c1", "run")


def test_exp7_devices_match_the_h200_log() -> None:
    """The backfilled device of every experiment-7 point agrees with the H200 run's own log, parsed here."""
    text = (RES / "gpu_studies" / "points.txt").read_text()
    finished = set(re.findall(r"multirun/exp7_field/(\S+): finished in", text))
    for task in ("cnndm", "needle", "leval_sqa", "multi_news"):
        p = pd.read_csv(RES / "exp7_field" / task / "points.csv")
        on_gpu = {f"{task}/{x}" for x in p.loc[p["device"] == "cuda", "point"]}
        assert on_gpu == {x for x in finished if x.startswith(task + "/")}
        batch = p.groupby("device")["batch_size"].unique()
        assert all(b not in batch.get("cpu", []) for b in batch.get("cuda", []))


def test_archive_holds_the_superseded_runs_and_its_manifest() -> None:
    names = {"exp1_cnndm_7e9326a", "exp1_cnndm_oldstream", "exp8_powered_buggy", "exp8_authors_raw",
             "bench_63988e1", "bench_7ae70b7", "bench_4b5ff8d", "bench_long_ffed69b",
             "bench_long_217af8f", "bench_long_86a5f65", "bench_f206083", "bench_long_dd576eb",
             "bench_long_c89afe8", "bench_564ed48", "bench_long_2a3110f", "bench_gpu_070ed53",
             "exp10_ruler_gemma_nobos"}
    assert {d.name for d in (RES / "archive").iterdir() if d.is_dir()} == names
    manifest = (RES / "archive" / "MANIFEST.md").read_text()
    assert all(f"`{n}/`" in manifest for n in names)
    for n in sorted(names):  # a bench row's typed bandwidth is its own table's
        row = next(ln for ln in manifest.splitlines() if ln.startswith(f"| `{n}/`"))
        typed = re.search(r"read ([\d.]+) GB/s", row)
        if typed and (RES / "archive" / n / "table.txt").is_file():
            assert f"read {typed[1]} GB/s" in (RES / "archive" / n / "table.txt").read_text(), n
    for n in ("bench_long_c89afe8", "bench_long_2a3110f"):  # a long run's row names its own start
        start = re.search(r"^started (\d{4}-\d\d-\d\d)T(\d\d:\d\d)", (RES / "archive" / n / "run_log.txt")
                          .read_text(), re.M)
        row = next(ln for ln in manifest.splitlines() if ln.startswith(f"| `{n}/`"))
        assert f"`{n[-7:]}`, {start[1]} {start[2]} (CPU" in row, n
    row = next(ln for ln in manifest.splitlines() if ln.startswith("| `bench_564ed48/`"))
    env = json.loads((RES / "archive" / "bench_564ed48" / "bench.json").read_text())["environment"]
    fam = re.search(r"\((family \d+ model \d+), ([\w-]+)\)", env["cpu"])
    assert f"{fam[1]}, {fam[2]}" in row
    spread = _decode_spread((RES / "archive" / "bench_564ed48" / "table.txt").read_text())
    assert f"decode IQRs a median {spread} %" in row
    assert not any((RES / n).exists() for n in names)


def test_update_text_rewrites_only_marked_regions(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(report.LIBRARY_SECTIONS, "t", lambda res: print("\n### t\n\n| a |\n|---|\n| 1 |"))
    text = ("intro\n<!-- keyformer-report:t -->\nstale\n<!-- /keyformer-report:t -->\noutro 91.5\n")
    new = report.update_text(text, tmp_path)
    assert new == ("intro\n<!-- keyformer-report:t -->\n### t\n\n| a |\n|---|\n| 1 |\n"
                   "<!-- /keyformer-report:t -->\noutro 91.5\n")
    f = tmp_path / "R.md"
    f.write_text(text)
    assert report.drift((f,), tmp_path) == [f"{f}: t"]
    f.write_text(new)
    assert report.drift((f,), tmp_path) == []
    with pytest.raises(KeyError, match="unknown section 'nope'"):
        report.render("nope", tmp_path)


def test_readme_tables_equal_keyformer_report(monkeypatch) -> None:
    """Every table the READMEs and docs quote between keyformer-report markers is regenerated from the
    committed data and must equal it (fix: ``keyformer-report --update-readme``)."""
    monkeypatch.chdir(ROOT)
    quoted = {n for f in report.readme_files() for n, _ in report.marked(f.read_text())}
    assert {"demo", "brief"} <= quoted
    assert report.drift(report.readme_files(), Path("results")) == []


def test_demo_section_lists_each_policy_with_its_command(tmp_path: Path, capsys) -> None:
    d = tmp_path / "demo"
    d.mkdir()
    pd.DataFrame([{"point": f"policy={p}", "policy": p, "budget": b, "n_done": 16, "accuracy": a,
                   "rouge2": 1.0,
                   "rougeL": 2.0, "device": "cpu", "dtype": "float32", "git_commit": "abcdef0123"}
                  for p, b, a in (("window", 0.5, 0.0), ("full", 1.0, 93.75), ("keyformer", 0.5, 62.5))]
                 ).to_csv(d / "points.csv", index=False)
    report.demo(tmp_path)
    out = capsys.readouterr().out.strip().splitlines()
    assert "16 samples; cpu float32; git abcdef0" in out[0]
    assert out[-3:] == ["| `python run.py policy=full` | 93.8 | 1.0 | 2.0 |",
                        "| `python run.py` (Keyformer, budget 0.5) | 62.5 | 1.0 | 2.0 |",
                        "| `python run.py policy=window` | 0.0 | 1.0 | 2.0 |"]
    report.demo(tmp_path / "nothing")
    assert capsys.readouterr().out == ""


def test_git_dirty_names_the_changed_files(tmp_path: Path) -> None:
    import subprocess

    from keyformer.run.results import git_commit, git_dirty_files

    assert git_dirty_files(tmp_path) is None and git_commit(tmp_path) is None  # not a checkout
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("x = 1\n")
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "c"], cwd=tmp_path, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True)
    head = head.stdout.strip()
    (tmp_path / "untracked.py").write_text("y = 2\n")  # untracked files do not make a checkout dirty
    assert git_dirty_files(tmp_path) == [] and git_commit(tmp_path) == head
    (tmp_path / "b.py").write_text("x = 2\n")
    subprocess.run([*git, "mv", "a.py", "c.py"], cwd=tmp_path, check=True)
    assert git_dirty_files(tmp_path) == ["b.py", "c.py"]
    assert git_commit(tmp_path) == head + "-dirty"


def _bench_rows(table: str) -> dict[str, tuple[float, float, float, float]]:
    """``group config`` -> (prefill x full, decode median, IQR low, IQR high) from a ``table.txt``."""
    rows = {}
    row = r"^(L\S+)\s+(\S+)\s+[\d.]+\s+([\d.]+)\s+([\d.]+) \[\s*([\d.]+),\s*([\d.]+)\]"
    for m in re.finditer(row, table, re.M):
        rows[f"{m[1]} {m[2]}"] = tuple(float(m[i]) for i in range(3, 7))
    return rows


def _decode_spread(table: str) -> int:
    """Median over a table's rows of the decode IQR as a share of its median, in %."""
    iqr = [(hi - lo) / med * 100 for _, med, lo, hi in _bench_rows(table).values()]
    return round(pd.Series(iqr).median())


def test_collect_policies_collects_only_those_policies(tmp_path: Path, capsys) -> None:
    """``--policies``: only the named policies' points (and their samples) land; a name no point has is a
    clear error naming the policies the sweep holds, and nothing is written."""
    sweep = _sweep(tmp_path / "s", {"a": 1.0, "b": 2.0})
    cfg = (sweep / "b" / "config.yaml").read_text()
    (sweep / "b" / "config.yaml").write_text(cfg.replace("name: h2o", "name: tova"))
    out = tmp_path / "out"
    assert collect.main([str(sweep), str(out), "--replace", "--policies", "tova"]) == 0
    assert list(pd.read_csv(out / "points.csv")["point"]) == ["b"]
    assert set(pd.read_csv(out / "samples.csv")["point"]) == {"b"}
    assert collect.main([str(sweep), str(out), "--replace", "--policies", "h2o,tova"]) == 0
    assert sorted(pd.read_csv(out / "points.csv")["point"]) == ["a", "b"]
    before = (out / "points.csv").read_text()
    assert collect.main([str(sweep), str(out), "--replace", "--policies", "tova,pyramid"]) == 2
    err = capsys.readouterr().err
    assert "--policies pyramid" in err and "h2o, tova" in err
    assert (out / "points.csv").read_text() == before


def test_speed_lines_read_the_bench_data(tmp_path: Path, capsys) -> None:
    """The README's two speed lines: gains at equal K/V memory from bench/long, eager and captured GPU ratios
    from the latest bench/gpu run, on hand-made numbers."""
    import json

    from keyformer.lab.report import speed

    long = tmp_path / "bench" / "long" / "512_2048"
    long.mkdir(parents=True)
    rows = [{"policy": "full", "batch": 4, "decode_gain": 1.0},
            {"policy": "keyformer", "batch": 64, "decode_gain": 3.0},
            {"policy": "keyformer", "batch": 32, "decode_gain": 2.0},
            {"policy": "h2o", "batch": 64, "decode_gain": 4.0},
            {"policy": "window", "batch": 64, "decode_gain": 5.0}]
    (long / "long.json").write_text(json.dumps({
        "rows": rows, "environment": {"cpu": "cpu0", "threads": 2}, "kv_memory_budget_bytes": 100 * 2**20,
        "settings": [{"prompt_len": 512, "new_tokens": 2048}]}))
    gpu = tmp_path / "bench" / "gpu" / "2026-01-01"
    (gpu / "latency").mkdir(parents=True)
    (gpu / "log.txt").write_text("gpu_bench.sh mode=run git abc1234\n")
    run = {"full": {"eager": {"ms_per_step": 20.0},
                    "captured": {"ms_per_step": 20.0, "captured_steps": 0}},
           "keyformer": {"eager": {"ms_per_step": 40.0},
                         "captured": {"ms_per_step": 10.0, "captured_steps": 9}}}
    (gpu / "latency" / "gpu_bench.json").write_text(json.dumps({
        "meta": {"device_name": "GPU0", "dtype": "torch.bfloat16", "budget": 0.5},
        "cells": [{"kind": "graphs", "model": "m", "runs": run}]}))
    speed(tmp_path)
    out = capsys.readouterr().out
    assert "Keyformer decodes 2.0-3.0x" in out and "H2O 4.0x" in out and "batch 4-4; evicting: 32-64" in out
    assert "m 0.50x eager, 2.00x captured" in out and "no captured full baseline" in out and "abc1234" in out


def test_methods_section_lists_the_registry(capsys) -> None:
    """The README's methods lines name every registered method and wrapper once, in the registry's order."""
    import re

    from keyformer.core.policies import POLICIES, WRAPPERS

    report.methods(Path("results"))
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    for line, reg in zip(lines, (POLICIES, WRAPPERS), strict=True):
        assert re.findall(r"`([a-z0-9_]+)` \(", line) == sorted(reg)
