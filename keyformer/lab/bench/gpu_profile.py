"""Where a decode step's time goes on the GPU: GPT-J-6B-shaped (random bf16) at batch 1, prompt ``--prompt``.

Times ms/step for: plain transformers ``generate`` (its own DynamicCache: the baseline), our ``full`` policy
under each SDPA backend, and Keyformer/H2O at 50 %; then the top CUDA kernels of one ``full`` and one
Keyformer decode under the profiler.

    keyformer-gpu-profile               # CUDA
    keyformer-gpu-profile --tiny        # CPU smoke test
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from keyformer.core.generate import generate
from keyformer.core.policies import make_policy

from .gpu import build_model, sync


def ms_per_step(fn, dev, steps: int) -> float:
    fn(4)
    sync(dev)
    t = time.perf_counter()
    fn(steps)
    sync(dev)
    return 1000 * (time.perf_counter() - t) / steps


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=64)
    a = ap.parse_args(argv)
    dev = torch.device("cpu" if a.tiny else "cuda")
    model = build_model("gptj", a.tiny, 2 * a.prompt + a.steps, dev, torch.bfloat16)
    ids = torch.randint(10, model.config.vocab_size, (1, a.prompt), device=dev)
    mask = torch.ones_like(ids)

    def plain(n):
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                           do_sample=False,
                           pad_token_id=0)

    def ours(pol):
        return lambda n: generate(model, ids, mask, pol, max_new_tokens=n, min_new_tokens=n)

    # plain HF: its attention is our registered one, which falls back to SDPA without our cache
    print(f"plain transformers generate (DynamicCache): {ms_per_step(plain, dev, a.steps):.2f} ms/step "
          "(prefill included, amortised)", flush=True)
    backends = {"default": None, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "math": SDPBackend.MATH}
    for name, be in backends.items():
        try:
            if be is None:
                v = ms_per_step(ours(make_policy("full")), dev, a.steps)
            else:
                with sdpa_kernel(be):
                    v = ms_per_step(ours(make_policy("full")), dev, a.steps)
            print(f"ours full, SDPA {name}: {v:.2f} ms/step", flush=True)
        except RuntimeError as e:
            print(f"ours full, SDPA {name}: unavailable ({str(e).splitlines()[0][:100]})", flush=True)
    for p in ("window", "h2o", "keyformer"):
        v = ms_per_step(ours(make_policy(p, budget=0.5)), dev, a.steps)
        print(f"ours {p}@0.5: {v:.2f} ms/step", flush=True)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                    if dev.type == "cuda" else [])
    for p in ("full", "keyformer"):
        pol = make_policy(p) if p == "full" else make_policy(p, budget=0.5)
        ours(pol)(2)
        with torch.profiler.profile(activities=acts) as prof:
            ours(pol)(16)
        key = "self_device_time_total" if dev.type == "cuda" else "self_cpu_time_total"
        ev = sorted(prof.key_averages(), key=lambda e: -getattr(e, key))[:15]
        print(f"--- {p}: top ops by {key} over prefill + 16 steps", flush=True)
        for e in ev:
            print(f"  {getattr(e, key) / 1000:9.2f} ms  x{e.count:6d}  {e.key[:90]}", flush=True)


if __name__ == "__main__":
    main()
