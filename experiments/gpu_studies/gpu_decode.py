"""A timed greedy decode over our cache on a GPU (or on CPU, the dry runs): the measurement that
:mod:`experiments.gpu_studies.gpu_long` and :mod:`experiments.gpu_studies.static_full` share."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from keyformer.core.generate import make_cache
from keyformer.core.graphs import greedy_decode
from keyformer.lab.bench.gpu import free, sync
from keyformer.lab.bench.long import _policy


def pick_device(tiny: bool) -> torch.device:
    """CPU for ``--tiny`` (the dry run), else CUDA; exits with one line when no CUDA device exists."""
    if tiny:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    sys.exit("no CUDA device: run with --tiny for a CPU smoke test")


def run_env(device: torch.device, argv: Sequence[str] | None) -> dict[str, Any]:
    """Where a GPU script's numbers come from: device name, torch, transformers, dtype (bf16), argv."""
    import transformers

    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (tiny)",
            "torch": torch.__version__, "transformers": transformers.__version__, "dtype": "bfloat16",
            "argv": list(sys.argv[1:] if argv is None else argv)}


def timed_run(model: Any, ids: torch.Tensor, name: str, budget: float | int | None, n_new: int,
              capture: bool) -> dict[str, Any]:
    """Prompt forward + ``n_new - 1`` greedy steps (captured where the policy allows and ``capture``):
    seconds, tokens [B, n_new], K/V bytes at the end, peak GPU MiB, and how the steps ran."""
    device = ids.device
    free(device)
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        cache = make_cache(model, _policy(name, budget), mask, max_new_tokens=n_new)
        sync(device)
        t0 = time.perf_counter()
        out = model(input_ids=ids, attention_mask=mask, cache=cache, logits_to_keep=1)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        sync(device)
        t1 = time.perf_counter()
        toks, info = greedy_decode(model, cache, tok, n_new - 1, capture=capture and device.type == "cuda")
        sync(device)
        t2 = time.perf_counter()
    kv = cache.tensor_bytes()
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    del cache, out
    free(device)
    return {"prefill_s": t1 - t0, "decode_s": t2 - t1, "tokens": torch.cat([tok, toks], dim=1),
            "kv_tensor_bytes_end": int(kv), "peak_gpu_mib": peak, "peak_rss_delta_mb": 0.0, **info}
