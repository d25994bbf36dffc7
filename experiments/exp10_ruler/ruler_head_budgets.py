"""How each KV head's share of a RULER prompt differs under Ada-KV's adaptive head budgets.

Ada-KV (``adakv_snapkv``, ``adakv_keyformer``) shares a layer's budget ``H * k`` among its ``H`` KV heads by
score, where SnapKV and Keyformer give every head ``k``. This script runs the prompt cut (one greedy step
through ``keyformer.core.generate``, as ``ruler_kept_depth.py`` does) on an experiment-10 task's first
records and writes one row per (policy, record, layer, KV head):

* ``kept``: how many prompt positions the head holds;
* ``needle_kept``: the share of the needle value's tokens it holds.

    python -m experiments.exp10_ruler.ruler_head_budgets \
        results/exp10_ruler/head_budgets_niah_single_2.csv \
        [--task niah_single_2] [--budget 0.5] [--n 5]

The CSV's first line (``#``) gives the commit, model, device, dtype and batch.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from experiments.exp10_ruler.ruler_kept_depth import code_at, held, load_point, point_overrides, prompt_cut

POLICIES = ("snapkv", "adakv_snapkv", "keyformer", "adakv_keyformer")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--n", type=int, default=5, help="records of the task (the experiment's first n)")
    ap.add_argument("--task", default="niah_single_2", help="a RULER task with one needle value")
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args(argv)

    import torch

    from keyformer.run.paths import compose

    torch.set_num_threads(1)
    base = point_overrides("exp10_ruler", args.task, args.n)
    cfg, model, tok, records, chat, limit = load_point("exp10_ruler", args.task, args.n)
    ds = cfg["dataset"]
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        f.write(f"# experiments/exp10_ruler/ruler_head_budgets.py at {code_at()}; "
                f"{cfg['model']['name']}, cpu, {dtype}, "
                f"batch 1, 1 thread; RULER {args.task} 4k, budget {args.budget}, the prompt cut after one "
                "greedy step\n")
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["policy", "record", "layer", "head", "prompt_tokens", "kept", "needle_kept"])
        for name in args.policies.split(","):
            pcfg = compose([*base, f"policy={name}", f"budget={args.budget}"])
            for rec in records:
                ids, lo, hi, out = prompt_cut(model, tok, rec, ds, limit, chat, pcfg)
                n = len(ids)
                for li, layer in enumerate(out.cache.layers):
                    kept = held(layer.pos[0], n)  # [H, n]
                    for h in range(kept.shape[0]):
                        w.writerow([name, rec["id"], li, h, n, int(kept[h].sum()),
                                    f"{kept[h, lo:hi].mean():.4f}"])
                f.flush()
                print(f"{name} {rec['id']} done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
