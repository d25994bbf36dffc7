"""Process RSS through one long greedy generation, sampled every ``--every`` decode steps: the diagnostic for
the long benchmark's open peak-RSS gap (Keyformer +17723 MiB against H2O's +4289 at 512 + 4096, batch 64).
One policy per process, from a trimmed heap, with the long benchmark's prompts (CNN/DailyMail windows where
``KEYFORMER_DATA_DIR`` is set). Each row: step, RSS and its high-water mark (MiB), the K/V tensor bytes, the
live torch tensors the garbage collector sees, and dynamo's compile counters.

    .venv/bin/python scripts/rss_probe.py --policy keyformer --batch 64 --new 4096 --out /tmp/rss_kf.jsonl
    .venv/bin/python scripts/rss_probe.py --model tiny --batch 4 --prompt-len 32 --budget 8 --new 64  # fast
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
import warnings

import torch

from keyformer.core.generate import make_cache
from keyformer.lab.bench.cpu import environment, load_bench_model, make_prompts, prompt_tokens
from keyformer.lab.bench.long import BENCH_CODE, DEFAULTS, _policy, parse_budgets
from keyformer.lab.bench.memory import start_peak, status_mb
from keyformer.run.results import code_tree


def live_tensors() -> tuple[int, int]:
    """(count, bytes) of the torch tensors the garbage collector tracks (views counted at their size)."""
    n = size = 0
    warnings.simplefilter("ignore", FutureWarning)  # isinstance on deprecated torch aliases
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor):
                n += 1
                size += obj.numel() * obj.element_size()
        except Exception:  # noqa: BLE001 - some tracked objects raise on isinstance
            continue
    return n, size


def compiles() -> dict[str, int]:
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    return {f"{k}.{j}": int(v) for k in ("stats", "recompiles") for j, v in counters[k].items()}


def main(argv: list[str] | None = None) -> list[dict]:
    """Run the probe; returns the header and the rows (also printed, and written to ``--out``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--policy", default="keyformer")
    ap.add_argument("--budget", default="256", help="tokens (int) or a fraction of the prompt")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new", type=int, default=4096)
    ap.add_argument("--every", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSONL of the rows (also printed)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = {"model_name": args.model, "dtype": "float32", "prompt": "cnn_dailymail",
           "data_dir": os.environ.get("KEYFORMER_DATA_DIR")}
    model, tok = load_bench_model(cfg)
    text = prompt_tokens(cfg, tok, args.prompt_len * (args.batch + 1))
    # the long benchmark's prompt pool (its default max_batch + 1 rows), so row b is its row b
    pool = max(args.batch, DEFAULTS["max_batch"] + 1)
    ids = make_prompts(text, model.config.vocab_size, args.prompt_len, pool, 0)[:args.batch]
    budget = parse_budgets(args.budget)[0]
    pol = _policy(args.policy, budget)
    sink = open(args.out, "w") if args.out else None
    logged: list[dict] = []

    def emit(d: dict) -> None:
        print(json.dumps(d), flush=True)
        logged.append(d)
        if sink:
            sink.write(json.dumps(d) + "\n")
            sink.flush()

    def row(step: int, cache, t0: float) -> None:
        n, size = live_tensors()
        r = {"step": step, "rss_mb": round(status_mb("VmRSS"), 1), "hwm_mb": round(status_mb("VmHWM"), 1),
             "kv_mb": round(cache.tensor_bytes() / 2**20, 1), "tensors": n,
             "tensor_mb": round(size / 2**20, 1),
             "s": round(time.perf_counter() - t0, 1), **compiles()}
        emit(r)

    base = start_peak()
    head = {"policy": args.policy, "budget": budget, "batch": args.batch, "prompt": args.prompt_len,
            "new": args.new, "model": args.model, "dtype": "float32", "base_rss_mb": round(base, 1),
            **environment(), "code": code_tree(paths=BENCH_CODE),
            "malloc_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")}}
    emit(head)
    mask = torch.ones_like(ids)
    t0 = time.perf_counter()
    with torch.inference_mode():
        cache = make_cache(model, pol, mask, max_new_tokens=args.new, seed=0)
        out = model(input_ids=ids, attention_mask=mask, cache=cache, logits_to_keep=1)
        t = out.logits[:, -1].argmax(-1, keepdim=True)
        row(0, cache, t0)
        for step in range(1, args.new):
            out = model(input_ids=t, cache=cache, logits_to_keep=1)
            t = out.logits[:, -1].argmax(-1, keepdim=True)
            if step % args.every == 0 or step == args.new - 1:
                row(step, cache, t0)
    if sink:
        sink.close()
    return logged


if __name__ == "__main__":
    main()
