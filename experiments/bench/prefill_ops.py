"""Profiler op list of one policy's prompt forward (default window) right after full's, as in the A/B
worker (SmolLM2 fp32, CNN/DailyMail prompts from ``$KEYFORMER_DATA_DIR``, budget 0.5), from the keyformer tree
on ``PYTHONPATH``: the 25 ops with the most self CPU time, then every op's count as JSON (the line starting
``ALL``), to diff between commits.

    PYTHONPATH=/tmp/tree_at_rev python experiments/bench/prefill_ops.py 2048 4 2 [policy]  # L, batch, threads
"""

import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from keyformer.lab.bench.cpu import Config, decode, load_bench_model, make_prompts, prefill, prompt_tokens


def main(L: int, B: int, threads: int, pol: str = "window") -> None:
    torch.set_num_threads(threads)
    cfg = {"model_name": "smollm2", "dtype": "float32", "prompt": "cnn_dailymail",
           "data_dir": os.environ.get("KEYFORMER_DATA_DIR")}
    model, tok = load_bench_model(cfg)
    text_ids = prompt_tokens(cfg, tok, L * B)
    ids = make_prompts(text_ids, model.config.vocab_size, L, B, 0)
    with torch.inference_mode():
        warm = make_prompts(text_ids, model.config.vocab_size, 64, 1, 0)
        for c in (Config("full"), Config(pol, 0.5)):
            snap, _ = prefill(model, warm, c, 2, 0)
            decode(model, snap, 2)
        snap, _ = prefill(model, ids, Config("full"), 32, 0)
        del snap
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            snap, sec = prefill(model, ids, Config(pol, 0.5), 32, 0)
    print(f"{pol} prefill {sec:.2f} s")
    ka = prof.key_averages()
    for e in sorted(ka, key=lambda e: -e.self_cpu_time_total)[:25]:
        print(f"{e.key:<45} n={e.count:>6} self_ms={e.self_cpu_time_total / 1000:>9.1f}")
    print("total ops", sum(e.count for e in ka))
    print("ALL " + json.dumps({e.key: e.count for e in ka}))


if __name__ == "__main__":
    main(*(int(x) for x in sys.argv[1:4]), *sys.argv[4:5])
