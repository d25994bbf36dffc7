"""A policy from outside the package (``policy._target_=mypkg.MyPolicy``, a module on PYTHONPATH) gets the
built-in policies' validation and recording through ``run.py``, and :func:`keyformer.check_policy`
passes it or names the check it breaks."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from keyformer.core.contract import CHECKS, ContractError, check_policy
from keyformer.core.policies import POLICIES

ROOT = Path(__file__).resolve().parents[1]

MODULE = textwrap.dedent('''
    from dataclasses import dataclass
    from typing import ClassVar

    import torch

    from keyformer.core.policies import Context, ScorePolicy


    @dataclass
    class Squared(ScorePolicy):
        """Accumulated attention raised to ``sharpen``."""

        sharpen: float = 2.0
        name: ClassVar[str] = "outside_squared"

        def __post_init__(self) -> None:
            super().__post_init__()
            if self.sharpen <= 0:
                raise ValueError(f"sharpen={self.sharpen!r} must be > 0")

        def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
            return probs.pow_(self.sharpen)


    @dataclass
    class Hoarder(ScorePolicy):
        """Broken: its own budget rule keeps the whole prompt whatever ``budget`` says."""

        name: ClassVar[str] = "outside_hoarder"

        def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
            return probs

        def budget_tokens(self, n: torch.Tensor) -> torch.Tensor:
            return n.clone()


    @dataclass
    class Shuffler(ScorePolicy):
        """Broken: a random priority, so the physical cache and the mask simulation keep different tokens."""

        name: ClassVar[str] = "outside_shuffler"

        def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
            return probs

        def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
            return torch.rand_like(state)


    NOT_A_POLICY = 3
''')


@pytest.fixture(scope="module")
def pkg(tmp_path_factory) -> Path:
    """``outside_pol.py`` in a fresh folder, importable in this process (and the subprocesses' PYTHONPATH)."""
    root = tmp_path_factory.mktemp("pkg")
    (root / "outside_pol.py").write_text(MODULE)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(root))
        yield root
    sys.modules.pop("outside_pol", None)
    for name in ("outside_squared", "outside_hoarder", "outside_shuffler"):
        POLICIES.pop(name, None)


def _run(pkg: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{pkg}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(ROOT / "run.py"), "model=tiny_llama", "n_samples=2",
                           "budget=0.5", "policy=h2o", f"output_dir={out}", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_run_records_the_outside_class_and_its_knobs(pkg, tmp_path):
    r = _run(pkg, tmp_path / "run", "policy._target_=outside_pol.Squared", "+policy.sharpen=3.0")
    assert r.returncode == 0, r.stderr[-2000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["policy"] == "outside_squared"
    assert metrics["policy_target"] == "outside_pol.Squared"
    assert metrics["policy_spec"] == {"name": "outside_squared", "budget": 0.5, "recent": 0.3,
                                      "prefill_only": False, "sliding": "auto", "sharpen": 3.0}
    cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert cfg["policy"] == {"_target_": "outside_pol.Squared", "budget": 0.5, "recent": 0.3, "wrap": [],
                             "sharpen": 3.0}


@pytest.mark.parametrize(("args", "needle"), [
    (["policy._target_=outside_pol.Squared", "+policy.sharpen=-1.0"], "sharpen=-1.0 must be > 0"),
    (["policy._target_=outside_pol.Squared", "+policy.sharp=3.0"], "has no option(s) ['sharp']"),
    (["policy._target_=outside_pol.NOT_A_POLICY"], "not a keyformer Policy subclass"),
    (["policy._target_=outside_pol.Missing"], "has no 'Missing'"),
    (["policy._target_=no_such_pkg.MyPolicy"], "cannot be imported (ModuleNotFoundError"),
    (["policy._target_=keyformer.core.policies.base.ScorePolicy"], "has no name of its own"),
])
def test_bad_targets_and_knobs_are_refused_in_one_line(pkg, tmp_path, args, needle):
    r = _run(pkg, tmp_path / "run", *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert needle in lines[0] and lines[0].startswith("error:"), lines[0]
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_a_taken_name_is_refused(pkg):
    importlib.import_module("outside_pol")
    source = MODULE.replace('"outside_squared"', '"h2o"')
    taken = "policy name 'h2o' is taken by keyformer.core.policies.h2o.H2OPolicy"
    with pytest.raises(TypeError, match=taken):
        exec(compile(source, "clash.py", "exec"), {"__name__": "clash"})
    assert POLICIES["h2o"].__module__ == "keyformer.core.policies.h2o"


def test_contract_passes_the_good_policy(pkg):
    mod = importlib.import_module("outside_pol")
    report = check_policy(mod.Squared, archs=("llama", "gptj"), sharpen=3.0)
    assert sorted(report.passed) == sorted((c, a, 0.5) for c in CHECKS for a in ("llama", "gptj"))
    assert report.policy == "outside_pol.Squared" and not report.skipped


@pytest.mark.parametrize(("cls", "check"), [("Hoarder", "budget"), ("Shuffler", "physical == mask")])
def test_contract_names_the_broken_check(pkg, cls, check):
    mod = importlib.import_module("outside_pol")
    with pytest.raises(ContractError) as e:
        check_policy(getattr(mod, cls), archs=("llama",))
    assert e.value.check == check and e.value.arch.startswith("llama")
    assert f"'{check}' failed for policy outside_pol.{cls} on llama" in str(e.value)
    if check == "physical == mask":
        assert "first differing token at step" in str(e.value)
    assert isinstance(e.value, AssertionError)


@pytest.mark.parametrize("name", ["h2o", "tova", "keydiff", "streaming"])
def test_contract_passes_builtin_policies(name):
    report = check_policy(POLICIES[name], archs=("llama",))
    expected = [c for c in CHECKS if c != "naive reference" or POLICIES[name].needs_attention]
    assert [c for c, _, _ in report.passed] == expected


def test_contract_refuses_unknown_checks_and_non_policies():
    with pytest.raises(ValueError, match=r"checks=\['speed'\] unknown; valid: physical == mask"):
        check_policy(POLICIES["h2o"], checks=("speed",))
    with pytest.raises(TypeError, match="not a Policy"):
        check_policy(lambda budget: object(), archs=("llama",))


def test_a_policy_yaml_in_a_config_dir_of_ones_own(pkg, tmp_path):
    """``--config-dir myconf policy=mine`` runs ``myconf/policy/mine.yaml``; a misspelt name is refused in one
    line that lists it among the options."""
    conf = tmp_path / "myconf" / "policy"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text("_target_: outside_pol.Squared\nbudget: ${budget}\nrecent: ${recent}\n"
                                    "sharpen: 3.0\n")
    env = {**os.environ, "PYTHONPATH": f"{pkg}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}

    def run(policy: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / "run.py"), "--config-dir", str(tmp_path / "myconf"),
                               "model=tiny_llama", "n_samples=2", f"policy={policy}",
                               f"output_dir={tmp_path / policy}"],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)

    r = run("mine")
    assert r.returncode == 0, r.stderr[-2000:]
    metrics = json.loads((tmp_path / "mine" / "metrics.json").read_text())
    assert (metrics["policy_target"], metrics["policy_spec"]["sharpen"]) == ("outside_pol.Squared", 3.0)
    r = run("mien")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "unknown policy='mien'" in lines[0], r.stderr[-2000:]
    assert "mine" in lines[0].split("allowed: ")[1].split(", ")
