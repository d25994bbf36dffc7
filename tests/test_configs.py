"""Every config group option composes; validation names key, value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from keyformer.errors import ConfigError, check_budget, validate

CONF = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ["model", "dataset", "policy", "generation", "logger"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def make_cfg(*overrides: str, hydra_cfg: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=["output_dir=/tmp/unused", *overrides], return_hydra_config=hydra_cfg)


def test_groups_have_expected_options():
    assert {"gptj", "cerebras_gpt", "mpt", "mpt_chat", "mpt_storywriter", "smollm2", "tiny_gptj", "tiny_gpt2",
            "tiny_mpt", "tiny_llama"} <= set(options("model"))
    assert {"cnn_dailymail", "xsum", "govreport", "soda", "dialogsum", "sample"} <= set(options("dataset"))
    assert set(options("policy")) == {"full", "window", "streaming", "h2o", "keyformer"}
    assert {"greedy", "beam"} <= set(options("generation"))
    assert {"none", "wandb"} <= set(options("logger"))
    assert {"joblib", "submitit_slurm"} <= set(options("hydra/launcher"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes(group, option):
    cfg = make_cfg(f"{group}={option}")
    c = OmegaConf.to_container(cfg, resolve=True)
    assert c[group]["_target_" if group == "policy" else "name"]
    if group == "policy" and option != "full":
        assert c["policy"]["budget"] == c["budget"]  # the top-level budget reaches the policy
    if group == "model":
        assert c["model"]["source"] in ("hub", "smollm2_gguf", "tiny")


@pytest.mark.parametrize("launcher", options("hydra/launcher"))
def test_launchers_compose_without_plugins(launcher):
    cfg = make_cfg(f"hydra/launcher={launcher}", hydra_cfg=True)
    assert cfg.hydra.launcher._target_.startswith("hydra_plugins.")


def test_defaults():
    c = OmegaConf.to_container(make_cfg(), resolve=True)
    assert (c["model"]["name"], c["dataset"]["name"], c["policy"]["_target_"]) == (
        "HuggingFaceTB/SmolLM2-135M-Instruct", "sample", "keyformer.policies.keyformer.KeyformerPolicy")
    assert c["budget"] == 0.5 and c["recent"] == 0.3 and c["policy"]["budget"] == 0.5
    assert c["generation"]["num_beams"] == 1 and c["n_samples"] <= 8
    assert c["model"]["chat_template"] is True


def test_output_dirs_are_hydra_dirs():
    cfg = make_cfg(hydra_cfg=True)
    assert OmegaConf.to_container(cfg.hydra.run)["dir"].startswith("outputs/")
    assert cfg.hydra.sweep.dir.startswith("multirun/")
    raw = OmegaConf.load(CONF / "config.yaml")
    assert OmegaConf.to_container(raw)["output_dir"] == "${hydra:runtime.output_dir}"


def test_budget_rules():
    for ok in (0.5, 1.0, 1, 64):
        check_budget(ok)
    for bad in (0.0, 1.5, -0.2, 0, -3, "half", True):
        with pytest.raises(ConfigError, match="budget"):
            check_budget(bad)


@pytest.mark.parametrize("override,key", [
    ("budget=1.5", "budget"), ("budget=0", "budget"), ("n_samples=0", "n_samples"), ("batch_size=0", "batch_size"),
    ("dtype=fp8", "dtype"), ("device=tpu", "device"), ("recent=2.0", "recent"),
    ("generation.max_new_tokens=0", "generation.max_new_tokens"),
])
def test_validate_rejects(override, key):
    c = OmegaConf.to_container(make_cfg("model=tiny_llama", override), resolve=True)
    with pytest.raises(ConfigError) as e:
        validate(c)
    assert e.value.key.startswith(key)
    assert override.split("=")[1] in str(e.value)


def test_validate_requires_present_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    c = OmegaConf.to_container(make_cfg("device=cuda"), resolve=True)
    with pytest.raises(ConfigError, match="CUDA is not available"):
        validate(c)


@pytest.mark.parametrize("variant", sorted(p.stem for p in (CONF / "experiment" / "ablation").glob("*.yaml")))
def test_ablation_variants_take_effect_in_sweep_order(variant):
    """The exp5 sweep composes ``+experiment/ablation=<v> +experiment=exp5_ablations`` (in that order), so a
    key that the experiment file also sets would silently undo the variant. Every key a variant sets must
    survive."""
    cfg = OmegaConf.to_container(make_cfg(f"+experiment/ablation={variant}", "+experiment=exp5_ablations"),
                                 resolve=True)
    want = OmegaConf.to_container(OmegaConf.load(CONF / "experiment" / "ablation" / f"{variant}.yaml"))

    def check(w, c, path):
        for k, v in w.items():
            if isinstance(v, dict):
                check(v, c[k], f"{path}{k}.")
            else:
                assert c[k] == v, f"{variant}: {path}{k} = {c[k]!r}, the variant sets {v!r}"

    check(want, cfg, "")
