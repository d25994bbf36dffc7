"""Validate once: a job's config and policy are checked in one place before any model loads, and the policy
built there is the one that runs and is recorded; the budget rule is one function."""

from __future__ import annotations

import pytest

from keyformer.core.policies import make_policy
from keyformer.core.policies.base import Policy, budget_problem
from keyformer.run import scaffold
from keyformer.run.tasks.generate import GenerateTask, run
from keyformer.run.validate import ConfigError, check_budget


@pytest.mark.parametrize("value,problem", [(0.5, None), (1.0, None), (1, None), (4096, None),
                                           (0.0, "float range"), (1.5, "float range"), (-0.1, "float range"),
                                           (0, "int range"), (-3, "int range"),
                                           (True, "type"), ("0.5", "type"), (None, "type")])
def test_one_budget_rule_for_config_and_policy(value, problem):
    assert budget_problem(value) == problem
    if problem is None:
        check_budget(value)
        assert make_policy("h2o", budget=value).budget == value
    else:
        with pytest.raises(ConfigError, match="budget"):
            check_budget(value)
        with pytest.raises(ValueError, match="budget"):
            make_policy("h2o", budget=value)


def test_the_validated_policy_is_the_one_that_runs(tmp_path, monkeypatch):
    from test_runner import FakeCore, cfg_dict

    builds: list[Policy] = []
    validated: list[object] = []
    given: list[object] = []
    orig_post, orig_validate, orig_job = Policy.__post_init__, GenerateTask.validate, scaffold.Job.__init__

    def post(self):
        builds.append(self)
        orig_post(self)

    def validate(self, cfg):
        validated.append(orig_validate(self, cfg))
        return validated[-1]

    def job_init(self, cfg, task, identity, policy=None):
        given.append(policy)
        orig_job(self, cfg, task, identity, policy)

    monkeypatch.setattr(Policy, "__post_init__", post)
    monkeypatch.setattr(GenerateTask, "validate", validate)
    monkeypatch.setattr(scaffold.Job, "__init__", job_init)
    m = run(cfg_dict(tmp_path, "n_samples=1", "policy=h2o", "budget=0.25"), FakeCore().backend())
    assert len(builds) == 1  # built once, by the check
    assert validated == given == builds  # and that object is the job's
    assert m["policy_spec"]["name"] == "h2o" and m["policy_spec"]["budget"] == 0.25
