"""A run in a child process for tests/test_faults.py: ``python tests/fault_worker.py CFG.json DELAY``.

Runs the job scaffold with the generation task on a fake backend (echoes prompt words, ``DELAY`` seconds per
batch), handling SIGTERM and Ctrl-C as ``run.py`` does, and a UserError as one ``error:`` line with exit
status 2. Prints ``started`` once its folder is locked, so a test can kill it at a known point.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass


class WordTokenizer:
    eos_token_id = pad_token_id = 0
    chat_template = None

    def __init__(self):
        self.vocab, self.inv = {"<eos>": 0}, {0: "<eos>"}

    def __call__(self, text, add_special_tokens=True):
        ids = []
        for w in text.split():
            if w not in self.vocab:
                self.vocab[w] = len(self.vocab)
                self.inv[self.vocab[w]] = w
            ids.append(self.vocab[w])
        return {"input_ids": ids}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(self.inv[i] for i in ids if i != 0)


@dataclass
class Out:
    sequences: object
    prefill_s: float
    decode_s: float
    n_decode_steps: int
    kv_bytes: list
    kv_bytes_full: list


def fake_backend(delay: float):
    from keyformer.run.tasks.generate import Backend

    def load(cfg):
        print("started", flush=True)
        return None, WordTokenizer()

    def generate(model, input_ids, attention_mask, policy, max_new_tokens=4, **kw):
        if max_new_tokens != 2:  # not the warm-up call
            time.sleep(delay)
        seq = input_ids[:, -max_new_tokens - 3:-3]
        b = input_ids.shape[0]
        return Out(seq, 0.01, 0.02, max_new_tokens, [100] * b, [200] * b)

    return Backend(load=load, generate=generate)


def main() -> int:
    from keyformer.run.tasks.generate import run
    from keyformer.run.validate import UserError, install_sigterm, report_interrupt

    cfg = json.loads(open(sys.argv[1], encoding="utf-8").read())
    install_sigterm()
    try:
        run(cfg, fake_backend(float(sys.argv[2])))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt as e:
        return report_interrupt(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
