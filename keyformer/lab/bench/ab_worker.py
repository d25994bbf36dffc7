"""One A/B measurement in a fresh process: ``python ab_worker.py JSON_ARGS`` prints one JSON line.

Run by :mod:`keyformer.lab.bench.ab` with ``PYTHONPATH`` set to the tree under test; the harness file itself
is copied out of the candidate tree so that both commits are timed by the same code. It uses only the CPU
benchmark's long-standing helpers (:mod:`keyformer.lab.bench.cpu`: model loading, prompts, ``prefill`` and
``decode``), so it runs against older commits too.

Per process: load the model, warm every configuration up on a short prompt, then for each configuration
(``full`` first and last, each policy at the budget in between; with ``rotate``, the policies' order rotated
by ``round`` places, so each policy takes each place after ``full`` in turn) one timed prompt forward and
``decode_rounds`` (default 1) timed greedy decodes of ``new_tokens`` steps from it (their median is
reported). With ``rows`` > ``batch`` the decode runs at ``rows`` rows: the prompt forward's cache is copied
row-wise (``select_rows``, each sample ``rows / batch`` times) after the timed prompt, so a large decode
batch costs a small prompt forward (the decode step's work does not depend on which rows repeat).
Reported per configuration: ``prefill_s``, ``decode_ms`` (per step),
and the within-process ratios ``prefill_vs_full`` (over the mean of the two full prefills) and
``decode_vs_window`` (over the window policy's decode, when it is in the list).
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> None:
    args = json.loads(argv[0])
    import torch

    import keyformer
    from keyformer.lab.bench.cpu import Config, decode, load_bench_model, make_prompts, prefill, prompt_tokens

    tree = os.path.realpath(args["tree"])
    if not os.path.realpath(keyformer.__file__).startswith(tree + os.sep):
        raise SystemExit(f"keyformer imported from {keyformer.__file__}, not from the tree under test {tree}")
    if args.get("threads"):
        torch.set_num_threads(int(args["threads"]))
    torch.manual_seed(int(args["seed"]))
    cfg = {"model_name": args["model"], "dtype": args["dtype"], "prompt": args["prompt"],
           "data_dir": args.get("data_dir")}
    t0 = time.perf_counter()
    model, tok = load_bench_model(cfg)
    L, B = int(args["prompt_len"]), int(args["batch"])
    n_new, seed = int(args["new_tokens"]), int(args["seed"])
    text_ids = prompt_tokens(cfg, tok, L * B)
    ids = make_prompts(text_ids, model.config.vocab_size, L, B, seed)
    budget = float(args["budget"])
    policies = list(args["policies"])
    if args.get("rotate") and policies:
        r = int(args.get("round") or 0) % len(policies)
        policies = policies[r:] + policies[:r]
    confs = [Config("full"), *[Config(p, budget) for p in policies], Config("full")]
    rows, rounds = int(args.get("rows") or B), int(args.get("decode_rounds") or 1)
    if rows % B:
        raise SystemExit(f"rows={rows} must be a multiple of batch={B}")

    def widen(snap):  # the decode batch: each sample's cache row rows // B times
        if rows != B:
            idx = torch.arange(B).repeat_interleave(rows // B)
            snap.cache.select_rows(idx)
            snap.first_token = snap.first_token.index_select(0, idx)
        return snap

    out: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        warm = make_prompts(text_ids, model.config.vocab_size, int(args["warmup_len"]), 1, seed)
        for c in confs[:-1]:
            snap, _ = prefill(model, warm, c, 2, seed)
            decode(model, snap, 2)
        fulls = []
        for c in confs:
            snap, sec = prefill(model, ids, c, n_new, seed)
            snap = widen(snap)
            decs = sorted(decode(model, snap, n_new) for _ in range(rounds))
            dec = decs[len(decs) // 2]
            del snap
            if c.policy == "full":
                fulls.append((sec, dec))
                continue
            out[c.policy] = {"prefill_s": sec, "decode_ms": 1000 * dec / n_new}
        full_pre = sum(s for s, _ in fulls) / len(fulls)
        full_dec = sum(d for _, d in fulls) / len(fulls)
        out["full"] = {"prefill_s": full_pre, "decode_ms": 1000 * full_dec / n_new}
    for m in out.values():
        m["prefill_vs_full"] = m["prefill_s"] / full_pre
        if "window" in out:
            m["decode_vs_window"] = m["decode_ms"] / out["window"]["decode_ms"]
    print(json.dumps({"metrics": out, "seconds": time.perf_counter() - t0, "loadavg": list(os.getloadavg()),
                      "keyformer": keyformer.__file__}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
