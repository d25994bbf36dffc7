"""Where in a RULER prompt each policy's prompt cut keeps tokens, and whether it keeps the needle.

Experiment 10 (its page) finds that at ratio 0.25 (budget 0.75) the recent window nearly matches the
full cache on RULER while the score-based policies lose most of the needle tasks. This script checks why on
the same records and prompts the experiment ran: for each ``niah_single_1`` record (``--task``; ``--experiment
exp10_ruler_gemma`` for Gemma 3's records and prompts) and policy, one greedy
step (the prompt forward and the prompt cut) through ``keyformer.core.generate``; then, per layer and KV head,
which prompt positions the cache holds. It writes one row per (policy, record, layer):

* ``needle_depth``: where the needle's value starts, as a share of the prompt;
* ``needle_kept``: the share of the value's tokens kept (mean over the KV heads);
* ``kept_d0`` .. ``kept_d9``: the share of each tenth of the prompt kept (mean over the KV heads).

    python -m experiments.exp10_ruler.ruler_kept_depth results/exp10_ruler/kept_depth.csv [--budget 0.75]
    python -m experiments.exp10_ruler.ruler_kept_depth \
        results/exp10_ruler_gemma/kept_depth_niah_single_2.csv \
        --experiment exp10_ruler_gemma --task niah_single_2 --budget 0.5 --policies kvzip,keyformer,snapkv

Needs ``KEYFORMER_DATA_DIR`` only for the essay tasks (niah_single_1's haystack is RULER's noise). The CSV's
first lines (``#``) give the commit, device, dtype and batch.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from pathlib import Path

POLICIES = ("keyformer", "h2o", "snapkv", "window")


def _value_span(tok, ids: list[int], value: str) -> tuple[int, int]:
    """Token indices [lo, hi) covering the first occurrence of ``value`` in the decoded prompt."""
    ends, text = [], ""
    for t in ids:
        text += tok.decode([t])
        ends.append(len(text))
    at = text.find(value)
    if at < 0:
        raise ValueError(f"the needle value {value!r} is not in the decoded prompt")
    lo = next(i for i, e in enumerate(ends) if e > at)
    hi = next(i for i, e in enumerate(ends) if e >= at + len(value)) + 1
    return lo, hi


def point_overrides(experiment: str, task: str, n: int) -> list[str]:
    """The ``run.py`` overrides an experiment-10 point of ``task`` runs its first ``n`` records with (as
    ``experiments/exp10_ruler/queue.py`` writes them): the task's tokens to generate included, which set the
    cache's horizon and the prompt limit."""
    from keyformer.run.data.ruler import tokens_to_generate

    return [f"+experiment={experiment}", f"dataset.ruler_task={task}", f"n_samples={n}",
            f"generation.max_new_tokens={tokens_to_generate(task)}"]


def code_at() -> str:
    """The provenance a diagnostic's CSV header starts with: this checkout's HEAD commit, and `` (keyformer/
    modified)`` when the library has uncommitted changes."""
    from keyformer.run.paths import ROOT

    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "keyformer"], capture_output=True,
                           text=True).stdout.strip()
    return commit + (" (keyformer/ modified)" if dirty else "")


def point_records(experiment: str, task: str, n: int) -> tuple:
    """(cfg, records) of an experiment-10 point of ``task`` with policy full: its first ``n`` records,
    generated as the experiment generated them (no model loaded)."""
    from keyformer.run.data import load_records
    from keyformer.run.paths import compose

    cfg = compose([*point_overrides(experiment, task, n), "policy=full"])
    return cfg, load_records(cfg["dataset"], n, int(cfg["seed"]), cfg["model"])[:n]


def load_point(experiment: str, task: str, n: int) -> tuple:
    """(cfg, model, tokenizer, records, chat, prompt limit) of an experiment-10 point of ``task`` with policy
    full: :func:`point_records` and the model, read as the experiment read them."""
    from keyformer.run.loading import load_model
    from keyformer.run.tasks.generate import prompt_limit

    cfg, records = point_records(experiment, task, n)
    model, tok = load_model(cfg)
    chat = bool(cfg["model"].get("chat_template")) and getattr(tok, "chat_template", None) is not None
    return cfg, model, tok, records, chat, prompt_limit(cfg, model)


def prompt_cut(model, tok, rec: dict, ds, limit: int, chat: bool, policy_cfg: dict) -> tuple:
    """(prompt ids, needle value span [lo, hi), generate's output) of one record: its prompt as the experiment
    built it, then one greedy step (the prompt forward and the prompt cut) under ``policy_cfg`` (a composed
    config: its ``policy`` and ``seed``)."""
    import torch

    from keyformer.core.generate import generate
    from keyformer.core.policies import build_policy
    from keyformer.run.data import encode_prompt
    from keyformer.run.tasks.generate import _with_prefix

    ids, cut = _with_prefix(tok, rec, encode_prompt(tok, rec, ds.get("template", "alpaca"),
                                                    ds.get("instruction", ""), limit, chat))
    assert cut == 0, "the experiment never cuts a prompt"
    lo, hi = _value_span(tok, ids, rec["answers"][0] if "answers" in rec else rec["answer"])
    x = torch.tensor([ids])
    with torch.inference_mode():
        out = generate(model, x, torch.ones_like(x), build_policy(policy_cfg["policy"]), max_new_tokens=1,
                       seed=int(policy_cfg["seed"]), eos_token_id=tok.eos_token_id)
    return ids, lo, hi, out


def held(pos, n: int):
    """[H, n] float: 1 where KV head ``h`` holds prompt position ``p``, from a cache layer's slot positions
    ``pos`` [H, S] (-1 for an empty slot; a position >= ``n``, a generated token's, is not a prompt
    position)."""
    import torch

    kept = torch.zeros(pos.shape[0], n + 1, dtype=torch.bool)
    col = torch.where((pos >= 0) & (pos < n), pos + 1, torch.zeros_like(pos))  # column 0: not a prompt slot
    kept.scatter_(1, col, True)
    return kept[:, 1:].float()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--budget", type=float, default=0.75)
    ap.add_argument("--n", type=int, default=5, help="records of the task (the experiment's first n)")
    ap.add_argument("--experiment", default="exp10_ruler", choices=("exp10_ruler", "exp10_ruler_gemma"))
    ap.add_argument("--task", default="niah_single_1",
                    help="a RULER task with one needle value (niah_single_1/2/3, niah_multikey_1/2/3)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args(argv)

    import torch

    from keyformer.core.models import layer_windows
    from keyformer.run.paths import compose

    torch.set_num_threads(1)
    base = point_overrides(args.experiment, args.task, args.n)
    cfg, model, tok, records, chat, limit = load_point(args.experiment, args.task, args.n)
    ds = cfg["dataset"]
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    wins = layer_windows(model.config)
    hybrid = ("" if all(w is None for w in wins) else "; the policy acts on the global layers "
              f"{[i for i, w in enumerate(wins) if w is None]}, the others keep their sliding window")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        f.write(f"# experiments/exp10_ruler/ruler_kept_depth.py at {code_at()}; "
                f"{cfg['model']['name']}, cpu, {dtype}, batch 1, 1 thread; RULER {args.task} 4k, "
                f"budget {args.budget}, the prompt cut after one greedy step{hybrid}\n")
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["policy", "record", "layer", "prompt_tokens", "needle_depth", "needle_kept",
                    *(f"kept_d{i}" for i in range(10))])
        for name in args.policies.split(","):
            pcfg = compose([*base, f"policy={name}", f"budget={args.budget}"])
            for rec in records:
                ids, lo, hi, out = prompt_cut(model, tok, rec, ds, limit, chat, pcfg)
                n = len(ids)
                tenth = torch.arange(n) * 10 // n
                got = []
                for li, layer in enumerate(out.cache.layers):
                    kept = held(layer.pos[0], n)  # [H, n]: is prompt position p held by KV head h
                    w.writerow([name, rec["id"], li, n, f"{lo / n:.4f}", f"{kept[:, lo:hi].mean():.4f}",
                                *(f"{kept[:, tenth == d].mean():.4f}" for d in range(10))])
                    got.append(float(kept[:, lo:hi].mean()))
                f.flush()
                print(f"{name} {rec['id']}: needle at {lo / n:.2f}, kept {sum(got) / len(got):.2f} (mean "
                      "over layers)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
