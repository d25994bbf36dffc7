"""Experiment 10's top-up at ratio 0.5 on SmolLM2: the power calculation and its resumable queue.

    python experiments/exp10_ruler/topup.py          # prints the calculation, writes queues/exp10_topup.txt
    STEP=5 bash scripts/run_points.sh experiments/exp10_ruler/queues/exp10_topup.txt
    keyformer-collect multirun/exp10_ruler/topup/aware results/exp10_ruler/topup/aware   # and .../agnostic

Reads the committed ``results/exp10_ruler/findings.json``. A policy is topped up, in a setting, when its
verdict against Keyformer at ratio 0.5 is inconclusive and the records per task that would detect its observed
difference at 80 % power (``records_needed``, at the level Holm tested it) are at most :data:`MAX_RECORDS`:
beyond that even the cap leaves it underpowered. Keyformer runs the same records (the pairing needs them).
Every topped-up point runs ``N`` records a task, ``N`` the largest need among the chosen (at most 20: the
records RULER generated per task, ``dataset.n``). A verdict that holds over these records but not with the
tasks as units (``verdict_alt``) is not topped up: more records a task cannot add tasks.

The new points go to their own folders (``n_samples`` is part of a point's config, so the committed 5-record
folders are not resumed); their first 5 records are the committed ones and give the same outputs. The CPU time
is estimated from the committed points' ``wall_s / n_done`` at ratio 0.5 (the median over tasks per policy and
setting), measured on the shared 2-core machine: an estimate, not a benchmark.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd

TASKS = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
         "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe"]
TOKENS = {"vt": 30, "cwe": 120, "fwe": 50}  # RULER's tokens to generate; NIAH 128
MODEL, RATIO, BUDGET, REFERENCE = "exp10_ruler", 0.5, 0.5, "keyformer"
MAX_RECORDS = 20
QUEUE = Path(__file__).with_name("queues") / "exp10_topup.txt"


def plan(doc: dict) -> tuple[dict[str, list[str]], int, list[dict]]:
    """``({setting: policies}, records per task, the findings considered)``."""
    chosen: dict[str, list[str]] = {}
    need, seen = [], []
    for f in doc["findings"]:
        m = f["meta"]
        if m["model"] != MODEL or m["ratio"] != RATIO or "+added" in (f["family"] or ""):
            continue
        seen.append(f)
        n = f.get("records_needed")
        if f["verdict"] == "inconclusive" and n is not None and n <= MAX_RECORDS:
            chosen.setdefault(m["setting"], []).append(f["a"])
            need.append(n)
    return chosen, min(MAX_RECORDS, max(need, default=0)), seen


def line(setting: str, task: str, policy: str, records: int) -> str:
    folder = f"multirun/exp10_ruler/topup/{setting}/task={task},budget={BUDGET},policy={policy}"
    agnostic = " dataset.query_agnostic=true" if setting == "agnostic" else ""
    return (f"{folder} {records} +experiment=exp10_ruler dataset.ruler_task={task} "
            f"generation.max_new_tokens={TOKENS.get(task, 128)}{agnostic} policy={policy} budget={BUDGET} "
            f"n_samples={records}")


def seconds_per_record(res: Path) -> dict[tuple[str, str], float]:
    out = {}
    for setting in ("aware", "agnostic"):
        p = pd.read_csv(res / MODEL / setting / "points.csv")
        p = p[(p["budget"] == BUDGET) & p["wall_s"].notna() & (p["n_done"] > 0)]
        for pol, g in p.groupby("policy"):
            out[(setting, str(pol))] = float((g["wall_s"] / g["n_done"]).median())
    return out


def main(res: Path = Path("results")) -> int:
    doc = json.loads((res / MODEL / "findings.json").read_text(encoding="utf-8"))
    chosen, records, seen = plan(doc)
    rate = seconds_per_record(res)
    print(f"Ratio {RATIO:g}, SmolLM2: records per task each inconclusive policy needs for 80 % power "
          "(observed difference, Holm's level):")
    for f in sorted(seen, key=lambda f: (f["meta"]["setting"], f["a"])):
        n = f.get("records_needed")
        print(f"  {f['meta']['setting']:8} {f['a']:20} {f['verdict']:13} "
              f"{'' if n is None else ('inf' if not math.isfinite(n) else int(n))}")
    lines, cpu = [], 0.0
    for setting, policies in chosen.items():
        for pol in [REFERENCE, *sorted(policies)]:
            for task in TASKS:
                lines.append(line(setting, task, pol, records))
            cpu += len(TASKS) * records * rate.get((setting, pol), max(rate.values()))
    head = (f"# Experiment 10 top-up (experiments/exp10_ruler/topup.py): ratio {RATIO:g}, {records} records "
            f"a task, the inconclusive policies a top-up to {MAX_RECORDS} can resolve, and Keyformer.\n"
            "# RULER 4k on SmolLM2-135M-Instruct; resumable: run with STEP=5; estimated "
            f"{cpu / 3600:.0f} CPU-hours (one thread a point).\n"
            "# Line: <folder> <records> <run.py overrides>\n")
    QUEUE.write_text(head + "\n".join(lines) + "\n", encoding="utf-8")
    print(f"\n{len(lines)} points ({', '.join(f'{s}: {len(p) + 1} policies' for s, p in chosen.items())}), "
          f"{records} records a task: about {cpu / 3600:.0f} CPU-hours; wrote {QUEUE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*(Path(a) for a in sys.argv[1:])))
