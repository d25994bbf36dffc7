"""Steady decode steps at batch 64 over a 256-token cache: ms/step and top aten ops per policy.

``python prof.py BATCH PROMPT_LEN BUDGET STEPS POLICIES`` (e.g. ``64 272 256 4 window,h2o,keyformer``).
"""

import copy
import sys
import time

import torch

from keyformer.core.generate import make_cache
from keyformer.core.policies import make_policy
from keyformer.lab.bench.cpu import load_bench_model, make_prompts


def step(model, tok, cache):
    out = model(input_ids=tok, cache=cache, logits_to_keep=1)
    return out.logits[:, -1].argmax(-1, keepdim=True)


def main() -> None:
    B, L, K, STEPS = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    pols = sys.argv[5].split(",")
    model, _ = load_bench_model({"model_name": "smollm2", "dtype": "float32", "prompt": "random"})
    ids = make_prompts(None, model.config.vocab_size, L, B, 0)
    res: dict[str, list[float]] = {}
    with torch.inference_mode():
        snaps = {}
        for p in pols:
            mask = torch.ones_like(ids)
            cache = make_cache(model, make_policy(p, budget=K), mask, max_new_tokens=64, seed=0)
            t0 = time.perf_counter()
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, logits_to_keep=1)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(2):  # into the steady state
                tok = step(model, tok, cache)
            snaps[p] = (cache, tok)
            print(p, "prefill", round(time.perf_counter() - t0, 1), flush=True)
        for rnd in range(2):
            for p in pols:
                cache, tok = copy.deepcopy(snaps[p][0]), snaps[p][1]
                t0 = time.perf_counter()
                for _ in range(STEPS):
                    tok = step(model, tok, cache)
                res.setdefault(p, []).append(1000 * (time.perf_counter() - t0) / STEPS)
                print(p, "round", rnd, round(res[p][-1], 1), "ms/step", flush=True)
        from torch.profiler import ProfilerActivity, profile

        for p in pols:
            cache, tok = copy.deepcopy(snaps[p][0]), snaps[p][1]
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    tok = step(model, tok, cache)
            print("==", p)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))


if __name__ == "__main__":
    main()
