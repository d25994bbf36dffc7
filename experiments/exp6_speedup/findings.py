"""Experiment 6's report section: decode speedups from the committed CPU benchmark."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def exp6_speedup(res: Path, name: str = "bench") -> None:
    """Experiment 6 in brief, from the committed benchmark (``bench.json``): each policy's decode speedup over
    full per group and budget (median of the interleaved ratios) and the equal-KV-memory throughput gain."""
    f = res / name / "bench.json"
    if not f.exists():
        return
    r = json.loads(f.read_text(encoding="utf-8"))
    env = r["environment"]
    names = {"window": "window", "h2o": "H2O", "keyformer": "Keyformer"}
    print(f"\nFrom `{name}/bench.json` (git {str(env['git_commit'])[:7]}, {env['cpu']}, {env['threads']} "
          f"threads, fp32; decode speedup = full's ms per token over the policy's, median of "
          f"interleaved ratios):\n")
    groups: dict[str, list[dict]] = {}
    for row in r["rows"]:
        if row["policy"] in names:
            groups.setdefault(row["group"], []).append(row)
    for rows in groups.values():
        by_budget: dict[float, list[str]] = {}
        for row in rows:
            by_budget.setdefault(row["budget"], []).append(f"{names[row['policy']]} {row['speedup']:.2f}x")
        parts = "; ".join(f"{', '.join(v)} at budget {b:g}" for b, v in by_budget.items())
        L, B = rows[0]["prompt_len"], rows[0]["batch"]
        print(f"- **Decode vs full, {L}-token prompt, batch {B}:** {parts}.")
    t = r.get("throughput")
    if t:
        p, fu = t["policy"], t["full"]
        print(f"- **End to end at equal KV memory** ({t['kv_memory_bytes'] / 2**20:.0f} MiB of K/V, "
              f"{t['prompt_len']} + {t['new_tokens']} tokens): {p['label']} fits batch {p['batch']} against "
              f"full's {fu['batch']} and generates {t['e2e_gain']:.2f}x full's tokens per second, prefill "
              f"included ({t['gain']:.2f}x in decode alone).")


# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'exp6_speedup': exp6_speedup,
}


# -- page (keyformer.lab.pages): a benchmark without paired comparisons, so no findings.json ----------------
RESULTS = "exp6_speedup"  # the page's folder; its rows are the benchmark's, results/bench/
TITLE = "6: decode speedup"
QUESTION = ("How much faster than full attention is a decode step under window, H2O and Keyformer on this "
            "CPU, and how does that compare with the paper's GPU speedups?")


def _rounds(row: dict) -> str:
    s = row["speedup_stats"]
    return f"{row['speedup']:.2f}x ({s['min']:.2f}-{s['max']:.2f} over {s['n']} rounds)"


def observations(res: Path, doc: dict | None = None, name: str = "bench") -> str:
    """The page's bullets, from ``bench.json`` and the paper's transcribed speedups."""
    f = res / name / "bench.json"
    if not f.exists():
        return "(no benchmark yet)"
    r = json.loads(f.read_text(encoding="utf-8"))
    target = r["config"].get("targets", {}).get("budget", 0.5)
    paper: dict[tuple[str, int], float] = {}
    if (res / "paper_numbers.csv").exists():
        import pandas as pd

        pn = pd.read_csv(res / "paper_numbers.csv")
        pn = pn[(pn["experiment"] == "exp6") & (pn["metric"] == "speedup")]
        paper = {(m, int(x)): float(v) for m, x, v in zip(pn["method"], pn["x"], pn["value"], strict=True)}
    out, groups = [], []
    for group in dict.fromkeys(row["group"] for row in r["rows"]):
        rows = {row["policy"]: row for row in r["rows"] if row["group"] == group and row["budget"] is not None
                and abs(row["budget"] - target) < 1e-9}
        if not {"keyformer", "h2o"} <= set(rows):
            continue
        k, h = rows["keyformer"], rows["h2o"]
        groups.append((k, h))
        ref = [f"{p} {paper[(p, k['prompt_len'])]:.2f}x" for p in ("keyformer", "h2o")
               if (p, k["prompt_len"]) in paper]
        out.append(f"{k['prompt_len']}-token prompt, batch {k['batch']}, budget {target:g}: Keyformer "
                   f"{_rounds(k)}, H2O {_rounds(h)}" + (f"; the paper at this prompt length: {', '.join(ref)}"
                                                        if ref else "") + ".")
    if groups:
        below = sum(k["speedup"] < h["speedup"] for k, h in groups)
        apart = sum(k["speedup_stats"]["max"] < h["speedup_stats"]["min"] for k, h in groups)
        line = (f"Keyformer's median decode speedup is below H2O's in {below} of {len(groups)} settings, "
                f"with all its rounds below all of H2O's in {apart}")
        prompt = [k["prompt_len"] for k, _ in groups]
        above = [x for x in prompt if ("keyformer", x) in paper and ("h2o", x) in paper
                 and paper[("keyformer", x)] > paper[("h2o", x)]]
        if any(("keyformer", x) in paper for x in prompt):
            line += (f"; the paper has Keyformer above H2O at {len(set(above))} of "
                     f"{len({x for x in prompt if ('keyformer', x) in paper})} of these prompt lengths")
        out.append(line + ".")
    return "\n".join(f"- {b}" for b in out)


def answer_rows(res: Path, name: str = "bench") -> str:
    """Keyformer's decode speedup over full at the target budget, per setting, and the equal-memory gain."""
    f = res / name / "bench.json"
    if not f.exists():
        return ""
    r = json.loads(f.read_text(encoding="utf-8"))
    target = r["config"].get("targets", {}).get("budget", 0.5)
    kf = [row for row in r["rows"] if row["policy"] == "keyformer" and row["budget"] is not None
          and abs(row["budget"] - target) < 1e-9]
    parts = ", ".join(f"{row['speedup']:.2f}x ({row['prompt_len']} tokens, batch {row['batch']})"
                      for row in kf)
    t = r.get("throughput")
    gain = f"; at equal KV memory {t['e2e_gain']:.2f}x full's tokens/s end to end" if t else ""
    return f"On this CPU Keyformer@{target:g} decodes at {parts} full's speed{gain}."


PLACEHOLDERS = {"observations": observations}
