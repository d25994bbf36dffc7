"""Experiment 7's quantization bytes and Pareto fronts, by hand."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.exp7_field import findings as exp7

ROOT = Path(__file__).resolve().parents[2]
RES = ROOT / "results"
PROV = ["code_version", "git_commit", "device", "dtype", "batch_size", "provenance", "committed_in"]


def test_quant_bytes_by_hand(tmp_path: Path, capsys) -> None:
    """fp32 K+V slot = 2 * d * 4 bytes; int8 slot = 2 * d + fp16 scale and zero per 32 values; + 12 bytes
    state."""
    d = tmp_path / "exp7_field" / "cnndm"
    d.mkdir(parents=True)
    # positions written: prompt + generated - 1; 6 layer-heads of head_dim 64 (512 fp32 bytes each)
    n_tok = 100
    held = 30 * 6  # an H2O point holding 30 slots in each of the 6 layer-heads
    # head_dim 64: 128 code bytes + (2 groups x K/V) x (scale, zero) x 2 bytes
    int8_slot = 2 * 64 + 2 * 2 * 2 * 2
    rows = [("budget=1.0,policy=full", "full", 1.0, None, n_tok * 6 * 512),
            ("budget=0.3,policy=h2o", "h2o", 0.3, None, held * 512),
            ("budget=0.3,kv_quant=int8,policy=h2o", "h2o", 0.3, 8, held * int8_slot)]  # points.csv: bits
    pd.DataFrame([{"point": p, "policy": pol, "budget": b, "kv_quant": q, "kv_bytes": kv, "rouge2": 1.0,
                   "complete": True} for p, pol, b, q, kv in rows]).to_csv(d / "points.csv", index=False)
    pd.DataFrame([{"point": p, "id": "a", "prompt_tokens": 90, "generated_tokens": 11, "kv_bytes": kv,
                   "kv_bytes_full": n_tok * 6 * 512} for p, *_, kv in rows]).to_csv(d / "samples.csv",
                                                                                    index=False)
    exp7.quant_bytes(tmp_path)
    out = capsys.readouterr().out
    full = n_tok * 6 * 512
    h2o = held * 512
    q8 = held * int8_slot
    state = held * 12
    assert (f"| budget=0.3,policy=h2o | 1.00 | {h2o / full:.3f} | {h2o / full:.3f} | "
            f"{(h2o + state) / full:.3f} | "
            f"{(h2o / 2 + state) / (full / 2):.3f} |") in out
    assert (f"| budget=0.3,kv_quant=int8,policy=h2o | 1.00 | {q8 / full:.3f} | {q8 / (full / 2):.3f} | "
            f"{(q8 + state) / full:.3f} | {(q8 + state) / (full / 2):.3f} |") in out
    assert "6 layer-heads per token" in out


def test_pareto_front_depends_on_the_kv_dtype(tmp_path: Path, capsys) -> None:
    """An eviction point at 0.3 holds more bytes than full int8 in fp32 (300 x 512 > 1000 x 144, state aside)
    and scores less, but in 16 bits its tensors halve while the int8 codes do not: it joins the front."""
    d = tmp_path / "exp7_field" / "cnndm"
    d.mkdir(parents=True)
    full = 1000 * 512  # 1000 layer-head slots of fp32 K+V
    rows = [("full", 1.0, None, full, 10.0), ("full8", 1.0, 8, 1000 * 144, 9.0),
            ("h2o", 0.3, None, 300 * 512, 8.5)]
    pd.DataFrame([{"point": p, "policy": p.rstrip("8"), "budget": b, "kv_quant": q, "kv_bytes": kv,
                   "rouge2": m,
                   "complete": True} for p, b, q, kv, m in rows]).to_csv(d / "points.csv", index=False)
    pd.DataFrame([{"point": p, "id": "a", "rouge2": m} for p, *_, m in rows]).to_csv(d / "samples.csv",
                                                                                     index=False)
    exp7.pareto_bytes(tmp_path)
    out = capsys.readouterr().out
    # fp32: h2o (300 x 524 bytes with state) > full int8 (1000 x 156): dominated; 16-bit: 300 x 268 < 156000
    assert "| cnndm | rouge2 | full@1+int8, full@1 | h2o@0.3, full@1+int8, full@1 |" in out
