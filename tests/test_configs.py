"""Every config group option composes; validation names key, value and what is allowed."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from keyformer.run.loading import gemma3_available, model_config
from keyformer.run.paths import config_dirs
from keyformer.run.validate import ConfigError, check_budget, module_available, validate

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
GROUPS = ["model", "dataset", "policy", "generation", "logger", "task"]
EXPERIMENT_DIRS = [d / "experiment" for d in config_dirs()]  # conf/ and each study's own conf/
EXPERIMENTS = sorted(p.stem for d in EXPERIMENT_DIRS for p in d.glob("*.yaml"))
# The launchers the README names: (hydra/launcher option, plugin module that provides it)
LAUNCHERS = [("joblib", "hydra_plugins.hydra_joblib_launcher"),
             ("slurm", "hydra_plugins.hydra_submitit_launcher"),
             ("submitit_slurm", "hydra_plugins.hydra_submitit_launcher"),
             ("submitit_local", "hydra_plugins.hydra_submitit_launcher")]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def make_cfg(*overrides: str, hydra_cfg: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return (compose("config", overrides=["output_dir=/tmp/unused", *overrides],
                        return_hydra_config=hydra_cfg))


def test_groups_have_expected_options():
    assert {"gptj", "cerebras_gpt", "mpt", "mpt_chat", "mpt_storywriter", "smollm2", "tiny_gptj", "tiny_gpt2",
            "tiny_mpt", "tiny_llama"} <= set(options("model"))
    assert {"cnn_dailymail", "xsum", "govreport", "soda", "dialogsum", "sample"} <= set(options("dataset"))
    # the policy group mirrors the code: one YAML per registered policy, each building that policy
    from keyformer.core.policies import POLICIES, policy_class

    targets = {o: OmegaConf.load(CONF / "policy" / f"{o}.yaml")["_target_"] for o in options("policy")}
    assert {policy_class(t).name for t in targets.values()} == set(POLICIES)
    assert all(policy_class(t).name == o for o, t in targets.items())
    assert {"greedy", "beam"} <= set(options("generation"))
    assert {"none", "wandb"} <= set(options("logger"))
    assert {"generate", "lm_eval"} <= set(options("task"))
    assert {"exp1_cnndm", "exp2_dialogsum", "exp3_govreport", "exp4_attention", "exp5_ablations",
            "exp6_speedup",
            "fewshot"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes(group, option):
    cfg = make_cfg(f"{group}={option}", *(["model.name=org/some-model"] if option == "hub" else []))
    c = OmegaConf.to_container(cfg, resolve=True)
    assert c[group]["_target_" if group == "policy" else "name"]
    if group == "policy" and option != "full":
        assert c["policy"]["budget"] == c["budget"]  # the top-level budget reaches the policy
    if group == "model":
        assert c["model"]["source"] in ("hub", "smollm2_gguf", "gemma3_gguf", "tiny")
        want = {**model_config(option), **({"name": "org/some-model"} if option == "hub" else {})}
        assert "defaults" not in c["model"] and want == c["model"]  # inheritance applied


def test_model_variants_inherit():
    """mpt_* and tiny_* variants extend one base config through their defaults list; only what differs is
    set."""
    for base, variants in {"mpt": ["mpt_chat", "mpt_storywriter"],
                           "tiny_llama": ["tiny_gptj", "tiny_gpt2", "tiny_mpt"]}.items():
        for v in variants:
            raw = OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{v}.yaml"))
            assert raw["defaults"] == [base, "_self_"] and set(raw) <= {"defaults", "name", "arch"}
            got, ref = model_config(v), model_config(base)
            assert {k for k in ref if got[k] != ref[k]} <= {"name", "arch"}


def _sweep_points(hydra_cfg) -> list[list[str]]:
    params = OmegaConf.to_container(hydra_cfg.sweeper.params) if hydra_cfg.sweeper.params else {}
    keys = list(params)
    return [[f"{k}={v}" for k, v in zip(keys, combo, strict=True)]
            for combo in itertools.product(*[str(params[k]).split(",") for k in keys])]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes(experiment):
    """Each experiment composes with the one app's config, and so does every point of its sweep."""
    cfg = make_cfg(f"+experiment={experiment}", hydra_cfg=True)
    points = _sweep_points(cfg.hydra)
    if experiment == "exp4_attention":
        assert cfg.dataset.name == "cnn_dailymail" and cfg.attention_stats.out == "results/exp4_attention"
    elif experiment == "exp6_speedup":
        bench = OmegaConf.to_container(cfg.bench, resolve=True)
        assert bench["targets"]["scoring_overhead"] > 1 and bench["groups"] and "hydra" not in bench
    else:
        folder = {"exp8_powered_extras": "exp8_powered", "exp7_quant": "exp7_field"}.get(experiment,
                                                                                         experiment)
        assert cfg.hydra.sweep.dir == f"multirun/{folder}" and points
    for point in points:
        c = OmegaConf.to_container(make_cfg(f"+experiment={experiment}", *point), resolve=True)
        for key, value in (p.split("=", 1) for p in point):
            if key == "budget":
                assert c["budget"] == float(value) and c["policy"].get("budget", c["budget"]) == float(value)
            elif key == "policy":
                assert (c["policy"]["_target_"]
                        == OmegaConf.load(CONF / "policy" / f"{value}.yaml")["_target_"])
            elif key in ("+experiment/ablation", "+experiment/exp8_arm"):
                assert c["variant"] == value
            elif key in ("+experiment/exp7_task", "+experiment/exp9_task"):
                assert c["task_tag"] == value
            elif key == "generation":
                assert c["generation"]["name"] == value
            elif key == "kv_quant":
                assert (c["kv_quant"] == OmegaConf.to_container(OmegaConf.load(CONF / "kv_quant"
                                                                               / f"{value}.yaml")))
            else:
                raise AssertionError(f"{experiment}: unexpected sweep key {key}")
        embedded_absent = c["model"]["source"] == "gemma3_gguf" and not gemma3_available()  # [gemma] extra
        if c["task"]["name"] == "generate" and os.environ.get("KEYFORMER_DATA_DIR") and not embedded_absent:
            validate(c)


def test_shared_experiment_block_is_not_copied():
    """Experiments 1-3 and 5 take their common settings from one shared file, not copies."""
    for name in ("exp1_cnndm", "exp2_dialogsum", "exp3_govreport", "exp5_ablations"):
        path = ROOT / "experiments" / name / "conf" / "experiment" / f"{name}.yaml"
        raw = OmegaConf.to_container(OmegaConf.load(path))
        assert "shared/smollm2_cpu" in raw["defaults"]
        assert "exclude_keys" not in json.dumps(raw) and "progress" not in raw


def _compose_quietly(*overrides):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = make_cfg(*overrides, hydra_cfg=True)
    assert not [str(w.message) for w in caught if "schema" in str(w.message).lower()]
    return cfg


@pytest.mark.parametrize("launcher,plugin", LAUNCHERS, ids=[name for name, _ in LAUNCHERS])
def test_launchers_compose_with_their_plugin(launcher, plugin):
    """Composed against the installed plugin's schema (CI installs the [launchers] extra), without Hydra's
    schema-matching deprecation warning."""
    if not module_available(plugin):
        pytest.skip(f"{plugin} not installed (pip install -e '.[launchers]')")
    from hydra.utils import get_class

    extra = ["hydra.launcher.partition=gpu"] if "slurm" in launcher else []
    cfg = _compose_quietly(f"hydra/launcher={launcher}", *extra)
    get_class(cfg.hydra.launcher._target_)
    if launcher == "slurm":
        assert cfg.hydra.launcher.gpus_per_node == 1 and cfg.hydra.launcher.partition == "gpu"


def test_slurm_launcher_renders_its_sbatch_script(tmp_path, monkeypatch):
    """The README's SLURM command up to the submission: the plugin maps the config to submitit's SLURM
    executor, which validates every parameter and renders the sbatch script (a stub `srun` stands in for
    the cluster; nothing is submitted)."""
    if not module_available("hydra_plugins.hydra_submitit_launcher"):
        pytest.skip("hydra-submitit-launcher not installed")
    import submitit
    from hydra.utils import instantiate

    (tmp_path / "srun").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    cfg = _compose_quietly("hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.job.name=run",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}")
    launcher = instantiate(cfg.hydra.launcher)
    launcher.config = cfg
    seen = {}

    def render(self, fn, *args):
        seen["n_jobs"] = len(args[0])
        seen["sbatch"] = self._executor._make_submission_file_text("python -u -m submitit", "0")
        return []

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", render)
    assert launcher.launch([["policy=full"], ["policy=h2o"]], 0) == []
    assert seen["n_jobs"] == 2
    for line in ("--partition=gpu", "--gpus-per-node=1", "--time=240", "--mem=64GB", "--cpus-per-task=8"):
        assert f"#SBATCH {line}" in seen["sbatch"]


def _sweep(tmp_path, *overrides):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", "model=tiny_llama", "n_samples=1",
           "dataset.n_paragraphs=2",
           "generation.max_new_tokens=4", "max_prompt_tokens=256", "warmup=false", "progress=false",
           "policy=full,window", f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    metrics = sorted((tmp_path / "sweep").glob("*/metrics.json"))
    assert len(metrics) == 2 and all(json.loads(m.read_text())["complete"] for m in metrics)
    return r


@pytest.mark.slow
def test_tiny_sweep_through_submitit_local(tmp_path):
    """submitit's local executor: the code path SLURM users get, on this machine."""
    if not module_available("hydra_plugins.hydra_submitit_launcher"):
        pytest.skip("hydra-submitit-launcher not installed")
    _sweep(tmp_path, "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10")
    assert list((tmp_path / "sweep" / ".submitit").iterdir())


@pytest.mark.slow
def test_tiny_sweep_through_joblib_is_quiet(tmp_path):
    if not module_available("hydra_plugins.hydra_joblib_launcher"):
        pytest.skip("hydra-joblib-launcher not installed")
    r = _sweep(tmp_path, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert "schema" not in r.stderr.lower() and "deprecated" not in r.stderr.lower()


def test_defaults():
    c = OmegaConf.to_container(make_cfg(), resolve=True)
    assert (c["model"]["name"], c["dataset"]["name"], c["policy"]["_target_"]) == (
        "HuggingFaceTB/SmolLM2-135M-Instruct", "sample", "keyformer.core.policies.keyformer.KeyformerPolicy")
    assert c["budget"] == 0.5 and c["recent"] == 0.3 and c["policy"]["budget"] == 0.5
    assert c["generation"]["num_beams"] == 1 and c["n_samples"] <= 16
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
    ("budget=1.5", "budget"), ("budget=0", "budget"), ("n_samples=0", "n_samples"),
                                          ("batch_size=0", "batch_size"),
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


ABLATIONS = ROOT / "experiments" / "exp5_ablations" / "conf" / "experiment" / "ablation"


@pytest.mark.parametrize("variant", sorted(p.stem for p in ABLATIONS.glob("*.yaml")))
def test_ablation_variants_take_effect_in_sweep_order(variant):
    """The exp5 sweep composes ``+experiment/ablation=<v> +experiment=exp5_ablations`` (in that order), so a
    key that the experiment file also sets would silently undo the variant. Every key a variant sets must
    survive."""
    cfg = OmegaConf.to_container(make_cfg(f"+experiment/ablation={variant}", "+experiment=exp5_ablations"),
                                 resolve=True)
    want = OmegaConf.to_container(OmegaConf.load(ABLATIONS / f"{variant}.yaml"))

    def check(w, c, path):
        for k, v in w.items():
            if isinstance(v, dict):
                check(v, c[k], f"{path}{k}.")
            else:
                assert c[k] == v, f"{variant}: {path}{k} = {c[k]!r}, the variant sets {v!r}"

    check(want, cfg, "")


QUEUES = sorted((ROOT / "experiments").glob("*/queues/*.txt"))


@pytest.mark.parametrize("queue", QUEUES, ids=[q.stem for q in QUEUES])
def test_queue_points_compose_into_their_sweep_folders(queue: Path):
    """Each line of a run_points.sh queue composes, asks for the records its config runs, and writes into the
    sweep folder `python run.py -m` would use, under a name that states its budget, policy and
    quantization."""
    lines = [ln.split() for ln in queue.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines and len({ln[0] for ln in lines}) == len(lines)  # one folder per point
    for folder, records, *overrides in lines:
        cfg = make_cfg(*overrides, hydra_cfg=True)
        c = OmegaConf.to_container(cfg, resolve=False)
        assert int(records) == c["n_samples"], (folder, records)
        # a subset (a reproduction check) goes elsewhere
        if not any(o.startswith("n_samples=") for o in overrides):
            assert folder.startswith(cfg.hydra.sweep.dir + "/"), (folder, cfg.hydra.sweep.dir)
        name = dict(kv.split("=", 1) for kv in Path(folder).name.split(",") if "=" in kv)
        assert float(name.get("budget", cfg.budget)) == float(cfg.budget)
        if "policy" in name:  # a name or a composition scorer+wrapper[+wrapper...] (policy.wrap)
            base, *wrap = name["policy"].split("+")
            assert cfg.policy["_target_"] == OmegaConf.load(CONF / "policy" / f"{base}.yaml")["_target_"]
            assert list(cfg.policy.get("wrap") or []) == wrap, (folder, cfg.policy.get("wrap"))
        if "kv_quant" in name:
            assert cfg.kv_quant.bits == int(name["kv_quant"].removeprefix("int"))
        if "generation" in name:
            assert cfg.generation.name == name["generation"]
        if "seed" in name:
            assert cfg.seed == int(name["seed"])
