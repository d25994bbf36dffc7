"""KVzip's extra cost: prefill seconds (prompt forward + KVzip's reconstruction forward, as ``generate``
reports them in ``prefill_s``) of full, SnapKV and KVzip at one prompt length; median of ``--repeats`` runs.

    .venv/bin/python scripts/kvzip_cost.py                 # SmolLM2-135M (converted by the runner), n = 512
    .venv/bin/python scripts/kvzip_cost.py --tiny --n 256  # tiny random Llama, seconds
"""

from __future__ import annotations

import argparse
import statistics

import torch

from keyformer import generate, make_policy, prepare_model, tiny_model


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=512, help="prompt tokens")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--tiny", action="store_true", help="a tiny random Llama instead of SmolLM2")
    ap.add_argument("--model-dir", default=None, help="converted SmolLM2 (default: the runner's)")
    args = ap.parse_args(argv)
    if args.tiny:
        model = tiny_model("llama")
    else:
        from transformers import AutoModelForCausalLM

        from keyformer.lab.bench.kvpress_compare import default_model_dir

        model = prepare_model(AutoModelForCausalLM.from_pretrained(
            args.model_dir or default_model_dir(), dtype=torch.float32, attn_implementation="sdpa").eval())
    ids = torch.randint(3, model.config.vocab_size, (1, args.n), generator=torch.Generator().manual_seed(0))
    repeat = [13, 13, 2]  # a 3-token instruction stand-in
    rows = []
    for name, kw in (("full", {}), ("snapkv", {"budget": args.budget}),
                     ("kvzip", {"budget": args.budget, "repeat_ids": repeat})):
        pol = make_policy(name, **kw)
        times = [generate(model, ids, None, pol, max_new_tokens=1).prefill_s for _ in range(args.repeats)]
        rows.append((name, statistics.median(times)))
    base = rows[0][1]
    print(f"prompt {args.n} tokens, {'tiny llama' if args.tiny else 'SmolLM2-135M'} fp32, "
          f"{torch.get_num_threads()} thread(s), median of {args.repeats}")
    for name, t in rows:
        print(f"{name:8s} prefill {t * 1000:9.1f} ms  {t / base:5.2f}x full")


if __name__ == "__main__":
    main()
