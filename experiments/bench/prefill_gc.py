"""Python's garbage collections during each timed prompt forward of the A/B worker's sequence (SmolLM2 fp32,
CNN/DailyMail prompts from ``$KEYFORMER_DATA_DIR``, budget 0.5): full, the policies, full again, each after
the worker's warm-up, from the keyformer tree on ``PYTHONPATH``. Per forward: the collections of each
generation, their summed seconds, and the objects the collector tracks when the forward starts. The counts
do not depend on the machine's load; the seconds do.

    # L, batch, threads, policies
    PYTHONPATH=/tmp/tree_at_rev python experiments/bench/prefill_gc.py 2048 4 2 window h2o
"""

import gc
import os
import sys
import time

import torch

from keyformer.lab.bench.cpu import Config, decode, load_bench_model, make_prompts, prefill, prompt_tokens


def main(L: int, B: int, threads: int, policies: list[str]) -> None:
    torch.set_num_threads(threads)
    cfg = {"model_name": "smollm2", "dtype": "float32", "prompt": "cnn_dailymail",
           "data_dir": os.environ.get("KEYFORMER_DATA_DIR")}
    model, tok = load_bench_model(cfg)
    text_ids = prompt_tokens(cfg, tok, L * B)
    ids = make_prompts(text_ids, model.config.vocab_size, L, B, 0)
    confs = [Config("full"), *[Config(p, 0.5) for p in policies], Config("full")]
    events: list[tuple[int, float]] = []
    start: dict[str, float] = {}

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            start["t"] = time.perf_counter()
        else:
            events.append((int(info["generation"]), time.perf_counter() - start["t"]))

    with torch.inference_mode():
        warm = make_prompts(text_ids, model.config.vocab_size, 64, 1, 0)
        for c in confs[:-1]:
            snap, _ = prefill(model, warm, c, 2, 0)
            decode(model, snap, 2)
        gc.callbacks.append(on_gc)
        for c in confs:
            events.clear()
            tracked = len(gc.get_objects())
            snap, sec = prefill(model, ids, c, 8, 0)
            got = list(events)
            decode(model, snap, 8)
            del snap
            per = {g: [d for gg, d in got if gg == g] for g in (0, 1, 2)}
            print(f"{c.policy:<8} prefill {sec:7.3f} s  tracked {tracked:>7}  " + "  ".join(
                f"gen{g}: {len(d):>3} x, {1000 * sum(d):7.2f} ms" for g, d in per.items()), flush=True)
        gc.callbacks.remove(on_gc)


if __name__ == "__main__":
    main(*(int(x) for x in sys.argv[1:4]), sys.argv[4:] or ["window", "h2o"])
