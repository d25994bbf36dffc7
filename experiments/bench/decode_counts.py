"""Machine-independent counts of a decode step, for an A/B whose timings need explaining: Python function
calls (cProfile) and aten ops (torch profiler) per step of window, H2O and Keyformer at budget 0.5, after a
256-token prompt at batch 4, from the keyformer tree on ``PYTHONPATH`` (any commit with the CPU benchmark's
helpers).

    PYTHONPATH=/tmp/tree_at_rev python experiments/bench/decode_counts.py [smollm2|tiny] > rev.json
"""

from __future__ import annotations

import collections
import copy
import cProfile
import json
import pstats
import sys

import torch

from keyformer.lab.bench.cpu import Config, load_bench_model, make_prompts, prefill

STEPS, POLICIES = 8, ("window", "h2o", "keyformer")


def _steps(model, cache, tok) -> None:
    for _ in range(STEPS):
        tok = model(input_ids=tok, cache=cache, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)


def main(model_name: str = "smollm2") -> dict:
    torch.set_num_threads(1)
    model, _ = load_bench_model({"model_name": model_name, "dtype": "float32", "prompt": "random",
                                 "data_dir": None})
    ids = make_prompts(None, model.config.vocab_size, 256, 4, 0)
    out = {}
    with torch.inference_mode():
        for pol in POLICIES:
            snap, _ = prefill(model, ids, Config(pol, 0.5), STEPS + 4, 0)
            cache = copy.deepcopy(snap.cache)
            model(input_ids=snap.first_token, cache=cache, logits_to_keep=1)  # one step outside the counts
            prof = cProfile.Profile()
            prof.enable()
            _steps(model, cache, snap.first_token)
            prof.disable()
            stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
            ours = sorted(((v[1], f"{k[0].split('/')[-1]}:{k[2]}") for k, v in stats.items()
                           if "keyformer" in k[0]), reverse=True)[:25]
            with torch.profiler.profile() as aten:
                _steps(model, copy.deepcopy(snap.cache), snap.first_token)
            ops = collections.Counter(e.name for e in aten.events() if e.name.startswith("aten::"))
            out[pol] = {"py_calls_per_step": sum(v[1] for v in stats.values()) / STEPS,
                        "aten_per_step": {k: v / STEPS for k, v in sorted(ops.items())},
                        "top_keyformer_calls": [(c / STEPS, n) for c, n in ours]}
    return out


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:2])))
