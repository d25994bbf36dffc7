"""As-run record: backfill the provenance columns of the points.csv files committed before
``keyformer-collect`` wrote them (issue 24). Run once, from the repository root, on 2026-12-01:

    python experiments/backfill_provenance.py

The run folders (their ``metrics.json`` holds ``code_version``, ``git_commit``, ``device`` and ``dtype``) are
git-ignored and gone, so every value here comes from a committed record, named in the row's ``provenance``
column as ``backfilled:<source>; <source>``. ``batch_size`` was always collected from the run's config and is
kept. ``code_version`` is known for no backfilled row and stays empty. ``git_commit`` (the code a point ran
on) is filled only where a committed note names it; elsewhere it stays empty, and ``committed_in`` gives the
commit that first committed the row's current numbers (a fact of the git history: the code that ran the point
is that commit's parent or older, possibly with uncommitted edits). Rows that already have ``provenance`` are
not touched.
"""

from __future__ import annotations

import io
import re
import subprocess
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "results"
CPU_NOTE = "results/README.md (CPU machine, SmolLM2 fp32)"
GPU_LOG = "results/gpu_studies/points.txt (finished on the H200, device=cuda dtype=float32)"
COLS = ["code_version", "git_commit", "device", "dtype", "batch_size", "provenance", "committed_in"]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def _full(short: str) -> str:
    return _git("rev-parse", short).strip()


def h200_points() -> set[str]:
    """``<sweep>/<point>`` of every point that finished on the H200 (the run's own log)."""
    text = (RES / "gpu_studies" / "points.txt").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"multirun/(\S+): finished in", text)}


def committed_in(rel: str, df: pd.DataFrame) -> dict[str, str]:
    """Per point: the oldest commit from which its row's numbers (n_done, complete, rouge2) are unchanged."""
    commits = _git("log", "--format=%H", "--follow", "--", rel).split()  # newest first
    key = {r["point"]: (int(r["n_done"]), bool(r["complete"]), round(float(r["rouge2"]), 6))
           for _, r in df.iterrows()}
    found: dict[str, str] = {}
    active = set(key)
    paths = _git("log", "--format=", "--name-only", "--follow", "--", rel).split()
    for commit, path in zip(commits, paths, strict=False):
        try:
            old = pd.read_csv(io.StringIO(_git("show", f"{commit}:{path}")))
        except subprocess.CalledProcessError:
            break
        rows = {r["point"]: (int(r["n_done"]), bool(r["complete"]), round(float(r["rouge2"]), 6))
                for _, r in old.iterrows()}
        for p in sorted(active):
            if rows.get(p) == key[p]:
                found[p] = commit
            else:
                active.discard(p)
        if not active:
            break
    return found


def rule(folder: str, point: str, gpu: set[str]) -> dict[str, str]:
    """device, dtype, git_commit and their sources for one point of one (pre-archive) results folder."""
    if folder.startswith("exp7_field/"):
        if f"{folder}/{point}" in gpu:
            return {"device": "cuda", "dtype": "float32", "src": GPU_LOG}
        return {"device": "cpu", "dtype": "float32",
                "src": "experiments/exp7_field/README.md (the CPU ran the points the H200 did not finish); "
                + CPU_NOTE}
    if folder == "exp8_authors":
        return {"device": "cuda", "dtype": "float32",
                "src": "results/README.md + experiments/exp8_powered/README.md "
                       "(all ten points on the H200, fp32); "
                + (
                    GPU_LOG if f"exp8_authors_h200/{point}" in gpu else
                    "results/gpu_studies/points.txt (ran out of GPU memory after 64 articles)")}
    out = {"device": "cpu", "dtype": "float32", "src": CPU_NOTE}
    if folder == "exp8_authors_raw":
        out["src"] = "results/README.md (exp8_authors_raw: CPU, before the fix)"
    if folder == "exp1_cnndm" and point in ("policy=full", "budget=0.2,policy=window",
                                            "budget=0.3,policy=window",
                                             "budget=0.5,policy=window", "budget=0.8,policy=window",
                                             "budget=0.9,policy=window"):
        out.update(git_commit=_full("7e9326a"), src=out["src"] + "; results/README.md (full and window kept "
                                                                 "from "
                   "the session at core 7e9326a)")
    if folder == "exp1_cnndm_7e9326a":
        out.update(git_commit=_full("7e9326a"), src=out["src"] + "; results/README.md (core 7e9326a)")
    core8 = point.split(",")[-1] in ("h2o", "keyformer_s0", "keyformer_s1")
    if (folder == "exp8_powered" and point.endswith(",h2o")) or (folder == "exp8_powered_buggy" and core8):
        out.update(git_commit=_full("798b976"), src=out["src"] + "; experiments/exp8_powered/README.md "
                   "(the 9 core "
                   "points ran from a worktree at 798b976; H2O kept after the fix)")
    return out


def backfill(folder: str, gpu: set[str]) -> int:
    """Fill the provenance columns of results/<folder>/points.csv in place; returns the rows filled."""
    path = RES / folder / "points.csv"
    df = pd.read_csv(path)
    for c in COLS:
        if c not in df:
            df[c] = pd.Series([None] * len(df), dtype=object)
        elif c != "batch_size":
            df[c] = df[c].astype(object)
    todo = df["provenance"].isna()
    if not todo.any():
        return 0
    commits = committed_in(str(path.relative_to(ROOT)), df)
    for i in df.index[todo]:
        r = rule(folder, df.at[i, "point"], gpu)
        df.at[i, "device"], df.at[i, "dtype"] = r["device"], r["dtype"]
        df.at[i, "git_commit"] = r.get("git_commit")
        df.at[i, "provenance"] = "backfilled:" + r["src"]
        df.at[i, "committed_in"] = commits.get(df.at[i, "point"]) or None
    df.to_csv(path, index=False)
    return int(todo.sum())


def backfill_fewshot() -> int:
    """results/fewshot/fewshot.csv (lm-eval runs; dtype, batch_size and git_commit were always collected):
    ``device`` from each run's configured device in fewshot.json (an explicit ``cpu``, so what ran),
    ``code_version`` unknown (empty)."""
    import json

    path = RES / "fewshot" / "fewshot.csv"
    df = pd.read_csv(path)
    if "provenance" in df and df["provenance"].notna().all():
        return 0
    runs = {r["run"]: r["config"] for r in json.loads((RES / "fewshot" / "fewshot.json").read_text())}
    dev = {k: c.get("device") for k, c in runs.items()}
    assert all(v in ("cpu", "cuda") for v in dev.values()), dev  # never 'auto': then it would be unknown
    df["device"] = df["run"].map(dev)
    df["code_version"] = None
    df["provenance"] = "backfilled:results/fewshot/fewshot.json (config.device)"
    cols = [c for c in df.columns if c != "run"] + ["run"]
    df[cols].to_csv(path, index=False)
    return len(df)


def main() -> None:
    gpu = h200_points()
    for path in sorted(RES.glob("**/points.csv")):
        folder = str(path.parent.relative_to(RES))
        print(f"{folder}: {backfill(folder, gpu)} rows backfilled")
    print(f"fewshot: {backfill_fewshot()} rows backfilled")


if __name__ == "__main__":
    main()
