"""Why a prompt-only policy loses going query-agnostic: which keys it keeps, or how the question is read.

Experiment 10's two settings differ in two ways for a policy that cuts the prompt once (KVzip):

1. **the kept set**: question-aware, the cut scores the context and the question together; query-agnostic,
   the context alone;
2. **the question's reading**: question-aware, the question's keys and values (and those of the answer prefix)
   come from the prompt forward, before the cut, over the whole context; query-agnostic, the question is read
   after the cut, over the kept keys only.

This script crosses them, per record, in two more runs (a :func:`fixed_keep` copy of the policy cuts to
exactly the context positions it is given, per layer and KV head, and keeps every question position; the
script checks that the kept context sets are those given):

* ``agnostic_cut``: the question-aware prompt forward (the question read over the whole context), then the
  query-agnostic cut's context positions;
* ``aware_cut``: the query-agnostic reading (the context cut alone, then the question read over what is kept),
  with the question-aware cut's context positions. The question's tokens are all held, as the query-agnostic
  reading holds them; the question-aware cut may drop some (``question_held``: the share of (cut layer, KV
  head, question position) it holds; 1 in the other modes).

If the answers follow the kept set (``agnostic_cut`` answers as ``agnostic`` does, ``aware_cut`` as
``aware``), the loss is which keys the cut keeps; if they follow the reading, it is how the question is
read. One row per (task, record, mode) with the mode's answer and its RULER score; ``--reproduce`` also writes
the question-aware and query-agnostic answers of its tasks (the committed ones are in the experiment's
``samples.csv``; a test compares them).

    python -m experiments.exp10_ruler.ruler_question_reading \
        results/exp10_ruler_gemma/question_reading.csv \
        --experiment exp10_ruler_gemma --tasks cwe,niah_multivalue --reproduce cwe

Needs ``KEYFORMER_DATA_DIR`` for the essay tasks. The CSV's first line (``#``) gives the commit, model,
device, dtype and batch.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from experiments.exp10_ruler.ruler_kept_depth import code_at, held, point_overrides


def fixed_keep(base, kept: dict, n_layers: int, n_ctx: int, n_q: int):
    """A copy of the KVzip policy ``base`` whose prompt cut keeps, in every layer of ``kept`` (layer ->
    [H, n_ctx] 0/1, the context positions each KV head holds), exactly those context positions and all ``n_q``
    question positions after them (a layer not in ``kept`` is one the policy does not cut). Its scores are 1
    at a kept context position, 2 at a question position and 0 elsewhere, and its head budgets (KVzip's
    head-adaptive cut) are each head's kept count plus ``n_q``, whatever their total."""
    import dataclasses

    import torch

    from keyformer.core.policies.kvzip import KVzipPolicy

    class FixedKeep(KVzipPolicy):
        def prepare(self, model, prompt=None):
            return {"scores": scores}

        def head_budgets(self, prio, keep_n, ctx):
            return counts[ctx.layer].to(keep_n) if ctx.layer in counts else keep_n

    H = next(iter(kept.values())).shape[0]
    counts = {li: (k.sum(1).long() + n_q).view(1, H) for li, k in kept.items()}  # [1, H] per cut layer
    scores = []
    for li in range(n_layers):
        s = torch.zeros(1, H, n_ctx + n_q)
        if li in kept:
            s[0, :, :n_ctx] = kept[li]
        s[0, :, n_ctx:] = 2.0
        scores.append(s)
    pol = FixedKeep(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init})
    pol.budget = int(max(int(c.max()) for c in counts.values()))  # the cut runs; head_budgets sets the counts
    return pol


def record_rows(model, tok, cfg, rec, cut_layers: list[int], reproduce: bool) -> list[list]:
    """The rows of one record: [mode, context tokens, question tokens, kept_equal, question_held, score,
    answer] for
    ``aware`` and ``agnostic`` (with ``reproduce``), ``agnostic_cut`` and ``aware_cut``."""
    import torch

    from keyformer.core.generate import generate, generate_from_context
    from keyformer.core.noise import sample_seed
    from keyformer.core.policies import build_policy
    from keyformer.run.metrics import score
    from keyformer.run.tasks.generate import (
        _generated,
        _postprocess,
        prompt_limit,
        record_queries,
        split_question,
    )

    ds, gen = cfg["dataset"], cfg["generation"]
    n_new, stops = int(gen["max_new_tokens"]), gen.get("stop") or []
    chat = bool(cfg["model"].get("chat_template")) and getattr(tok, "chat_template", None) is not None
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    queries = record_queries(rec)
    if len(queries) != 1:
        raise SystemExit(f"record {rec['id']} asks {len(queries)} questions; valid: tasks with one question")
    q = queries[0]
    ctx, question, cut = split_question(tok, q, ds.get("template", "alpaca"), ds.get("instruction", ""),
                                        prompt_limit(cfg, model), chat, str(ds.get("truncation", "end")))
    assert cut == 0, "the experiment never cuts a prompt"
    n, n_q = len(ctx), len(question)
    kv = dict(seed=sample_seed(int(cfg["seed"]), rec["id"]), eos_token_id=tok.eos_token_id)
    rows = []

    def add(mode: str, tokens: list[int], equal: str = "", q_held: float = 1.0) -> None:
        ids = _generated(tokens, tok.eos_token_id, pad_id)
        text = _postprocess(tok.decode(ids, skip_special_tokens=True), stops)
        sm = score(text, q, tuple(ds.get("metrics") or ()))["string_match_all"]
        rows.append([mode, n, n_q, equal, f"{q_held:.4f}", f"{sm:.1f}", text])
        print(f"{rec['id']} {mode}: {sm:.1f} {text[:60]!r}", file=sys.stderr)

    def kept_by(cache, upto: int) -> dict:
        return {li: held(cache.layers[li].pos[0], upto) for li in cut_layers}

    both, alone = torch.tensor([ctx + question]), torch.tensor([ctx])
    ones, layers = torch.ones_like, model.config.get_text_config(decoder=True).num_hidden_layers
    with torch.inference_mode():
        out = generate(model, both, ones(both), build_policy(cfg["policy"]), max_new_tokens=n_new if reproduce
                       else 1, seeds=[kv["seed"]], pad_token_id=pad_id, **kv)
        aware_kept = kept_by(out.cache, n)
        q_held = torch.stack([k[:, n:] for k in kept_by(out.cache, n + n_q).values()]).mean().item()
        if reproduce:
            add("aware", out.sequences[0].tolist(), q_held=q_held)
            _, outs = generate_from_context(model, alone, [question], build_policy(cfg["policy"]),
                                            max_new_tokens=n_new, **kv)
            add("agnostic", outs[0].tokens)
        out = generate(model, alone, ones(alone), build_policy(cfg["policy"]), max_new_tokens=1, **kv)
        agnostic_kept = kept_by(out.cache, n)
        pol = fixed_keep(build_policy(cfg["policy"]), agnostic_kept, layers, n, n_q)
        out = generate(model, both, ones(both), pol, max_new_tokens=n_new, seeds=[kv["seed"]],
                       pad_token_id=pad_id, **kv)
        equal = all(torch.equal(got, agnostic_kept[li]) for li, got in kept_by(out.cache, n).items())
        got_q = torch.stack([k[:, n:] for k in kept_by(out.cache, n + n_q).values()]).mean().item()
        add("agnostic_cut", out.sequences[0].tolist(), str(equal), got_q)
        pol = fixed_keep(build_policy(cfg["policy"]), aware_kept, layers, n, 0)
        out = generate(model, alone, ones(alone), pol, max_new_tokens=1, **kv)  # the check of the cut alone
        equal = all(torch.equal(got, aware_kept[li]) for li, got in kept_by(out.cache, n).items())
        _, outs = generate_from_context(model, alone, [question], pol, max_new_tokens=n_new, **kv)
        add("aware_cut", outs[0].tokens, str(equal))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--n", type=int, default=5, help="records of each task (the experiment's first n)")
    ap.add_argument("--experiment", default="exp10_ruler_gemma", choices=("exp10_ruler", "exp10_ruler_gemma"))
    ap.add_argument("--tasks", default="cwe", help="comma-separated RULER tasks with one question a record")
    ap.add_argument("--reproduce", default="",
                    help="comma-separated tasks (of --tasks) whose question-aware and query-agnostic "
                         "answers are rerun too")
    args = ap.parse_args(argv)

    import torch

    from keyformer.core.models import layer_windows
    from keyformer.run.data import load_records
    from keyformer.run.loading import load_model
    from keyformer.run.paths import compose

    torch.set_num_threads(1)
    tasks = args.tasks.split(",")
    cfgs = {t: compose([*point_overrides(args.experiment, t, args.n), "policy=kvzip",
                        f"budget={args.budget}"]) for t in tasks}
    model, tok = load_model(cfgs[tasks[0]])
    cut_layers = [i for i, win in enumerate(layer_windows(model.config)) if win is None]
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        f.write(f"# experiments/exp10_ruler/ruler_question_reading.py at {code_at()}; "
                f"{cfgs[tasks[0]]['model']['name']}, cpu, {dtype}, batch 1, 1 thread; RULER 4k, kvzip at "
                f"budget {args.budget}; cut layers {cut_layers}\n")
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["task", "record", "mode", "context_tokens", "question_tokens", "kept_equal",
                    "question_held", "string_match_all", "prediction"])
        for t, cfg in cfgs.items():
            for rec in load_records(cfg["dataset"], args.n, int(cfg["seed"]), cfg["model"])[: args.n]:
                for r in record_rows(model, tok, cfg, rec, cut_layers, t in args.reproduce.split(",")):
                    w.writerow([t, rec["id"], *r])
                f.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
