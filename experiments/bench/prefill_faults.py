"""Minor page faults (``ru_minflt``) and seconds of each prompt forward, and the faults of two 32-token
decodes after it, in the A/B worker's order (full, window, H2O, Keyformer at budget 0.5, full; after a
64-token warm-up of each), SmolLM2 fp32 on CNN/DailyMail prompts (``$KEYFORMER_DATA_DIR``), from the
keyformer tree on ``PYTHONPATH``. Fault counts do not depend on the machine's load; the seconds do.

    PYTHONPATH=/tmp/tree_at_rev python experiments/bench/prefill_faults.py 2048 4 2   # L, batch, threads
"""

import json
import os
import resource
import sys

import torch

import keyformer
from keyformer.lab.bench.cpu import Config, decode, load_bench_model, make_prompts, prefill, prompt_tokens


def main(L: int, B: int, threads: int) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = {"model_name": "smollm2", "dtype": "float32", "prompt": "cnn_dailymail",
           "data_dir": os.environ.get("KEYFORMER_DATA_DIR")}
    model, tok = load_bench_model(cfg)
    text_ids = prompt_tokens(cfg, tok, L * B)
    ids = make_prompts(text_ids, model.config.vocab_size, L, B, 0)
    confs = [Config("full"), *(Config(p, 0.5) for p in ("window", "h2o", "keyformer")), Config("full")]
    out = []
    with torch.inference_mode():
        warm = make_prompts(text_ids, model.config.vocab_size, 64, 1, 0)
        for c in confs[:-1]:
            snap, _ = prefill(model, warm, c, 2, 0)
            decode(model, snap, 2)
        for c in confs:
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            snap, sec = prefill(model, ids, c, 32, 0)
            f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            decode(model, snap, 32)
            decode(model, snap, 32)
            f2 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            del snap
            out.append({"policy": c.policy, "prefill_s": round(sec, 3), "prefill_faults": f1 - f0,
                        "decode_faults": f2 - f1})
    print(keyformer.__file__)
    print(json.dumps(out))


if __name__ == "__main__":
    main(*(int(x) for x in sys.argv[1:4]))
