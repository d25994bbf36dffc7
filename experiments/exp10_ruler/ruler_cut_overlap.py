"""How much a policy's prompt cut of a RULER context changes when the question is not in the prompt.

Experiment 10 runs each RULER record twice: question-aware (the prompt is the context and then the question)
and query-agnostic (the context is cut alone, then the question is read). A cut that does not read the
question (KVzip's reconstruction, by its authors' intent) should keep nearly the same context positions in
both; one that reads the prompt's last rows (SnapKV) should not. For each record of ``--task`` and each
policy, this script makes both prompt cuts as the experiment does (``split_question``: the context is the
question-aware prompt's first tokens; the seed is the record's ``sample_seed``; one greedy step each), then,
per cut layer and KV head, compares the context positions ``0 .. n_context-1`` each cut holds. One row per
(policy, record, layer):

* ``kept_aware``, ``kept_agnostic``: context positions held (mean over the KV heads);
* ``jaccard``: |aware & agnostic| / |aware | agnostic| (mean over the KV heads);
* ``aware_in_agnostic``: the share of the question-aware cut's context positions the agnostic cut holds too.

Only layers the policy cuts are written (a hybrid model's sliding layers keep their window in both).

    python -m experiments.exp10_ruler.ruler_cut_overlap results/exp10_ruler_gemma/cut_overlap_cwe.csv \
        --experiment exp10_ruler_gemma --task cwe --budget 0.5 --policies kvzip,snapkv,keyformer

Needs ``KEYFORMER_DATA_DIR`` for the essay tasks. The CSV's first line (``#``) gives the commit, model,
device, dtype and batch.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from experiments.exp10_ruler.ruler_kept_depth import code_at, held, load_point, point_overrides


def overlap(a, b) -> tuple[float, float]:
    """(mean Jaccard, mean share of ``a`` in ``b``) over the rows (KV heads) of two [H, n] 0/1 tensors."""
    inter = (a * b).sum(1)
    union = ((a + b) > 0).float().sum(1)
    return float((inter / union.clamp(min=1)).mean()), float((inter / a.sum(1).clamp(min=1)).mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--n", type=int, default=5, help="records of the task (the experiment's first n)")
    ap.add_argument("--experiment", default="exp10_ruler", choices=("exp10_ruler", "exp10_ruler_gemma"))
    ap.add_argument("--task", default="cwe")
    ap.add_argument("--policies", default="kvzip,snapkv,keyformer")
    args = ap.parse_args(argv)

    import torch

    from keyformer.core.generate import generate
    from keyformer.core.models import layer_windows
    from keyformer.core.noise import sample_seed
    from keyformer.core.policies import build_policy
    from keyformer.run.paths import compose
    from keyformer.run.tasks.generate import record_queries, split_question

    torch.set_num_threads(1)
    base = point_overrides(args.experiment, args.task, args.n)
    cfg, model, tok, records, chat, limit = load_point(args.experiment, args.task, args.n)
    ds = cfg["dataset"]
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    cut_layers = [i for i, w in enumerate(layer_windows(model.config)) if w is None]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        f.write(f"# experiments/exp10_ruler/ruler_cut_overlap.py at {code_at()}; "
                f"{cfg['model']['name']}, cpu, {dtype}, batch 1, 1 thread; RULER {args.task} 4k, budget "
                f"{args.budget}; the prompt cut question-aware (context + question) against query-agnostic "
                f"(context alone), context positions only; cut layers {cut_layers}\n")
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["policy", "record", "layer", "context_tokens", "question_tokens", "kept_aware",
                    "kept_agnostic", "jaccard", "aware_in_agnostic"])
        for name in args.policies.split(","):
            pcfg = compose([*base, f"policy={name}", f"budget={args.budget}"])
            for rec in records:
                tmpl, instr = ds.get("template", "alpaca"), ds.get("instruction", "")
                trunc = ds.get("truncation")
                parts = [split_question(tok, q, tmpl, instr, limit, chat, str(trunc or "end"))
                         for q in record_queries(rec)]
                ctx, question, cut = parts[0]
                assert cut == 0, "the experiment never cuts a prompt"
                seed = sample_seed(int(cfg["seed"]), rec["id"])
                held_by = {}
                for setting, ids in (("aware", ctx + question), ("agnostic", ctx)):
                    x = torch.tensor([ids])
                    with torch.inference_mode():
                        out = generate(model, x, torch.ones_like(x), build_policy(pcfg["policy"]),
                                       max_new_tokens=1, seed=seed, eos_token_id=tok.eos_token_id)
                    held_by[setting] = [held(out.cache.layers[li].pos[0], len(ctx)) for li in cut_layers]
                js = []
                for li, a, b in zip(cut_layers, held_by["aware"], held_by["agnostic"], strict=True):
                    jac, share = overlap(a, b)
                    js.append(jac)
                    w.writerow([name, rec["id"], li, len(ctx), len(question), f"{a.sum(1).mean():.1f}",
                                f"{b.sum(1).mean():.1f}", f"{jac:.4f}", f"{share:.4f}"])
                f.flush()
                print(f"{name} {rec['id']}: Jaccard {sum(js) / len(js):.3f} (mean over cut layers)",
                      file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
