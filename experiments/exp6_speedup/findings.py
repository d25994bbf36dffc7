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
