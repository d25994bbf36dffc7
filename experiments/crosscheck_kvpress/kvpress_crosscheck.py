"""Correctness cross-check against NVIDIA kvpress: the same prefill-only method on the same model and prompts.

For every method both implement as a prompt compressor (kvpress ``compression_ratio = 1 - budget``), both
sides run SmolLM2 on the same CNN/DailyMail prompts and record (a) the kept prompt positions right after the
prompt, per layer and KV head, and (b) the greedy tokens, plus each side's full-cache tokens. ``merge``
compares them: mean Jaccard of the kept sets over (prompt, layer, head), the share of identical sets, the kept
counts, and the greedy agreement between the sides and with each side's own full cache.

kvpress's kept sets come from its real code: the press's ``compress`` is wrapped, and the key vectors it
returns are matched (exactly) against the uncompressed keys it was given; a press that masks instead of
cutting (``AdaKVPress``) leaves ``module.masked_key_indices``, whose complement is the kept set
(``KVzipPress`` never calls ``compress``: ``kvpress_kvzip.py`` runs it and reads those
indices). Ours come from :meth:`keyformer.core.cache.KVCache.kept_positions` (prompt positions only;
``prefill_only`` never evicts later). Methods whose policy is not registered here yet are reported as skipped.

``DIAGNOSTICS`` are kvpress presses changed in one named respect each (kvpress-side only) to test an
explanation of a difference: if the changed press agrees with ours, that respect is the cause.

Sides (JSON each; ``all`` runs them in order and merges), as in ``kvpress_compare.py``:

* ``prompts``: tokenize prompts (chat template) -> ``prompts.json``.
* ``kvpress``: ``.venv-kvpress/bin/python -m experiments.crosscheck_kvpress.kvpress_crosscheck \
  --side kvpress``
  from the
  checkout's root (imports only the standard library, torch, transformers and kvpress).
* ``ours``: the main venv.
* ``merge``: ``table.md``, ``table.txt`` and ``merged.json`` (the sides' files are ``ours.json.gz`` and
  ``kvpress.json.gz``).

    bash scripts/setup_kvpress_venv.sh                              # once
    KEYFORMER_DATA_DIR=../shared/data python -m experiments.crosscheck_kvpress.kvpress_crosscheck
    # = --side all: results/crosscheck_kvpress/
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any

from experiments.crosscheck_kvpress import kvpress_decoding, kvpress_kvzip, kvpress_wrappers
from experiments.crosscheck_kvpress.kvpress_compare import (
    default_model_dir,
    our_model,
    run_sides,
    side_prompts,
)

DEFAULT_OUT = Path("results") / "crosscheck_kvpress"
SNAP = {"window_size": 64, "kernel_size": 5}
EA = {"n_future_positions": 512, "n_sink": 4, "use_covariance": True, "use_vnorm": True, "epsilon": 0.0}
PREFILL = {"recent": 0.0, "prefill_only": True}
LAG = {"n_sink": 4, "lag_size": 128}
CRIT = {"epsilon": 1e-4, "first_stage_ratio": 0.5}
FINCH = {"window_size": 32}
SIMLAYER = {"lazy_threshold": 0.8, "n_last": 1, "n_recent": 128, "n_initial": 4}
COMPACT = {"sink_size_start": 8, "sink_size_end": 4, "chunk_size": 256, "sketch_dimension": 48}
CAP = {"tau": 5.0, "n_future_positions": 512, "n_sink": 4, "epsilon": 1e-6}

# name, kvpress press spec ({"cls", "kw", optional "inner"}), our policy name and options.
METHODS: list[dict[str, Any]] = [
    {"name": "StreamingLLM", "press": {"cls": "StreamingLLMPress", "kw": {"n_sink": 4}},
     "policy": "streaming", "policy_kw": {"sinks": 4, "prefill_only": True}},
    {"name": "SnapKV", "press": {"cls": "SnapKVPress", "kw": SNAP}, "policy": "snapkv", "policy_kw": SNAP},
    {"name": "TOVA", "press": {"cls": "TOVAPress", "kw": {}}, "policy": "tova",
     "policy_kw": {"recent": 0.0, "prefill_only": True}},
    {"name": "PyramidKV", "press": {"cls": "PyramidKVPress", "kw": {**SNAP, "beta": 20}},
     "policy": "pyramidkv",
     "policy_kw": {**SNAP, "beta": 20}},
    {"name": "PyramidKV fallback", "press": {"cls": "PyramidKVPress", "kw": {**SNAP, "beta": 20}},
     "policy": "pyramidkv", "policy_kw": {**SNAP, "beta": 20, "fallback": True}},
    {"name": "AdaKV-SnapKV", "press": {"cls": "AdaKVPress", "kw": {"alpha_safeguard": 0.2},
                                       "inner": {"cls": "SnapKVPress", "kw": SNAP}},
     "policy": "adakv_snapkv", "policy_kw": {**SNAP, "alpha_safeguard": 0.2}},
    # the field's newer methods (docs/policies_2025.md); kvpress's defaults, no recent window on either side
    # kvpress's H2O (ObservedAttentionPress) at the prompt, its attention computed by the press (SDPA model)
    {"name": "H2O (ObservedAttention)", "press": {"cls": "ObservedAttentionSdpa", "kw": {}}, "policy": "h2o",
     "policy_kw": {"recent": 0.0, "prefill_only": True}},
    {"name": "KeyDiff", "press": {"cls": "KeyDiffPress", "kw": {}}, "policy": "keydiff",
     "policy_kw": {"recent": 0.0, "prefill_only": True}},
    {"name": "ExpectedAttention", "press": {"cls": "ExpectedAttentionPress", "kw": EA},
     "policy": "expected_attention", "policy_kw": {**EA, "recent": 0.0, "prefill_only": True}},
    *kvpress_kvzip.METHODS,  # layerwise KVzip; its own recorder (kvpress_kvzip.run_kvzip)
    # the tensor-reading scorers and two wrappers over SnapKV (docs/methods.md); kvpress's defaults
    {"name": "Knorm", "press": {"cls": "KnormPress", "kw": {}}, "policy": "knorm", "policy_kw": PREFILL},
    {"name": "LagKV", "press": {"cls": "LagKVPress", "kw": LAG}, "policy": "lagkv",
     "policy_kw": {**LAG, **PREFILL}},
    {"name": "CurDKV", "press": {"cls": "CURPress", "kw": {}}, "policy": "curdkv", "policy_kw": PREFILL},
    # kvpress draws its Gaussian sketch unseeded per call: a different sketch than ours, same rule
    {"name": "LeverageScore", "press": {"cls": "LeverageScorePress", "kw": {"sketch_dimension": 48}},
     "policy": "leverage", "policy_kw": {"sketch_dimension": 48, **PREFILL}},
    {"name": "ChunkKV-SnapKV", "press": {"cls": "ChunkKVPress", "kw": {"chunk_length": 20},
                                         "inner": {"cls": "SnapKVPress", "kw": SNAP}},
     "policy": "snapkv+chunkkv", "policy_kw": {**SNAP, "chunk_length": 20}},
    {"name": "CriticalKV-SnapKV", "press": {"cls": "CriticalKVPress", "kw": CRIT,
                                            "inner": {"cls": "SnapKVPress", "kw": SNAP}},
     "policy": "snapkv+criticalkv",
     "policy_kw": {**SNAP, "critical_epsilon": 1e-4, "first_stage_ratio": 0.5}},
    # the attention readers: Finch with a fixed question window (kvpress's delimiter token never occurs), and
    # SimLayerKV, which takes no ratio (its lazy layers decide; ours at budget 1.0, cut once: "our_budget")
    {"name": "Finch", "press": {"cls": "FinchFixedWindow", "kw": FINCH}, "policy": "finch",
     "policy_kw": FINCH},
    {"name": "SimLayerKV", "press": {"cls": "SimLayerKVPress", "kw": SIMLAYER, "no_ratio": True},
     "policy": "simlayerkv", "policy_kw": {**SIMLAYER, **PREFILL}, "our_budget": 1.0},
    # kvpress draws its sketch unseeded (as LeverageScore) and pads its last chunk with zero queries and keys
    {"name": "Compactor", "press": {"cls": "CompactorPress", "kw": COMPACT}, "policy": "compactor",
     "policy_kw": COMPACT},
    {"name": "CapKV", "press": {"cls": "CapPress", "kw": CAP}, "policy": "capkv",
     "policy_kw": {**CAP, **PREFILL}},
    *kvpress_wrappers.METHODS,  # chunk, merging, cam and dms over Knorm (their module's docstring)
    *kvpress_wrappers.BLOCK_METHODS,  # block over KeyDiff
    *kvpress_wrappers.BASELINE_METHODS,  # Random, and layers over Knorm
    *kvpress_wrappers.ROTATE_METHODS,  # key re-rotation over Knorm
    *kvpress_wrappers.LUKV_METHODS,  # LU-KV over Knorm, from a synthetic curve
    *kvpress_decoding.METHODS,  # cuts every n decode steps over Knorm (kept sets at the end of generation)
]

# kvpress presses changed in one respect each (see side_kvpress): the same comparison with ours, to test a
# cause.
DIAGNOSTICS: list[dict[str, Any]] = [
    {"name": "SnapKV [kv: floor count]", "press": {"cls": "SnapKVPress", "kw": SNAP, "exact_count": True},
     "policy": "snapkv", "policy_kw": SNAP},
    {"name": "TOVA [kv: floor count, per KV head]",
     "press": {"cls": "TOVAPerKVHead", "kw": {}, "exact_count": True},
     "policy": "tova", "policy_kw": {"recent": 0.0, "prefill_only": True, "head_reduction": "per_head"}},
    *kvpress_kvzip.DIAGNOSTICS,
    {"name": "H2O (ObservedAttention) [kv: column sums, floor count]",
     "press": {"cls": "ObservedAttentionSummed", "kw": {}, "exact_count": True}, "policy": "h2o",
     "policy_kw": {"recent": 0.0, "prefill_only": True}},
    {"name": "LagKV [kv: ties keep the most recent]", "press": {"cls": "LagKVRecentTies", "kw": LAG},
     "policy": "lagkv", "policy_kw": {**LAG, **PREFILL}},
    {"name": "CriticalKV-SnapKV [kv: window apart from the first stage]",
     "press": {"cls": "CriticalKVWindowApart", "kw": CRIT, "inner": {"cls": "SnapKVPress", "kw": SNAP}},
     "policy": "snapkv+criticalkv",
     "policy_kw": {**SNAP, "critical_epsilon": 1e-4, "first_stage_ratio": 0.5}},
    {"name": "Finch [kv: floor count, rows times their key count]",
     "press": {"cls": "FinchKeyCount", "kw": FINCH, "exact_count": True}, "policy": "finch",
     "policy_kw": FINCH},
    {"name": "SimLayerKV [kv: recent tokens up to the last]",
     "press": {"cls": "SimLayerKVWithLast", "kw": SIMLAYER, "no_ratio": True},
     "policy": "simlayerkv", "policy_kw": {**SIMLAYER, **PREFILL}, "our_budget": 1.0},
    {"name": "LeverageScore [kv: our seeded sketch, floor count]",
     "press": {"cls": "LeverageSeeded", "kw": {"sketch_dimension": 48}, "exact_count": True},
     "policy": "leverage", "policy_kw": {"sketch_dimension": 48, **PREFILL}},
    {"name": "Compactor [kv: our seeded sketch, floor count]",
     "press": {"cls": "CompactorSeeded", "kw": COMPACT, "exact_count": True}, "policy": "compactor",
     "policy_kw": COMPACT},
    {"name": "Compactor [kv: our seeded sketch, no padding in the last chunk, floor count]",
     "press": {"cls": "CompactorSeededReal", "kw": COMPACT, "exact_count": True}, "policy": "compactor",
     "policy_kw": COMPACT},
    *kvpress_wrappers.DIAGNOSTICS,
    *kvpress_wrappers.BLOCK_DIAGNOSTICS,
    *kvpress_wrappers.BASELINE_DIAGNOSTICS,
    *kvpress_decoding.DIAGNOSTICS,
]


# ---------------------------------------------------------------------------------------------------------
# pure helpers (kept sets as bit masks over prompt positions, hex-encoded in the JSON)


def encode_kept(positions: Any) -> str:
    """Hex bit mask of a set of non-negative positions (bit p set = position p kept)."""
    mask = 0
    for p in positions:
        mask |= 1 << int(p)
    return format(mask, "x")


def decode_kept(hexmask: str) -> set[int]:
    """The positions of a hex bit mask from :func:`encode_kept`."""
    mask = int(hexmask, 16)
    return {i for i in range(mask.bit_length()) if mask >> i & 1}


def jaccard(a: str, b: str) -> float:
    """Jaccard index of two hex-encoded kept sets (1.0 when both are empty)."""
    x, y = int(a, 16), int(b, 16)
    union = bin(x | y).count("1")
    return bin(x & y).count("1") / union if union else 1.0


def count(a: str) -> int:
    """Size of a hex-encoded kept set."""
    return bin(int(a, 16)).count("1")


def agreement(tokens: list[int], ref: list[int]) -> tuple[bool, int]:
    """(identical, length of the common prefix) of two greedy token lists."""
    n = min(len(tokens), len(ref))
    prefix = next((i for i in range(n) if tokens[i] != ref[i]), n)
    return list(tokens) == list(ref), prefix


def compare_runs(ours: list[dict[str, Any]], kv: list[dict[str, Any]], ours_full: list[dict[str, Any]],
                 kv_full: list[dict[str, Any]]) -> dict[str, Any]:
    """Metrics of one method x budget from per-prompt runs (``tokens``, ``kept`` [layer][head] hex), paired by
    position in the lists (the same prompts in the same order)."""
    jac, same, n_ours, n_kv, count_diff = [], [], [], [], []
    layer_jac: list[list[float]] = []
    for o, k in zip(ours, kv, strict=True):
        if o["id"] != k["id"]:
            raise ValueError(f"prompt order differs: {o['id']} vs {k['id']}")
        for li, (lo, lk) in enumerate(zip(o["kept"], k["kept"], strict=True)):
            if len(layer_jac) <= li:
                layer_jac.append([])
            for ho, hk in zip(lo, lk, strict=True):
                j = jaccard(ho, hk)
                jac.append(j)
                layer_jac[li].append(j)
                same.append(ho == hk)
                n_ours.append(count(ho))
                n_kv.append(count(hk))
                count_diff.append(count(ho) != count(hk))

    def agree(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> tuple[float, float]:
        r = [agreement(x["tokens"], y["tokens"]) for x, y in zip(a, b, strict=True)]
        return statistics.fmean(float(e) for e, _ in r), statistics.fmean(float(p) for _, p in r)

    mean = statistics.fmean
    out = {
        "jaccard": mean(jac), "jaccard_min": min(jac), "identical": mean(float(s) for s in same),
        "kept_ours": mean(n_ours), "kept_kvpress": mean(n_kv),
            "count_differs": mean(float(c) for c in count_diff),
        "layer_jaccard": [mean(v) for v in layer_jac],
        "cross": agree(ours, kv), "ours_vs_full": agree(ours, ours_full),
            "kvpress_vs_full": agree(kv, kv_full),
    }
    if all("vsum" in r for r in ours) and all("vsum" in r and "vsum_pre" in r for r in kv):
        out["values"] = compare_values(ours, kv)
    return out


def compare_values(ours: list[dict[str, Any]], kv: list[dict[str, Any]]) -> dict[str, float]:
    """The kept values of a merging press, on the (prompt, layer, head) whose kept sets are identical: the
    largest and mean absolute difference of the sum of the head's kept values between the sides
    (``diff_*``), and, for scale, kvpress's own change of it by its merges (after minus before,
    ``merge_*``); ``compared``: the share of (prompt, layer, head) compared."""
    diff: list[float] = []
    moved: list[float] = []
    total = compared = 0
    for o, k in zip(ours, kv, strict=True):
        for lo, lk, vo, vk, pk in zip(o["kept"], k["kept"], o["vsum"], k["vsum"], k["vsum_pre"], strict=True):
            for ho, hk, a, b, c in zip(lo, lk, vo, vk, pk, strict=True):
                total += 1
                if ho == hk:
                    compared += 1
                    diff.append(abs(a - b))
                    moved.append(abs(b - c))
    if not diff:
        return {"compared": 0.0}
    mean = statistics.fmean
    return {"compared": compared / total, "diff_max": max(diff), "diff_mean": mean(diff),
            "merge_max": max(moved), "merge_mean": mean(moved)}


def format_values(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of the rows that compare merged values (empty when none does)."""
    vals = [(r, r["metrics"]["values"]) for r in rows if "values" in r.get("metrics", {})]
    if not vals:
        return ""
    lines = ["", "Merged values, on the (prompt, layer, KV head) whose kept sets are identical (compared: "
             "their share): |ours - kvpress| of the sum of the head's kept values (over positions and "
             "dimensions), max / mean; merge: kvpress's own change of that sum by its merges, max / mean "
             "(for scale).", "",
             "| method | budget | compared | diff max | diff mean | merge max | merge mean |",
             "|---|---|---|---|---|---|---|"]
    for r, v in vals:
        cells = [f"{v[c]:.2e}" if c in v else "—"
                 for c in ("diff_max", "diff_mean", "merge_max", "merge_mean")]
        lines.append(f"| {r['method']} | {r['budget']:g} | {v['compared']:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


COLUMNS = [("method", "{}"), ("budget", "{:g}"), ("ratio", "{:g}"), ("Jaccard", "{:.3f}"),
           ("min J", "{:.3f}"),
           ("ident.", "{:.3f}"), ("kept ours", "{:.1f}"), ("kept kv", "{:.1f}"), ("cnt diff", "{:.3f}"),
           ("out =", "{:.2f}"), ("prefix", "{:.1f}"), ("ours=full", "{:.2f}"), ("ours pfx", "{:.1f}"),
           ("kv=full", "{:.2f}"), ("kv pfx", "{:.1f}")]


def table_cells(row: dict[str, Any]) -> list[str]:
    """The formatted cells of one merged row (``skipped`` rows: the reason after the budget)."""
    if row.get("skipped"):
        return [row["method"], f"{row['budget']:g}", f"{1 - row['budget']:g}", f"skipped: {row['skipped']}"]
    m = row["metrics"]
    vals = [row["method"], row["budget"], round(1 - row["budget"], 6), m["jaccard"], m["jaccard_min"],
            m["identical"], m["kept_ours"], m["kept_kvpress"], m["count_differs"], m["cross"][0],
            m["cross"][1],
            m["ours_vs_full"][0], m["ours_vs_full"][1], m["kvpress_vs_full"][0], m["kvpress_vs_full"][1]]
    return [fmt.format(v) for (_, fmt), v in zip(COLUMNS, vals, strict=True)]


def format_tables(rows: list[dict[str, Any]], notes: list[str]) -> tuple[str, str]:
    """(Markdown, fixed-width text) tables of merged rows, each preceded by ``notes``."""
    head = [c for c, _ in COLUMNS]
    cells = [table_cells(r) for r in rows]
    md = [*notes, "", "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    md += ["| " + " | ".join(c + [""] * (len(head) - len(c))) + " |" for c in cells]
    full = [c for c in cells if len(c) == len(head)]
    widths = [max(len(x) for x in col) for col in zip(head, *full, strict=True)]

    def line(c: list[str]) -> str:
        return (" ".join(x.ljust(w) if i == 0 else x.rjust(w) for i,
                         (x, w) in enumerate(zip(c, widths, strict=False))))

    txt = [*notes, "", line(head), "-" * (sum(widths) + len(widths) - 1)]
    txt += [line(c) if len(c) == len(head) else line(c[:3]) + "  " + c[3] for c in cells]
    return "\n".join(md) + "\n", "\n".join(txt) + "\n"


def load_json(path: Path) -> Any:
    """A JSON file, gzip-compressed when its name ends in ``.gz``."""
    path = Path(path)
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())


def dump_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON, gzip-compressed (reproducibly: no timestamp) when the name ends in ``.gz``."""
    path, text = Path(path), json.dumps(obj) + "\n"
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)


def method_specs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The methods a run covers: METHODS (+ DIAGNOSTICS), restricted to ``--only`` names if given."""
    specs = METHODS + (DIAGNOSTICS if args.diagnostics else [])
    return [m for m in specs if not args.only or m["name"] in args.only]


# ---------------------------------------------------------------------------------------------------------
# kvpress side (torch, transformers, kvpress only)


def _variant_presses() -> dict[str, Any]:
    """kvpress presses changed in one respect each (the DIAGNOSTICS); kvpress is imported here."""
    import math

    import torch
    import torch.nn.functional as F
    from kvpress import PyramidKVPress, SnapKVPress, TOVAPress
    from kvpress.utils import get_prerope_query_states
    from transformers.models.llama.modeling_llama import repeat_kv, rotate_half

    def window_attention_all_keys(module, hidden_states, keys, w,  # type: ignore[no-untyped-def]
                                  position_embeddings):
        """SnapKVPress.compute_window_attention without dropping the window's own keys: [B, Hq, w, n]."""
        n = keys.shape[2]
        q = get_prerope_query_states(module, hidden_states[:, -w:])
        cos, sin = (t[:, -w:] for t in position_embeddings)
        q = q * cos.unsqueeze(1) + rotate_half(q) * sin.unsqueeze(1)
        k = repeat_kv(keys, module.config.num_attention_heads // module.config.num_key_value_heads)
        a = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(module.head_dim)
        a = a + torch.triu(torch.full_like(a, float("-inf")), diagonal=n - w + 1)
        return torch.softmax(a, dim=-1, dtype=torch.float32)

    def pooled_all_keys(press, module, hidden_states, keys, kwargs):  # type: ignore[no-untyped-def]
        """SnapKV's score with the window attention pooled over ALL prompt keys before the window is cut
        off."""
        bsz, hkv, n, _ = keys.shape
        w, g = press.window_size, module.config.num_attention_heads // hkv
        a = window_attention_all_keys(module, hidden_states, keys, w, kwargs["position_embeddings"])
        s = (F.avg_pool1d(a.mean(dim=-2), kernel_size=press.kernel_size, padding=press.kernel_size // 2,
                          stride=1))
        s = s.view(bsz, hkv, g, n).mean(2)[..., : n - w]
        return F.pad(s, (0, w), value=s.max().item() + 1)

    class SnapKVPoolAll(SnapKVPress):
        """SnapKV whose window attention is pooled over ALL prompt keys (window included) before the window is
        cut off (ours), instead of pooling the pre-window keys alone with zero padding (kvpress, the
        authors)."""

        def score(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                  kwargs):
            return pooled_all_keys(self, module, hidden_states, keys, kwargs)

    class PyramidKVAligned(PyramidKVPress):
        """PyramidKV pooled as SnapKVPoolAll, with the layer budgets computed from ``k = floor(n * budget)``
        (ours) instead of the unrounded ``n * (1 - ratio)`` (and ``round()`` in the fallback)."""

        def score(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                  kwargs):
            return pooled_all_keys(self, module, hidden_states, keys, kwargs)

        def get_layer_budget(self, module, q_len):  # type: ignore[no-untyped-def]
            saved = self.compression_ratio
            k = int(q_len * (1 - saved) + 1e-9)
            self.compression_ratio = 1 - k / q_len
            try:
                return super().get_layer_budget(module, q_len)
            finally:
                self.compression_ratio = saved

    class TOVAPerKVHead(TOVAPress):
        """TOVA scored per KV head (last query's attention summed over the group's query heads; ours),
        instead of one set per layer from the mean over all heads (kvpress, the TOVA paper)."""

        def score(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                  kwargs):
            bsz, hkv, n, _ = keys.shape
            a = (SnapKVPress.compute_window_attention(module, hidden_states, keys, 1,
                                                      kwargs["position_embeddings"]))
            s = a[:, :, 0].reshape(bsz, hkv, -1, n - 1).sum(2)
            return F.pad(s, (0, 1), value=s.max().item() + 1)

    from kvpress import CriticalKVPress, LagKVPress

    class LagKVRecentTies(LagKVPress):
        """LagKV whose equal scores (the sinks and the kept last partition: 1) rank the more recent token
        first (ours), instead of ``topk``'s order among ties."""

        def score(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                  kwargs):
            s = super().score(module, hidden_states, keys, values, attentions, kwargs)
            n = s.shape[-1]
            return s + torch.arange(n, device=s.device, dtype=s.dtype) * (1e-3 / (self.lag_size * n))

    class CriticalKVWindowApart(CriticalKVPress):
        """CriticalKV over SnapKV whose first stage takes ``int(k * first_stage_ratio)`` tokens from before
        the observation window, the window kept besides (ours: the window is the recent window), instead of a
        first stage that the window's maximal SnapKV scores fill first."""

        def score(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                  kwargs):
            scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs)
            n, w = keys.shape[2], self.press.window_size
            m = int((1 - self.compression_ratio) * n * self.first_stage_ratio)
            top = scores[..., : n - w].topk(m, dim=-1).indices
            out = (scores + self.epsilon) * self.vwl1norm(values, module)
            big = torch.finfo(out.dtype).max
            out.scatter_(-1, top, big)
            out[..., n - w:] = big
            return out

    from kvpress import FinchPress, SimLayerKVPress

    class FinchFixedWindow(FinchPress):
        """Finch with a fixed question window of ``window_size`` tokens (ours), set directly: kvpress sizes it
        from a delimiter token added to the tokenizer and the embeddings, and here no token is the delimiter
        (id -1). Kept keys are not re-rotated (ours keep their positions; the recorder matches keys)."""

        def __init__(self, compression_ratio: float = 0.0, window_size: int = 64):
            super().__init__(compression_ratio=compression_ratio, rerotate_keys=False)
            self.window_size, self.delimiter_token_id = window_size, -1

    class FinchKeyCount(FinchFixedWindow):
        """Finch whose window row at position i is multiplied by its count of keys, i + 1 (ours: its non-zero
        weights), instead of by i."""

        def score(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                  kwargs):
            bsz, hkv, n, _ = keys.shape
            w, g = self.window_size, module.config.num_attention_heads // hkv
            a = SnapKVPress.compute_window_attention(module, hidden_states, keys, w,
                                                     kwargs["position_embeddings"])
            a = a * torch.arange(n - w + 1, n + 1, device=a.device, dtype=a.dtype).view(1, 1, -1, 1)
            s = a.mean(dim=-2).view(bsz, hkv, g, n - w).mean(2)
            return F.pad(s, (0, w), value=s.max().item() + 1)

    class SimLayerKVWithLast(SimLayerKVPress):
        """SimLayerKV whose recent tokens are the last ``n_recent`` up to and including the last query's own,
        in its statistic and in what a lazy layer keeps (ours), instead of the ``n_recent`` before the last
        ``n_last`` in the statistic and the last ``n_recent - n_last`` kept."""

        def is_lazy(self, module, hidden_states, keys,  # type: ignore[no-untyped-def]
                    position_embeddings):
            a = window_attention_all_keys(module, hidden_states, keys, self.n_last, position_embeddings)
            a = a.mean((0, 1, 2))
            return (a[: self.n_initial].sum() + a[-self.n_recent:].sum()).item() > self.lazy_threshold

        def compress(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                     kwargs):
            n = keys.shape[2]
            if module.layer_idx == 0:
                self.compression_ratios = []
            if (self.lazy_threshold == 1.0 or n <= self.n_initial + self.n_recent
                    or not self.is_lazy(module, hidden_states, keys, kwargs["position_embeddings"])):
                self.compression_ratios.append(0.0)
                return keys, values
            idx = torch.cat([torch.arange(self.n_initial), torch.arange(n - self.n_recent, n)])
            idx = idx.to(keys.device)
            self.compression_ratios.append(1 - len(idx) / n)
            return keys[:, :, idx], values[:, :, idx]

    from kvpress import CompactorPress, LeverageScorePress

    class LeverageSeeded(LeverageScorePress):
        """LeverageScore whose Gaussian sketch is ours: one [head_dim, k] per KV head drawn from (seed 0, the
        layer) in float64, shared by the batch, instead of kvpress's unseeded draw per sample and call. The
        rest of kvpress's arithmetic (key dtype, Cholesky with jitter) is unchanged."""

        def score(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                  kwargs):
            self.layer = module.layer_idx
            return super().score(module, hidden_states, keys, values, attentions, kwargs)

        def compute_leverage_scores(self, key_states, sketch_dimension):  # type: ignore[no-untyped-def]
            b, h, _, d = key_states.shape
            k = sketch_dimension
            g = torch.Generator().manual_seed(self.layer)  # ours: seed * 1_000_003 + layer, seed 0
            phi = torch.randn(h, d, k, generator=g, dtype=torch.float64) / k**0.5
            phi = phi.to(key_states.device, key_states.dtype).expand(b, h, d, k)
            x = torch.matmul(key_states - key_states.mean(dim=-2, keepdim=True), phi).to(torch.float32)
            xt = x.transpose(-2, -1)
            gram = xt @ x
            chol = self.chol_with_jitter(0.5 * (gram + gram.transpose(-2, -1)), jitter=1e-2, max_tries=5)
            return (x * torch.cholesky_solve(xt, chol, upper=False).transpose(-2, -1)).sum(-1).clamp_min(0)

    class CompactorSeeded(CompactorPress):
        """Compactor whose leverage part draws our sketch (:class:`LeverageSeeded`); its chunked non-causal
        attention (last chunk padded) is kvpress's."""

        def __post_init__(self) -> None:
            super().__post_init__()
            self._leverage_press = LeverageSeeded(compression_ratio=self.compression_ratio,
                                                  sketch_dimension=self.sketch_dimension)

    from kvpress.presses.non_causal_attention_press import NonCausalAttnPress

    class NonCausalRealChunks(NonCausalAttnPress):
        """Non-causal chunked attention whose last chunk holds only the real tokens (ours), instead of being
        padded with zero queries and keys that take part in its softmax and its column sums."""

        @staticmethod
        def non_causal_chunked_attn(q, k, chunk_size):  # type: ignore[no-untyped-def]
            sums = []
            for a in range(0, q.shape[-2], chunk_size):
                dots = q[..., a:a + chunk_size, :] @ k[..., a:a + chunk_size, :].transpose(-2, -1)
                sums.append(torch.softmax(dots.to(torch.float32), dim=-1).sum(dim=-2))
            return torch.cat(sums, dim=-1)

    class CompactorSeededReal(CompactorSeeded):
        """:class:`CompactorSeeded` whose chunked attention is :class:`NonCausalRealChunks`."""

        def __post_init__(self) -> None:
            super().__post_init__()
            self._non_causal_press = NonCausalRealChunks(compression_ratio=self.compression_ratio,
                                                         chunk_size=self.chunk_size)

    from kvpress import ObservedAttentionPress

    class ObservedAttentionSdpa(ObservedAttentionPress):
        """ObservedAttentionPress (kvpress's H2O: each key's attention averaged over the prompt queries that
        see it) with the prompt's causal attention computed here, so the model runs SDPA (kvpress asks for
        eager attention to be handed the weights)."""

        def score(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                  kwargs):
            a = window_attention_all_keys(module, hidden_states, keys, keys.shape[2],
                                          kwargs["position_embeddings"])
            return super().score(module, hidden_states, keys, values, a, kwargs)

    class ObservedAttentionSummed(ObservedAttentionSdpa):
        """:class:`ObservedAttentionSdpa` with each key's attention summed over the queries (H2O's column
        sums, ours) instead of averaged over the queries that see it."""

        def score(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                  kwargs):
            bsz, hkv, n, _ = keys.shape
            a = window_attention_all_keys(module, hidden_states, keys, n, kwargs["position_embeddings"])
            return a.sum(2).view(bsz, hkv, -1, n).sum(2)

    return {"SnapKVPoolAll": SnapKVPoolAll, "TOVAPerKVHead": TOVAPerKVHead,
            "ObservedAttentionSdpa": ObservedAttentionSdpa,
            "ObservedAttentionSummed": ObservedAttentionSummed,
            "LagKVRecentTies": LagKVRecentTies, "CriticalKVWindowApart": CriticalKVWindowApart,
            "PyramidKVAligned": PyramidKVAligned, "FinchFixedWindow": FinchFixedWindow,
            "FinchKeyCount": FinchKeyCount, "SimLayerKVWithLast": SimLayerKVWithLast,
            "LeverageSeeded": LeverageSeeded, "CompactorSeeded": CompactorSeeded,
            "CompactorSeededReal": CompactorSeededReal,
            **kvpress_kvzip.variant_presses(), **kvpress_wrappers.variant_presses(),
            **kvpress_decoding.variant_presses()}


def _build_press(spec: dict[str, Any], budget: float, registry: dict[str, Any]) -> Any:
    """A press from a spec; ``exact_count`` nudges the ratio so ``int(n * (1 - ratio)) == floor(n * budget)``
    (kvpress computes ``1 - (1 - budget)``, which is below ``budget`` for 0.2 and truncates one token
    lower)."""
    import kvpress

    cls = registry.get(spec["cls"]) or getattr(kvpress, spec["cls"])
    if "inner" in spec:  # a wrapper press: its scorer under ``press`` (``base_press``: CAMPress)
        return cls(**{spec.get("inner_arg", "press"): _build_press(spec["inner"], budget, registry)},
                   **spec["kw"])
    if spec.get("no_ratio"):  # a press whose own rule sets how much it keeps (SimLayerKV)
        return cls(**spec["kw"])
    ratio = 1 - budget - (1e-9 if spec.get("exact_count") else 0.0)
    return cls(compression_ratio=ratio, **spec["kw"])


def value_sum(values: Any, slots: Any) -> float:
    """The sum of the listed slots' values over the slots and dimensions (``values`` [S, D]), in float64 to
    10 significant digits: a fingerprint of one head's kept values (a merge changes it)."""
    return float(f"{values[slots].double().sum().item():.10g}")


def _record_kept(press: Any, kept: dict[int, list[list[int]]],
                 vsums: dict[int, tuple[list[float], list[float]]] | None = None) -> None:
    """Wrap ``press.compress`` so that ``kept[layer]`` gets the kept prompt positions per KV head (batch
    1), and, with ``vsums``, ``vsums[layer]`` the :func:`value_sum` of each head's kept values after and
    before the press (a merging press changes them)."""
    orig = press.compress

    def compress(module, hidden_states, keys, values, attentions, kwargs):  # type: ignore[no-untyped-def]
        v_in = values.clone() if vsums is not None else None  # CAMPress merges in place
        k_out, v_out = orig(module, hidden_states, keys, values, attentions, kwargs)
        n, heads = keys.shape[2], keys.shape[1]
        masked = getattr(module, "masked_key_indices", None)
        rows: list[list[int]] = []
        post: list[float] = []
        pre: list[float] = []
        named = getattr(press, "kept_indices", None)  # a press that rewrites the kept keys names them
        for h in range(heads):
            if named is not None:
                rows.append(sorted(named[0, h].tolist()))
            elif k_out.shape[2] != n:  # physically cut: find each surviving key among the inputs
                where = kvpress_decoding.kept_slots(k_out, keys, module.layer_idx, h)  # a list of slots
                rows.append(sorted(where))
                if v_in is not None:
                    post.append(value_sum(v_out[0, h], slice(None)))
                    pre.append(value_sum(v_in[0, h], where))
            elif masked is not None:  # AdaKV: masked, not cut
                b_idx, h_idx, s_idx = masked
                gone = set(s_idx[(b_idx == 0) & (h_idx == h)].tolist())
                rows.append([p for p in range(n) if p not in gone])
            else:
                rows.append(list(range(n)))
        kept[module.layer_idx] = rows
        if vsums is not None:
            vsums[module.layer_idx] = (post, pre)
        return k_out, v_out

    press.compress = compress


def side_kvpress(args: argparse.Namespace) -> None:
    from importlib.metadata import version

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, DynamicCache

    transformers.utils.logging.disable_progress_bar()
    spec = load_json(Path(args.prompts))
    n_new = int(spec["new_tokens"])
    model = (AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32,
                                                  attn_implementation="sdpa").eval())
    registry = _variant_presses()

    def run(press: Any, ids: list[int], kvzip: bool = False, values: bool = False,
            decode: bool = False) -> dict[str, Any]:
        if kvzip or decode:  # KVzipPress never calls compress; a decode-time press cuts generated tokens too
            runner = kvpress_kvzip.run_kvzip if kvzip else kvpress_decoding.run_decoding
            r = runner(model, press, ids, n_new)
            return {"tokens": r["tokens"], "kept": [[encode_kept(h) for h in layer] for layer in r["kept"]]}
        x = torch.tensor([ids])
        kept: dict[int, list[list[int]]] = {}
        vsums: dict[int, tuple[list[float], list[float]]] | None = {} if values else None
        kw = dict(input_ids=x, attention_mask=torch.ones_like(x), past_key_values=DynamicCache(),
                  max_new_tokens=n_new,
                  min_new_tokens=n_new, do_sample=False, pad_token_id=model.generation_config.eos_token_id)
        with torch.inference_mode():
            if press is None:
                out = model.generate(**kw)
            else:
                _record_kept(press, kept, vsums)
                with press(model):
                    out = model.generate(**kw)
        r: dict[str, Any] = {"tokens": out[0, len(ids):].tolist()}
        if press is not None:
            r["kept"] = [[encode_kept(h) for h in kept[layer]] for layer in sorted(kept)]
        if vsums:  # a merging press: the kept values after the prompt (and before its merges)
            r["vsum"] = [vsums[layer][0] for layer in sorted(vsums)]
            r["vsum_pre"] = [vsums[layer][1] for layer in sorted(vsums)]
        return r

    full = []
    for p in spec["prompts"]:
        full.append({"id": p["id"], "n": len(p["input_ids"]), **run(None, p["input_ids"])})
    done: dict[str, list[dict[str, Any]]] = {}
    methods = []
    for m in method_specs(args):
        for b in spec["budgets"]:
            key = json.dumps([m["press"], b], sort_keys=True)
            if key not in done:
                done[key] = [{"id": p["id"], "n": len(p["input_ids"]),
                              **run(_build_press(m["press"], float(b), registry), p["input_ids"],
                                    kvzip=bool(m["press"].get("kvzip")),
                                    values=bool(m["press"].get("values")),
                                    decode=bool(m["press"].get("decode")))}
                             for p in spec["prompts"]]
                print(f"[kvpress] {m['name']}@{b:g} done", flush=True)
            methods.append({"name": m["name"], "budget": b, "press": m["press"], "runs": done[key]})
    meta = {"kvpress": version("kvpress"), "transformers": transformers.__version__,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(), "attn_implementation": "sdpa"}
    dump_json(Path(args.out), {"side": "kvpress", "meta": meta, "full": full, "methods": methods})


# ---------------------------------------------------------------------------------------------------------
# our side


def _git_state() -> dict[str, Any]:
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    paths = ["keyformer/core"]  # what decides the kept sets and tokens
    return {"commit": git("rev-parse", "HEAD"), "dirty": git("status", "--porcelain", *paths).splitlines()}


def _our_value_sums(cache: Any, li: int, n: int) -> list[float]:
    """Per KV head of layer ``li`` (batch row 0), the :func:`value_sum` of the held prompt positions (<
    ``n``)."""
    layer = cache.layers[li]
    S = layer.length
    pos = layer.pos[0, :, :S]
    live = (pos >= 0) & (pos < n)
    if cache.mode == "mask":
        live &= layer.alive[0, :, :S]
    return [value_sum(layer.values[0, h], live[h].nonzero().view(-1)) for h in range(pos.shape[0])]


def side_ours(args: argparse.Namespace) -> None:
    import torch
    import transformers

    from keyformer.core.generate import generate
    from keyformer.core.policies import make_policy, policy_class

    spec = load_json(Path(args.prompts))
    n_new = int(spec["new_tokens"])
    model = our_model(args.model_dir)

    def run(policy: Any, ids: list[int], values: bool, decode: bool = False) -> dict[str, Any]:
        x = torch.tensor([ids])
        o = generate(model, x, torch.ones_like(x), policy, max_new_tokens=n_new, min_new_tokens=n_new)
        r: dict[str, Any] = {"id": None, "n": len(ids), "tokens": o.sequences[0].tolist()}
        if policy.evicts:  # the kept prompt positions (a decode-time row: every kept position)
            r["kept"] = [[encode_kept(p for p in heads if decode or p < len(ids))
                          for heads in o.cache.kept_positions(li)[0]]
                         for li in range(len(o.cache.layers))]
        if values:  # the kept prompt values (prefill-only: no later cut merges)
            r["vsum"] = [_our_value_sums(o.cache, li, len(ids)) for li in range(len(o.cache.layers))]
        return r

    def runs(policy: Any, values: bool = False, decode: bool = False) -> list[dict[str, Any]]:
        return [{**run(policy, p["input_ids"], values, decode), "id": p["id"]} for p in spec["prompts"]]

    full = runs(make_policy("full"))
    methods = []
    done: dict[str, list[dict[str, Any]]] = {}
    for m in method_specs(args):
        for b in spec["budgets"]:
            entry: dict[str, Any] = {"name": m["name"], "budget": b, "policy": m["policy"],
                                     "policy_kw": m["policy_kw"]}
            try:
                policy_class(m["policy"])  # a registered name, or a composition (snapkv+chunkkv)
            except ValueError:
                entry["skipped"] = f"policy {m['policy']!r} not registered"
            else:
                try:  # our_budget: a method whose kvpress press takes no ratio (SimLayerKV)
                    policy = make_policy(m["policy"], budget=float(m.get("our_budget", b)), **m["policy_kw"])
                except ValueError as e:
                    entry["skipped"] = str(e).split(";")[0]
                else:
                    values, decode = bool(m["press"].get("values")), bool(m["press"].get("decode"))
                    key = repr(policy) + str(values) + str(decode)
                    if key not in done:
                        done[key] = runs(policy, values, decode)
                    entry["runs"] = done[key]
            methods.append(entry)
            print(f"[ours] {m['name']}@{b:g} {entry.get('skipped', 'done')}", flush=True)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "git": _git_state()}
    dump_json(Path(args.out), {"side": "ours", "meta": meta, "full": full, "methods": methods})


# ---------------------------------------------------------------------------------------------------------
# merge


def merge(out_dir: Path) -> tuple[list[dict[str, Any]], str, str]:
    """Merged rows and the (Markdown, text) tables of ``prompts.json``, ``ours.json.gz`` and
    ``kvpress.json.gz``."""
    spec = load_json(out_dir / "prompts.json")
    ours, kv = load_json(out_dir / "ours.json.gz"), load_json(out_dir / "kvpress.json.gz")
    kv_by = {(m["name"], m["budget"]): m for m in kv["methods"]}
    rows = []
    for m in ours["methods"]:
        row: dict[str, Any] = {"method": m["name"], "budget": m["budget"]}
        k = kv_by.get((m["name"], m["budget"]))
        if m.get("skipped") or k is None:
            row["skipped"] = m.get("skipped") or "no kvpress run"
        else:
            row["metrics"] = compare_runs(m["runs"], k["runs"], ours["full"], kv["full"])
        rows.append(row)
    lens = [len(p["input_ids"]) for p in spec["prompts"]]
    full_cross = [agreement(a["tokens"], b["tokens"]) for a, b in zip(ours["full"], kv["full"], strict=True)]
    notes = [
        f"kvpress cross-check: SmolLM2-135M-Instruct fp32, {len(lens)} CNN/DailyMail prompts "
        f"({min(lens)}-{max(lens)} "
        f"tokens, chat template), {spec['new_tokens']} greedy tokens, batch 1; kvpress compression_ratio = 1 "
        f"- budget.",
        f"kvpress {kv['meta']['kvpress']} (transformers {kv['meta']['transformers']}, sdpa); ours at git "
        f"{ours['meta']['git']['commit'][:7]}"
        f"{' + uncommitted: ' + ', '.join(dirty) if (dirty := ours['meta']['git']['dirty']) else ''}"
        " "
        f"(transformers {ours['meta']['transformers']}); torch {ours['meta']['torch']}, "
        f"{ours['meta']['threads']} thread(s).",
        "Jaccard / min J: mean / min Jaccard of the kept prompt positions over (prompt, layer, KV head); "
        "ident.: share "
        "of identical sets; kept ours / kv: mean set size; cnt diff: share of sets whose sizes differ.",
        "out =: share of prompts whose greedy tokens are identical between the sides; prefix: mean common "
        "prefix "
        "(tokens); ours=full / kv=full and pfx: the same against that side's own full cache.",
        f"Full caches, ours vs kvpress: identical on {sum(e for e, _ in full_cross)}/{len(full_cross)} "
        f"prompts, "
        f"mean common prefix {statistics.fmean(p for _, p in full_cross):.1f} tokens.",
        "Rows named [kv: ...] are diagnostics: the kvpress press changed in the named respect "
        "(docs/policies_2025.md and results/crosscheck_kvpress/README.md explain them).",
    ]
    md, txt = format_tables(rows, notes)
    extra = format_values(rows)
    return rows, md + extra, txt + extra


def side_merge(args: argparse.Namespace) -> None:
    out_dir = Path(args.out_dir)
    rows, md, txt = merge(out_dir)
    (out_dir / "table.md").write_text(md)
    (out_dir / "table.txt").write_text(txt)
    (out_dir / "merged.json").write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    print(txt)


# ---------------------------------------------------------------------------------------------------------


def side_all(args: argparse.Namespace) -> None:
    run_sides(args, __spec__.name, f"python -m {__spec__.name}", side_merge,
              ext="json.gz",
              extra=[] if args.diagnostics else ["--no-diagnostics"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", default="all", choices=["all", "prompts", "kvpress", "ours", "merge"])
    ap.add_argument("--model-dir", default=None, help="converted SmolLM2 safetensors folder (default: the "
                    "loader's cache, resolved only when not given: the kvpress venv has no keyformer.run)")
    data_dir = os.environ.get("KEYFORMER_DATA_DIR")
    ap.add_argument("--data", default=str(Path(data_dir) / "cnn_dailymail.jsonl") if data_dir else None,
                    help="cnn_dailymail.jsonl (default: in $KEYFORMER_DATA_DIR)")
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.5, 0.2])
    ap.add_argument("--min-tokens", type=int, default=400, help="shortest prompt (SnapKV's 64-token window "
                                                                "fits 0.2)")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--no-diagnostics", dest="diagnostics", action="store_false", help="skip the DIAGNOSTICS "
                                                                                       "rows")
    ap.add_argument("--only", nargs="+", help="run only these method names (sides ours/kvpress)")
    ap.add_argument("--prompts", help="prompts.json (sides ours/kvpress)")
    ap.add_argument("--out", help="output JSON (sides prompts/ours/kvpress; gzip-compressed if it ends in "
                                  ".gz)")
    ap.add_argument("--out-dir", default=str(DEFAULT_OUT), help="folder of all/merge")
    args = ap.parse_args(argv)
    if args.model_dir is None:
        args.model_dir = default_model_dir()
    {"all": side_all, "prompts": side_prompts, "kvpress": side_kvpress, "ours": side_ours,
     "merge": side_merge}[args.side](args)


if __name__ == "__main__":
    main()
