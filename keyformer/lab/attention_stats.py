"""Attention concentration and sparsity of a model over real prompts (experiment 4).

Measured on the prompt forward with *eager* attention, one layer at a time: a forward hook on every
attention module receives that layer's probabilities ``[B, H, n, n]``, reduces them to a few numbers and
drops them, so all layers' attention matrices are never held at once (``output_attentions=True`` would
return all of them: 1 GiB at n = 1024 for SmolLM2).

Per layer and head, over the causal (lower-triangular) entries of the prompt:

* ``row_mass[x]``: for each query row i, the share of the row's probability mass held by its top
  ``ceil(x * (i + 1))`` keys (x = fraction of the keys the row can see), averaged over rows ``i >= min_row``.
  This is the "fraction of attention captured by the top x % of tokens" of the Keyformer figure, for
  the queries of the prompt (every ``row_stride``-th row, to bound the cost of sorting).
* ``acc_mass[x]``: the share of the *accumulated* attention (column sums over all rows, the H2O/Keyformer
  score) held by the top ``ceil(x * n)`` prompt tokens.
* ``last_mass[x]``: ``row_mass`` for the last prompt row only (the position that emits the first generated
  token): how concentrated generation-time attention is over the whole prompt.
* ``sparsity``: fraction of the causal entries below 1 % of their row's maximum (H2O's definition),
  over rows ``i >= min_row``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

FRACTIONS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def topk_row_mass(probs: torch.Tensor, fractions: Sequence[float], min_row: int = 0,
                  row_stride: int = 1) -> torch.Tensor:
    """Mean share of each causal row's mass in its top ``ceil(x * (i + 1))`` entries.

    ``probs`` [H, n, n] (rows sum to 1, zeros above the diagonal); rows ``min_row, min_row + row_stride,
    ...`` (sorting every row of every layer is the expensive part). Returns [len(fractions), H].
    """
    H, n, _ = probs.shape
    rows = torch.arange(min_row, n, row_stride)
    srt = probs[:, rows, :].sort(dim=-1, descending=True).values.cumsum(-1)  # [H, r, n]
    total = srt[..., -1].clamp_min(1e-30)
    out = []
    for x in fractions:
        k = torch.ceil(x * (rows + 1).double()).long().clamp(1, n) - 1  # [r]
        mass = srt.gather(-1, k.view(1, -1, 1).expand(H, -1, 1)).squeeze(-1) / total
        out.append(mass.mean(-1))
    return torch.stack(out)


def topk_acc_mass(probs: torch.Tensor, fractions: Sequence[float]) -> torch.Tensor:
    """Share of the accumulated (column-summed) attention held by the top ``ceil(x * n)`` tokens.

    ``probs`` [H, n, n]. Returns [len(fractions), H].
    """
    H, n, _ = probs.shape
    acc = probs.sum(1)  # [H, n]
    srt = acc.sort(-1, descending=True).values.cumsum(-1)
    total = srt[:, -1].clamp_min(1e-30)
    return torch.stack([srt[:, min(n, max(1, math.ceil(x * n))) - 1] / total for x in fractions])


def row_sparsity(probs: torch.Tensor, threshold: float = 0.01, min_row: int = 0) -> torch.Tensor:
    """Fraction of causal entries ``< threshold x row max`` (H2O's sparsity). ``probs`` [H, n, n] -> [H]."""
    H, n, _ = probs.shape
    p = probs[:, min_row:, :]
    causal = torch.ones(n, n, dtype=torch.bool).tril()[min_row:]
    small = (p < threshold * p.amax(-1, keepdim=True)) & causal
    return small.sum((-1, -2)).double() / causal.sum().double()


@dataclass
class LayerStats:
    """Accumulates per-layer statistics over prompts (means over prompts and heads)."""

    fractions: tuple[float, ...] = FRACTIONS
    min_row: int = 16
    row_stride: int = 1
    threshold: float = 0.01
    sums: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)

    def add(self, layer: int, probs: torch.Tensor) -> None:
        """``probs`` [B, H, n, n] of one prompt (B = 1, no padding)."""
        if probs.shape[0] != 1:
            raise ValueError("one unpadded prompt at a time (batch 1)")
        p = probs[0].detach().float()
        n = p.shape[-1]
        min_row = min(self.min_row, n - 1)
        vals = {
            "row_mass": topk_row_mass(p, self.fractions, min_row, self.row_stride).mean(-1),
            "acc_mass": topk_acc_mass(p, self.fractions).mean(-1),
            "last_mass": topk_row_mass(p, self.fractions, n - 1).mean(-1),
            "sparsity": row_sparsity(p, self.threshold, min_row).mean().reshape(1),
        }
        for k, v in vals.items():
            key = (layer, k)
            self.sums[key] = self.sums.get(key, 0) + v.double()
            self.counts[key] = self.counts.get(key, 0) + 1

    def rows(self) -> Iterable[dict]:
        """Long-format rows: layer, stat, x (fraction, or None for sparsity), value."""
        for (layer, k), s in sorted(self.sums.items()):
            v = (s / self.counts[(layer, k)]).tolist()
            if k == "sparsity":
                yield {"layer": layer, "stat": k, "x": None, "value": v[0],
                       "n_prompts": self.counts[(layer, k)]}
            else:
                for x, val in zip(self.fractions, v, strict=True):
                    yield {"layer": layer, "stat": k, "x": x, "value": val,
                           "n_prompts": self.counts[(layer, k)]}


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The self-attention module of every decoder layer (Llama-style ``model.model.layers[i].self_attn``)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no model.layers[i].self_attn to hook")
    return [layer.self_attn for layer in layers]


@torch.inference_mode()
def measure(model: torch.nn.Module, prompts: Iterable[Sequence[int]], stats: LayerStats | None = None,
            progress: bool = False) -> LayerStats:
    """Run each prompt (token ids) through ``model`` with eager attention and accumulate per-layer stats.

    The model's attention implementation is switched to ``eager`` for the call and restored afterwards.
    """
    stats = stats or LayerStats()
    old = model.config._attn_implementation
    model.set_attn_implementation("eager")
    handles = []
    for i, mod in enumerate(attention_modules(model)):
        def hook(_m, _inp, out, i=i):
            w = out[1] if isinstance(out, tuple) and len(out) > 1 else None
            if w is None:
                raise RuntimeError("attention weights not returned; eager attention is required")
            stats.add(i, w)
            return (out[0], None, *out[2:])  # drop the weights right away
        handles.append(mod.register_forward_hook(hook))
    try:
        it = list(prompts)
        if progress:
            from tqdm import tqdm

            it = tqdm(it, unit="prompt")
        for ids in it:
            x = torch.tensor([list(ids)], dtype=torch.long, device=next(model.parameters()).device)
            model(input_ids=x, use_cache=False, logits_to_keep=1)
    finally:
        for h in handles:
            h.remove()
        model.set_attn_implementation(old)
    return stats


# -- the command line (keyformer-attention-stats) ---------------------------------------------------------
USAGE = """Attention concentration and per-layer sparsity over run.py's prompts.

    keyformer-attention-stats                                       # -> outputs/attention_stats/
    keyformer-attention-stats dataset=cnn_dailymail n_samples=20    # real articles (KEYFORMER_DATA_DIR)
    keyformer-attention-stats +experiment=NAME                      # a study's settings (its config)

The arguments are Hydra overrides of ``run.py``'s config composed with the tool's own
(``conf/attention_stats/default.yaml``, unless an experiment is given): the number of prompts is
``n_samples``, their cap ``max_prompt_tokens``; the statistics' knobs and the output folder are under
``attention_stats``, e.g. ``model=mpt device=cuda dtype=bfloat16`` on a GPU box.

Builds the prompts exactly as run.py does (same template, chat wrapping and truncation), runs each one
unpadded through the model with eager attention, and reduces each layer's attention probabilities on the
fly (see :mod:`keyformer.lab.attention_stats`). Writes ``layers.csv`` (per layer), ``summary.csv`` (means over
layers) and ``meta.json`` into ``attention_stats.out``.
"""


DEFAULTS = "+attention_stats=default"  # the tool's own config, unless the line names an experiment
# Where a run writes unless the command sets attention_stats.out (results/ only when asked).
DEFAULT_OUT = "outputs/attention_stats"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    import pandas as pd
    import torch

    from keyformer.run.data import encode_prompt, load_records
    from keyformer.run.loading import load_model
    from keyformer.run.paths import compose

    own = any(a.lstrip("+").startswith(("experiment=", "attention_stats=")) for a in args)
    overrides = [*([] if own else [DEFAULTS]), *args]
    if not any(a.lstrip("+").startswith("attention_stats.out=") for a in args):
        overrides.append(f"attention_stats.out={DEFAULT_OUT}")  # results/ only when asked
    cfg = compose(overrides)
    st = cfg["attention_stats"]
    torch.manual_seed(0)
    model, tok = load_model(cfg)
    ds = cfg["dataset"]
    chat = bool(cfg["model"].get("chat_template")) and getattr(tok, "chat_template", None) is not None
    from keyformer.run.validate import ALL

    n = None if cfg["n_samples"] == ALL else int(cfg["n_samples"])  # all: every record
    records = load_records(ds, n, 0, cfg["model"])
    limit = int(cfg["max_prompt_tokens"])
    prompts = [encode_prompt(tok, r, ds.get("template", "alpaca"), ds.get("instruction", ""), limit, chat)[0]
               for r in records]
    t0 = time.perf_counter()
    stats = measure(model, prompts, LayerStats(min_row=int(st["min_row"]), row_stride=int(st["row_stride"])),
                    progress=True)
    wall = time.perf_counter() - t0

    layers = pd.DataFrame(list(stats.rows()))
    layers.insert(0, "model", cfg["model"]["name"])
    summary = (layers.groupby(["stat", "x"], dropna=False)["value"]
               .agg(["mean", "min", "max"]).reset_index())
    summary.insert(0, "model", cfg["model"]["name"])
    out = Path(st["out"])
    out.mkdir(parents=True, exist_ok=True)
    layers.to_csv(out / "layers.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    lens = [len(p) for p in prompts]
    meta = {"model": cfg["model"]["name"], "dataset": ds["name"], "n_prompts": len(prompts),
            "max_prompt_tokens": limit, "prompt_tokens_mean": sum(lens) / len(lens),
            "prompt_tokens_min": min(lens), "prompt_tokens_max": max(lens), "min_row": st["min_row"],
            "row_stride": st["row_stride"], "sparsity_threshold": stats.threshold, "overrides": overrides,
            "wall_s": wall, "command": " ".join(["keyformer-attention-stats", *args])}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(summary.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
