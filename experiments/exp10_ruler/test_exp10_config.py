"""Experiment 10's configs: the haystack it pins, and every committed queue line through them."""

from __future__ import annotations

import re
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
RULER_NEW_TOKENS = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50}
GENERATED_ESSAY_SHA = "b69026df5ac716b97e9730607e71ed050e321c83092aa0e81532e5b91db982d7"
CNNDM_NIAH2_SHA = "fd87e2ef85e056e9bb9c0d3ea92a2ed1d0f9b885384b0707ccfb6b5e98642e84"


def _compose(*overrides: str, hydra_cfg: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=["output_dir=/tmp/unused", *overrides],
                       return_hydra_config=hydra_cfg)


def test_experiment_10_pins_the_cnn_dailymail_haystack():
    for exp in ("exp10_ruler", "exp10_ruler_gemma"):
        c = OmegaConf.to_container(_compose(f"+experiment={exp}"), resolve=True)
        assert c["dataset"]["essay_source"] == "file" and c["dataset"]["essay_file"] == "cnn_dailymail.jsonl"
    # every committed exp10 queue line runs through those experiment configs
    for q in sorted((ROOT / "experiments" / "exp10_ruler" / "queues").glob("exp10_*.txt")):
        lines = [ln for ln in q.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        assert lines and all(re.search(r"\+experiment=exp10_ruler(_gemma)?\b", ln) for ln in lines), q
        assert not any("essay_source" in ln for ln in lines)
    assert OmegaConf.load(CONF / "dataset" / "ruler.yaml")["essay_source"] == "generated"
