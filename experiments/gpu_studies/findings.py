"""The GPU studies' report section: the latest prepared GPU run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from keyformer.lab.report import _f2, _pct


def gpu_runs(res: Path, name: str = "bench/gpu") -> list[Path]:
    """The dated GPU runs of ``scripts/gpu_bench.sh`` (``results/bench/gpu/<date>/``), oldest first."""
    return sorted(d for d in (res / name).glob("20*") if (d / "log.txt").is_file())


def bench_gpu(res: Path, name: str = "bench/gpu") -> None:
    """The latest prepared GPU run (``scripts/gpu_bench.sh``): batch-1 decode at 4k, eager vs CUDA-graph
    captured, and long generation at a fixed KV memory budget (``gpu_long.py``: the run's own
    section, then any extra calls in subfolders), with issue 23's two GPU targets per row."""
    runs = gpu_runs(res, name)
    if not runs:
        return
    d = runs[-1]
    head = (d / "log.txt").read_text(encoding="utf-8").splitlines()
    lat = json.loads((d / "latency" / "gpu_bench.json").read_text(encoding="utf-8"))
    m = lat["meta"]
    print(f"\n### {name}/{d.name}: {m['device_name']}, {m['dtype']}, torch {m['torch']}, transformers "
          f"{m['transformers']}; random weights and prompt ids ({head[0].split(' git ')[0]})\n")
    print("Batch-1 decode, ms/step (prompt + new tokens; `generate`: the latency cell, eager; then the same "
          "prompt decoded step by step, eager and with the steady step captured as a CUDA graph):\n")
    print("| model | setting | config | `generate` | eager | captured | same tokens | vs full (captured / "
          "full's fastest eager) | GPU target |")
    print("|---|---|---|---|---|---|---|---|---|")
    cells = lat["cells"]
    for g in (c for c in cells if c.get("kind") == "graphs"):
        latc = next(c for c in cells if c.get("kind") == "latency" and c["model"] == g["model"]
                    and c["L"] == g["L"])
        full = g["runs"]["full"]
        best_full = min(latc["runs"]["full"]["decode_ms_per_step"], full["eager"]["ms_per_step"],
                        full["captured"]["ms_per_step"])  # full never captures: three eager readings
        for p, r in g["runs"].items():
            cap = r["captured"]["captured_steps"] > 0
            ratio = best_full / (r["captured"] if cap else r["eager"])["ms_per_step"]
            target = "-" if p != "keyformer" else ("met" if ratio >= 1.0 else "not met")
            cfg = p if p == "full" else f"{p}@{m['budget']:g}"
            vs = "-" if p == "full" else f"{ratio:.2f}x"
            print(f"| {g['model']} | {g['L']}+{g['gen']} | {cfg} | "
                  f"{latc['runs'][p]['decode_ms_per_step']:.2f} | {r['eager']['ms_per_step']:.2f} | "
                  f"{r['captured']['ms_per_step']:.2f}{'' if cap else ' (eager)'} | {r['same_tokens']} | "
                  f"{vs} | {target} |")
    print("\nGPU target (issue 23), batch 1: Keyformer@0.5's decode >= 1.0x full's at 4k. Full keeps every "
          "token, so its attended length grows each step and it is never captured.\n")
    static_full_table(d / "static")
    fixed = [d / "fixed"] + sorted(x for x in d.iterdir()
                                   if (x / "gpu_long.json").is_file() and x.name != "fixed")
    print("Long generation at a fixed KV memory budget (full's K/V at batch 4), decode tok/s (median of the "
          "rounds) and gains vs full:\n")
    print("| call | setting | config | mode | batch | decode tok/s [IQR] | gain | bytes model | share | "
          "floor bound | share of bound | e2e gain | peak GPU GiB | rounds | vs captured full | GPU target |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for f in fixed:
        rep = json.loads((f / "gpu_long.json").read_text(encoding="utf-8"))
        for sec in rep["settings"]:
            st = sec.get("static_full")
            if st:
                t = st["decode_tok_s"]
                print(f"| {f.name} | {sec['setting']} | full, static cache | {st['mode']} | {st['batch']} | "
                      f"{t['median']:.1f} [{t['q1']:.1f}, {t['q3']:.1f}] |" + " - |" * 6
                      + f" {(st.get('peak_gpu_mib') or 0) / 1024:.1f} | {t['n']} | 1.00x | - |")
            for row in sec["rows"]:
                t = row["decode_tok_s"]
                cfg = row["policy"] + (f"@{row['budget']:g}" if row["budget"] is not None else "")
                target = "-" if row["policy"] == "full" else (
                    "met" if row["share_of_bytes_model"] >= 0.9 else "not met")
                vs = row.get("gain_vs_captured_full")
                vs = "-" if vs is None else f"{vs:.2f}x"
                print(f"| {f.name} | {row['setting']} | {cfg} | {row['mode']} | {row['batch']} | "
                      f"{t['median']:.1f} [{t['q1']:.1f}, {t['q3']:.1f}] | {_f2(row.get('decode_gain'))}x | "
                      f"{_f2(row.get('bytes_model_gain'))}x | {_pct(row.get('share_of_bytes_model'))} | "
                      f"{_f2(row.get('bound_gain'))}x | {_pct(row.get('share_of_bound'))} | "
                      f"{_f2(row.get('e2e_gain'))}x | {(row.get('peak_gpu_mib') or 0) / 1024:.1f} | "
                      f"{t['n']} | {vs} | {target} |")
            if sec["skipped"]:
                print(f"| {f.name} | {sec['setting']} | not run (time budget): {', '.join(sec['skipped'])} |"
                      + " |" * 13)
        bw = rep["bandwidth"]["read_gbs"]
        mem = rep["settings"][0]["memory_budget_bytes"] / 2**20 if rep["settings"] else float("nan")
        print(f"| {f.name} | read {bw:.0f} GB/s, K/V budget {mem:.0f} MiB, weights "
              f"{rep['weight_bytes'] / 2**30:.1f} GiB |" + " |" * 14)
    print("\nGPU target (issue 23), fixed memory: every policy >= 90 % of the bytes model's equal-memory "
          "gain (share). The bytes model: a step reads the weights once plus every sample's attended K/V at "
          "the measured read bandwidth; the floor bound: each step at least a measured step over an almost "
          "empty cache in the same mode (full: eager over 8 tokens; a captured policy: window@8, captured). "
          "Peak GPU: the most memory allocated during the run (weights included); the budget equalises the "
          "K/V bytes, not the prompt forward's transients at the larger batch.")


def static_full_table(d: Path) -> None:
    """The captured full baseline of a GPU run (``static_full.py``), or a line saying the run
    predates it."""
    f = d / "static_full.json"
    if not f.is_file():
        print("No captured full baseline in this run (it predates `static_full.py`, which "
              "`scripts/gpu_bench.sh` now runs): the `vs full` column compares a captured step with an eager "
              "one, so its gain is the capture's and eviction's together.\n")
        return
    rep = json.loads(f.read_text(encoding="utf-8"))
    print("The captured full baseline: full attention over a preallocated, masked cache (transformers' "
          "`StaticCache`) with its step captured too, against our full (eager) and each policy (captured "
          "where it can be), interleaved rounds in one process; ms/step median [IQR]:\n")
    print("| model | setting | config | mode | ms/step [IQR] | rounds | vs captured full | "
          "same tokens as full | GPU target |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in rep["cells"]:
        if "runs" not in c:
            print(f"| {c['model']} | not run ({c['skipped']}) |" + " |" * 7)
            continue
        for name, r in c["runs"].items():
            m = r["ms_per_step"]
            cfg = name if name == "full" or name.startswith("static_full") else f"{name}@{c['budget']:g}"
            target = "-" if name != "keyformer" else (
                "met" if r["speed_vs_captured_full"] >= 1.0 else "not met")
            print(f"| {c['model']} | {c['L']}+{c['gen']} | {cfg} | "
                  f"{'captured' if r['captured_steps'] else 'eager'} | {m['median']:.2f} [{m['q1']:.2f}, "
                  f"{m['q3']:.2f}] | {m['n']} | {r['speed_vs_captured_full']:.2f}x | "
                  f"{r['same_tokens_as_full']} | {target} |")
    print("\nHere the batch-1 GPU target is judged against the captured full: Keyformer's step is the "
          "capture plus eviction, the baseline's the capture alone.\n")


# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'bench_gpu': bench_gpu,
}
