"""``check_policy(..., rule=fn)``: a user's policy checked against the user's naive rule at every step.

The rules here are written from the captured tensors only (:class:`keyformer.RuleView`), never through a
policy hook. A correct policy passes; one that flips its rule every other step, and a rule with its recent
window off by one, fail with the step, layer, KV head and positions named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from keyformer import ContractError, Policy, RuleView, check_policy, make_policy

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass
class OutlierPolicy(Policy):
    """Keep the keys farthest from the mean held key, and the recent window."""

    name: ClassVar[str] = "test_rule_outlier"
    reads: ClassVar[frozenset[str]] = frozenset({"tensors"})

    def priority(self, state: torch.Tensor, ctx) -> torch.Tensor:
        k, live = ctx.keys.float(), ctx.live.unsqueeze(-1).float()
        mean = (k * live).sum(-2, keepdim=True) / live.sum(-2, keepdim=True)
        return (k - mean).norm(dim=-1)


@dataclass
class FlippingPolicy(OutlierPolicy):
    """Breaks its rule: at odd decode steps it keeps the keys nearest the mean."""

    name: ClassVar[str] = "test_rule_flipping"

    def priority(self, state: torch.Tensor, ctx) -> torch.Tensor:
        p = super().priority(state, ctx)
        return -p if ctx.step % 2 else p


for _cls in (OutlierPolicy, FlippingPolicy):  # defined here: not in the other modules' parametrisations
    Policy.registry.pop(_cls.name)


def _keep(view: RuleView, scores_of, recent_shift: int = 0) -> list[set[int]]:
    """The recent window + the top of ``scores_of(head, cols)`` among the visible positions, per KV head."""
    out = []
    for h in range(view.hkv):
        cols = view.visible(h)
        if len(cols) <= view.k:
            out.append(set(cols))
            continue
        recent = {j for j in cols if j > view.newest - view.w - recent_shift}
        scores = scores_of(h, cols)
        rest = sorted((j for j in cols if j not in recent), key=lambda j: (-scores[j], -j))
        out.append(recent | set(rest[: view.k - len(recent)]))
    return out


def _distances(view: RuleView, h: int, cols: list[int]) -> dict[int, float]:
    mean = view.keys[h, cols].mean(0)
    return {j: float((view.keys[h, j] - mean).norm()) for j in cols}


def outlier_rule(view: RuleView) -> list[set[int]]:
    return _keep(view, lambda h, cols: _distances(view, h, cols))


def h2o_rule(view: RuleView) -> list[set[int]]:
    """H2O written naively: the attention each visible position received, summed over the prompt's rows
    and every decode step's query and over the query heads of a KV head."""
    acc = view.state.setdefault("acc", [dict.fromkeys(range(view.n), 0.0) for _ in range(view.hkv)])
    G = view.group
    for h in range(view.hkv):
        rows = range(view.n) if view.step == 0 else [view.newest]
        for i in rows:
            cols = list(range(i + 1)) if view.step == 0 else view.visible(h)
            p = view.attention(i, cols)[h * G:(h + 1) * G].sum(0)
            for j, v in zip(cols, p.tolist(), strict=True):
                acc[h][j] = acc[h].get(j, 0.0) + v
    return _keep(view, lambda h, cols: acc[h])


def test_a_policy_that_keeps_its_rule_passes():
    report = check_policy(OutlierPolicy, archs=("llama",), budgets=(0.5, 12), checks=(), rule=outlier_rule)
    assert [(c, a, b) for c, a, b in report.passed] == [("rule", "llama", 0.5), ("rule", "llama", 12)]


def test_a_builtin_policy_passes_its_rule_written_naively():
    """H2O against a naive H2O rule: the view's logits, history and state carry an attention reader's rule."""
    report = check_policy(lambda budget: make_policy("h2o", budget=budget), archs=("llama",), checks=(),
                          rule=h2o_rule)
    assert report.passed == [("rule", "llama", 0.5)]


def test_a_policy_that_flips_its_rule_fails_naming_where():
    with pytest.raises(ContractError, match=r"step 1, layer \d, KV head \d: the policy keeps \[\d+") as e:
        check_policy(FlippingPolicy, archs=("llama",), checks=(), rule=outlier_rule)
    assert e.value.check == "rule" and "FlippingPolicy" in e.value.policy


def test_a_wrong_rule_fails_at_the_prompt():
    """The same correct policy against a rule whose recent window is one token too wide."""
    def wide(view: RuleView) -> list[set[int]]:
        return _keep(view, lambda h, cols: _distances(view, h, cols), recent_shift=1)

    with pytest.raises(ContractError, match=r"step 0, layer 0, KV head \d"):
        check_policy(OutlierPolicy, archs=("llama",), checks=(), rule=wide)


def test_a_rule_answer_out_of_range_is_one_clear_error():
    msg = r"rule returned positions \[99\] at step 0, layer 0; valid: 0 \.\. 35"
    with pytest.raises(ValueError, match=msg):
        check_policy(OutlierPolicy, archs=("llama",), checks=(), rule=lambda view: {0, 99})


def test_an_architecture_the_view_cannot_describe_is_skipped():
    report = check_policy(OutlierPolicy, archs=("mpt",), checks=(), rule=outlier_rule)
    assert not report.passed and report.skipped[0][0] == "rule" and "ALiBi" in report.skipped[0][3]
