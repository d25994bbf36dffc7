"""Smoke tests of the performance benchmark on a tiny random model (CPU, no network, a few seconds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from keyformer.lab.bench import cpu as bench
from keyformer.lab.bench import memory
from keyformer.run.paths import compose

ROOT = Path(__file__).resolve().parents[1]


def tiny_cfg(out: Path) -> dict[str, Any]:
    cfg = OmegaConf.create(compose(["+bench=default"])["bench"])  # the benchmark's own config
    cfg.merge_with(OmegaConf.create({
        "model_name": "tiny", "prompt": "random", "new_tokens": 3, "rounds": 1, "bandwidth_mb": 8,
        "warmup": {"prompt_len": 16, "new_tokens": 2}, "out_dir": str(out), "data_dir": "/nonexistent",
        "groups": [{"prompt_len": 48, "batch": 1, "budgets": [0.5], "hf_baseline": True},
                   {"prompt_len": 32, "batch": 2, "budgets": [0.5], "policies": ["window", "keyformer"]}],
        "e2e": {"rounds": 1, "runs": [{"prompt_len": 32, "batch": 2, "new_tokens": 4, "policy": "keyformer",
                                        "budget": 0.5}]},
        "throughput": {"prompt_len": 32, "new_tokens": 4, "full_batch": 1, "rounds": 1},
        "ops": {"group": 0, "steps": 2},
        "targets": {"prefill_prompt_len": 48, "decode_points": [[48, 1], [32, 2]]},
    }))
    c = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(c, dict)
    return {str(k): v for k, v in c.items()}


def test_bench_smoke(tmp_path: Path) -> None:
    report = bench.run(tiny_cfg(tmp_path), log=lambda s: None)
    for name in ("bench.json", "bench.csv", "table.txt", "command.txt"):
        assert (tmp_path / name).is_file()
    labels = {(r["group"], r["label"]) for r in report["rows"]}
    assert ("L48xB1", "hf") in labels and ("L48xB1", "hf_static") in labels and ("L32xB2",
                                                                                 "keyformer@0.5") in labels
    assert ("L32xB2", "h2o@0.5") not in labels  # per-group policies
    assert [t["id"] for t in report["targets"]] == [1, 2, 3, 4, 5, 6, 7]
    assert all(t["met"] is not None for t in report["targets"])  # every target measured
    e2e = report["e2e"][0]
    assert e2e["speedup"] > 0 and e2e["predicted_speedup"] > 0 and len(e2e["policy_s_runs"]) == 1
    for r in report["rows"]:
        assert r["decode_ms_stats"]["n"] >= 1 and r["prefill_s_median"] > 0
        assert r["kv_tensor_bytes"] >= r["kv_live_bytes"] > 0
    full = next(r for r in report["rows"] if r["group"] == "L48xB1" and r["policy"] == "full")
    half = next(r for r in report["rows"] if r["group"] == "L48xB1" and r["label"] == "keyformer@0.5")
    assert half["kv_live_bytes"] < full["kv_live_bytes"] and half["predicted_speedup"] > 1.0
    # target 7 on the tiny model: the transformers DynamicCache concatenates the whole cache (positive
    # control)
    ops = report["ops"]
    assert ops["hf"]["whole_cache_cat"]
    assert not any(v["whole_cache_cat"] for k, v in ops.items() if not k.startswith("hf"))
    tp = report["throughput"]
    assert tp["policy"]["batch"] >= tp["full"]["batch"] and tp["e2e_gain"] > 0
    assert json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert "Target 7" in (tmp_path / "table.txt").read_text()


def test_stats_helpers() -> None:
    s = bench.spread([3.0, 1.0, 2.0, 10.0])
    assert s["median"] == 2.5 and s["min"] == 1.0 and s["max"] == 10.0 and s["q1"] <= s["median"] <= s["q3"]
    assert bench.spread([])["n"] == 0
    assert bench.make_prompts(list(range(100)), 50, 10, 3, 0).shape == (3, 10)
    assert bench.make_prompts(None, 50, 10, 2, 0).max() < 50


def test_cpu_name_tells_zen3_from_zen4() -> None:
    """Two hosts that both call themselves "AMD EPYC" get different names (a journal keys on this name)."""
    def info(model: str, flags: str) -> str:
        return (f"processor\t: 0\ncpu family\t: 25\nmodel\t\t: {model}\nmodel name\t: AMD EPYC\nflags\t\t: "
                f"{flags}\n\nprocessor\t: 1\nmodel name\t: other\n")
    zen3 = bench.cpu_name(info("1", "fpu sse avx2 fma"))
    zen4 = bench.cpu_name(info("17", "fpu avx2 avx512f avx512_bf16"))
    assert zen3 == "AMD EPYC (family 25 model 1, AVX2)" and zen4 == "AMD EPYC (family 25 model 17, AVX-512)"
    assert bench.cpu_name("model name\t: X\nflags\t: avx2 amx_tile avx512f\n") == "X (AMX)"


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")
def test_peak_rss_reset() -> None:
    assert memory.reset_peak_rss()
    assert bench.peak_rss_mb() >= bench.rss_mb() > 0
    assert memory.start_peak() == pytest.approx(bench.rss_mb(), abs=64)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")
def test_trim_heap_gives_freed_heap_memory_back() -> None:
    """Freed mid-size blocks below a live one stay in the process (glibc trims only the heap's top) until
    trim_heap; a peak-RSS increase measured from such a baseline would not be the run's own."""
    blocks = [bytearray(50_000) for _ in range(2000)]  # under glibc's mmap threshold: heap memory
    for b in blocks:
        b[::4096] = b"\1" * len(b[::4096])  # touched: resident
    keep = blocks[-1]
    del blocks[:-1]
    held = memory.status_mb("VmRSS")
    if not memory.trim_heap():
        pytest.skip("no malloc_trim in this C library")
    assert memory.status_mb("VmRSS") < held - 50  # 95 MiB were freed
    assert len(keep) == 50_000


@pytest.mark.slow
def test_gpu_bench_tiny(tmp_path: Path) -> None:
    from keyformer.lab.bench import gpu as gpu_bench

    gpu_bench.main(["--tiny", "--models", "mpt", "--lengths", "8", "--max-batch", "2", "--gen-cap", "4",
                    "--out", str(tmp_path)])
    cells = json.loads((tmp_path / "gpu_bench.json").read_text())["cells"]
    thr = next(c for c in cells if c.get("kind") == "throughput")
    assert thr["runs"]["full"]["max_batch"] == 2 and thr["runs"]["keyformer"]["tokens_per_s"] > 0
    assert any(c.get("kind") == "latency" for c in cells)
