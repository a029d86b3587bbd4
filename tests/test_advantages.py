"""Advantage estimators against their formulas (docs/design.md, "Environments, rollouts, data"), computed here independently."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tinkrl.rl.advantages import adaptive_beta, compute_advantages

REWARDS = [0.0, 1.0, 1.0, 0.25, 3.0]


def test_grpo_centers_on_the_group_mean():
    got = compute_advantages(REWARDS, "grpo")
    mean = sum(REWARDS) / len(REWARDS)
    assert got.tolist() == pytest.approx([r - mean for r in REWARDS])
    assert compute_advantages(REWARDS, "centered").tolist() == pytest.approx(got.tolist())


def test_grpo_std_divides_by_the_population_std():
    mean = sum(REWARDS) / len(REWARDS)
    std = math.sqrt(sum((r - mean) ** 2 for r in REWARDS) / len(REWARDS))
    got = compute_advantages(REWARDS, "grpo_std")
    assert got.tolist() == pytest.approx([(r - mean) / (std + 1e-6) for r in REWARDS])
    assert compute_advantages(REWARDS, "centered_normalized").tolist() == pytest.approx(got.tolist())


def test_direct_is_the_reward():
    assert compute_advantages(REWARDS, "direct").tolist() == REWARDS
    assert compute_advantages([2.0, 2.0], "direct").tolist() == [2.0, 2.0]


def test_rloo_leaves_one_out():
    got = compute_advantages(REWARDS, "rloo")
    expected = [r - (sum(REWARDS) - r) / (len(REWARDS) - 1) for r in REWARDS]
    assert got.tolist() == pytest.approx(expected)
    assert compute_advantages([5.0], "rloo").tolist() == [0.0]


@pytest.mark.parametrize("beta", [0.5, 2.0, 7.0])
def test_entropic_formula(beta):
    got = compute_advantages(REWARDS, "entropic", beta=beta)
    k, top = len(REWARDS), max(REWARDS)
    e = [math.exp(beta * (r - top)) for r in REWARDS]
    expected = [ei / ((sum(e) - ei) / (k - 1) + 1e-12) - 1 for ei in e]
    assert got.tolist() == pytest.approx(expected, rel=1e-9)
    assert got[REWARDS.index(top)] > 0 and got[0] < 0
    # beta matters: the top trajectory's advantage grows with beta
    assert compute_advantages(REWARDS, "entropic", beta=beta * 2)[4] > got[4]


def _kl_to_uniform(rewards, beta):
    r = np.asarray(rewards, dtype=np.float64)
    q = np.exp(beta * r - (beta * r).max())
    q /= q.sum()
    return float((q * np.log(q * len(r))).sum())


def test_entropic_adaptive_picks_beta_with_kl_ln2():
    beta = adaptive_beta(np.asarray(REWARDS))
    assert _kl_to_uniform(REWARDS, beta) == pytest.approx(math.log(2), rel=1e-6)
    got = compute_advantages(REWARDS, "entropic_adaptive")
    assert got.tolist() == pytest.approx(compute_advantages(REWARDS, "entropic", beta=beta).tolist(), rel=1e-9)
    # scale-free: rewards times 10 -> beta / 10, same advantages
    assert adaptive_beta(np.asarray(REWARDS) * 10) == pytest.approx(beta / 10, rel=1e-6)
    assert compute_advantages([r * 10 for r in REWARDS], "entropic_adaptive").tolist() == pytest.approx(
        got.tolist(), rel=1e-6
    )


def test_entropic_adaptive_when_ln2_is_out_of_reach():
    # two distinct rewards: KL to uniform is at most ln 2 (all mass on one): the largest beta tried
    beta = adaptive_beta(np.asarray([0.0, 1.0]))
    assert _kl_to_uniform([0.0, 1.0], beta) == pytest.approx(math.log(2), abs=1e-3)
    # the other rollout's weight underflows; the 1e-12 guard (as in TTT-Discover) keeps it finite
    got = compute_advantages([0.0, 1.0], "entropic_adaptive")
    assert np.isfinite(got).all() and got[0] == pytest.approx(-1.0) and got[1] > 0


@pytest.mark.parametrize("estimator", ["grpo", "grpo_std", "rloo", "entropic", "entropic_adaptive"])
def test_constant_reward_groups_get_zero(estimator):
    for rewards in ([1.0] * 4, [0.0] * 3, [-2.5] * 8):
        got = compute_advantages(rewards, estimator)
        assert got.tolist() == pytest.approx([0.0] * len(rewards), abs=1e-9)


def test_unknown_estimator_is_an_error():
    with pytest.raises(ValueError, match="unknown advantage estimator 'gae'"):
        compute_advantages([0.0, 1.0], "gae")
