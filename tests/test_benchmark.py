"""The one-command RULER benchmark (conf/benchmark/ruler.yaml) and the generated essay haystack."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import keyformer.run  # noqa: F401 - registers the project's OmegaConf resolvers
from keyformer.run.data.loaders import load_records
from keyformer.run.data.ruler import TASKS, generated_essay_words, needs_essay, tokens_to_generate
from keyformer.run.loading import model_config
from keyformer.run.validate import ConfigError

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
RULER_NEW_TOKENS = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50}  # RULER's synthetic.yaml
# sha256 of json.dumps(record, sort_keys=True) of record 0 of niah_single_2 at 4096 SmolLM2 tokens over
# $KEYFORMER_DATA_DIR/cnn_dailymail.jsonl, computed before the generated haystack existed (experiment 10)
# sha256 of the first 5000 words of the generated essay (wonderwords 3.0.1's lists)
GENERATED_ESSAY_SHA = "b69026df5ac716b97e9730607e71ed050e321c83092aa0e81532e5b91db982d7"
CNNDM_NIAH2_SHA = "fd87e2ef85e056e9bb9c0d3ea92a2ed1d0f9b885384b0707ccfb6b5e98642e84"


def _compose(*overrides: str, hydra_cfg: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=["output_dir=/tmp/unused", *overrides],
                       return_hydra_config=hydra_cfg)


def _points(cfg) -> list[str]:
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    assert list(params) == ["dataset.ruler_task"]
    return str(params["dataset.ruler_task"]).split(",")


def test_benchmark_sweeps_every_task_with_its_tokens_to_generate():
    cfg = _compose("+benchmark=ruler", "model=tiny_qwen3", hydra_cfg=True)
    tasks = _points(cfg)
    assert sorted(tasks) == sorted(TASKS) and len(tasks) == 11
    assert str(cfg.hydra.sweep.dir).startswith("multirun/ruler/")
    for task in tasks:
        c = OmegaConf.to_container(_compose("+benchmark=ruler", "model=tiny_qwen3", "policy=h2o",
                                            "budget=0.25", f"dataset.ruler_task={task}"), resolve=True)
        want = RULER_NEW_TOKENS["niah" if task.startswith("niah") else task]
        assert c["generation"]["max_new_tokens"] == want == tokens_to_generate(task), task
        assert c["dataset"]["name"] == "ruler" and c["dataset"]["essay_source"] == "generated"
        assert c["max_prompt_tokens"] == c["dataset"]["length"] + 256
        assert c["generation"]["stop"] == [] and c["budget"] == 0.25 and c["model"]["arch"] == "qwen3"
    c = OmegaConf.to_container(_compose("+benchmark=ruler", "dataset.length=8192", "dataset.ruler_task=vt"),
                               resolve=True)
    assert c["max_prompt_tokens"] == 8192 + 256 and c["generation"]["max_new_tokens"] == 30


def test_an_unknown_task_in_the_benchmark_is_one_config_error():
    from keyformer.run.data.loaders import check_options

    c = OmegaConf.to_container(_compose("+benchmark=ruler", "dataset.ruler_task=niah_9"), resolve=True)
    with pytest.raises(ConfigError, match=r"dataset.ruler_task='niah_9'.*niah_single_1"):
        check_options(c["dataset"])


def test_generated_essay_is_deterministic_prefix_stable_and_digit_free():
    long = generated_essay_words(5000)
    assert len(long) == 5000 and generated_essay_words(300) == long[:300]
    text = " ".join(long)
    assert not re.search(r"\d", text) and text.count(".") > 300
    assert len(set(long)) > 1000  # not a repeated block
    # pinned: a change of the generator changes every essay record
    assert hashlib.sha256(text.encode()).hexdigest() == GENERATED_ESSAY_SHA
    assert " ".join(long[:9]) == "Later that day, the imaginary tour began to misspell."


def test_essay_tasks_need_no_data_dir_with_the_generated_haystack(monkeypatch):
    monkeypatch.delenv("KEYFORMER_DATA_DIR", raising=False)
    ds = dict(OmegaConf.to_container(OmegaConf.load(CONF / "dataset" / "ruler.yaml")), length=512, n=2)
    for task in [t for t in TASKS if needs_essay(t)]:
        recs = load_records({**ds, "ruler_task": task}, 2, 0, model_config("tiny_llama"))
        assert len(recs) == 2 and all(r["ruler_tokens"] <= 512 - 128 for r in recs)
        for r in recs:
            assert all(a in r["document"] for a in r["answers"])  # the needles are in the haystack
            assert "imaginary tour" in r["document"]
    from keyformer.run.data.loaders import DataError, check_source

    with pytest.raises(DataError, match="essay_source=generated"):
        check_source({**ds, "ruler_task": "niah_single_2", "essay_source": "file"})
    with pytest.raises(ConfigError, match=r"dataset.essay_source='essays'.*generated, file"):
        from keyformer.run.data.loaders import check_options

        check_options({**ds, "ruler_task": "niah_single_2", "essay_source": "essays"})


@pytest.mark.skipif(not os.environ.get("KEYFORMER_DATA_DIR"), reason="needs KEYFORMER_DATA_DIR (CNN/DM)")
def test_experiment_10_records_are_unchanged():
    """Experiment 10's niah_single_2 record 0 is byte-identical to before, and its prompt has the committed
    number of tokens (results/exp10_ruler/aware/samples.csv, policy=full)."""
    from keyformer.run.data.prompts import encode_prompt
    from keyformer.run.loading import load_tokenizer
    from keyformer.run.tasks.generate import _with_prefix

    c = OmegaConf.to_container(_compose("+experiment=exp10_ruler", "dataset.ruler_task=niah_single_2"),
                               resolve=True)
    (rec,) = load_records(c["dataset"], 1, 0, c["model"])
    assert hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest() == CNNDM_NIAH2_SHA
    tok = load_tokenizer(c["model"])
    ids, cut = _with_prefix(tok, rec, encode_prompt(tok, rec, c["dataset"]["template"], "",
                                                    c["max_prompt_tokens"], True, c["dataset"]["truncation"]))
    with open(ROOT / "results" / "exp10_ruler" / "aware" / "samples.csv", newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["id"] == rec["id"] and "policy=full" in r["point"])
    assert cut == 0 and len(ids) == int(row["prompt_tokens"])


def test_a_ruler_prompt_over_the_limit_is_refused_not_cut(tmp_path):
    from keyformer.run.tasks.generate import check_uncut, run

    cfg = {"max_prompt_tokens": 300, "generation": {"max_new_tokens": 30}}
    rec = {"id": "ruler-vt-L512-0000", "ruler_task": "vt", "ruler_length": 512}
    check_uncut(rec, 280, 0, 300, cfg)  # fits
    check_uncut({"id": "x"}, 300, 50, 300, cfg)  # other datasets keep their truncation rule
    with pytest.raises(ConfigError, match=r"has 350 tokens, more than the limit 300 \(max_prompt_tokens=300"):
        check_uncut(rec, 300, 50, 300, cfg)
    c = OmegaConf.to_container(_compose("+benchmark=ruler", "model=tiny_llama", "dataset.ruler_task=vt",
                                        "dataset.length=512", "n_samples=1", "dataset.n=1",
                                        "max_prompt_tokens=300", "warmup=false", "progress=false",
                                        f"output_dir={tmp_path / 'out'}"),
                               resolve=True)
    with pytest.raises(ConfigError, match=r"RULER prompt ruler-vt-L512-0000 has \d+ tokens, more than the "
                                          r"limit 300 \(max_prompt_tokens=300\)"):
        run(c)
    assert not (tmp_path / "out" / "predictions.jsonl").exists()


@pytest.mark.slow
def test_one_command_runs_the_whole_benchmark_on_a_tiny_model(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("KEYFORMER_DATA_DIR", None)  # the generated haystack needs no data
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", "+benchmark=ruler", "model=tiny_qwen3", "policy=h2o",
           "budget=0.5", "dataset.length=512", "n_samples=1", "dataset.n=1", "warmup=false", "progress=false",
           f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    metrics = [json.loads(p.read_text()) for p in sorted((tmp_path / "sweep").glob("*/metrics.json"))]
    assert len(metrics) == 11 and all(m["complete"] and m["dataset"] == "ruler" for m in metrics)
    seen = {}
    for p in sorted((tmp_path / "sweep").glob("*/predictions.jsonl")):
        row = json.loads(p.read_text().splitlines()[0])
        seen[row["ruler_task"]] = json.loads((p.parent / "metrics.json").read_text())["generation"]
        assert row["truncated_tokens"] == 0 and "string_match_all" in row
    assert set(seen) == set(TASKS)
    assert all(g["max_new_tokens"] == tokens_to_generate(t) for t, g in seen.items())
