"""Advantage estimators: a group's rewards -> one advantage per trajectory.

- `grpo` (alias `centered`): r - mean(r)
- `grpo_std` (alias `centered_normalized`): (r - mean) / (std + 1e-6)
- `direct`: r itself
- `rloo`: r_i - mean of the others = k/(k-1) (r_i - mean)
- `entropic` (TTT-Discover): e_i = exp(beta (r_i - max r)), Z_i = (sum e - e_i)/(k-1), A_i = e_i/(Z_i + 1e-12) - 1
- `entropic_adaptive`: entropic with beta chosen by bisection so KL(q_beta || uniform) = ln 2,
  q_beta = softmax(beta r) over the group.
A constant-reward group gets all-zero advantages under every estimator except `direct`.
"""

from __future__ import annotations

import math

import numpy as np

ALIASES = {"centered": "grpo", "centered_normalized": "grpo_std"}


def _entropic(r: np.ndarray, beta: float) -> np.ndarray:
    k = len(r)
    if k < 2:
        return np.zeros_like(r)
    e = np.exp(beta * (r - r.max()))
    z = (e.sum() - e) / (k - 1)
    # + 1e-12 as in TTT-Discover: when every other e underflows to 0 (entropic_adaptive on a
    # 2-rollout group pushes beta to its cap), the advantage stays finite instead of inf.
    return e / (z + 1e-12) - 1.0


def _kl_to_uniform(r: np.ndarray, beta: float) -> float:
    logits = beta * (r - r.max())
    log_q = logits - math.log(np.exp(logits).sum())
    q = np.exp(log_q)
    return float((q * (log_q + math.log(len(r)))).sum())


def adaptive_beta(r: np.ndarray, target: float = math.log(2), iters: int = 60) -> float:
    """The beta with KL(softmax(beta r) || uniform) = target; the largest tried when unreachable."""
    spread = float(r.max() - r.min())
    if spread == 0:
        return 0.0
    lo, hi = 0.0, 1.0 / spread
    while _kl_to_uniform(r, hi) < target and hi < 1e6 / spread:
        hi *= 2
    for _ in range(iters):
        mid = (lo + hi) / 2
        if _kl_to_uniform(r, mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def compute_advantages(rewards_G: list[float] | np.ndarray, estimator: str = "grpo", beta: float = 2.0) -> np.ndarray:
    """One advantage per rollout of a group, from the group's rewards, by `estimator` (see the module docstring)."""
    r = np.asarray(rewards_G, dtype=np.float64)
    estimator = ALIASES.get(estimator, estimator)
    if estimator == "direct":
        return r.copy()
    if len(r) == 0:
        return r
    centered = r - r.mean()
    if estimator == "grpo":
        return centered
    if estimator == "grpo_std":
        return centered / (r.std() + 1e-6)
    if estimator == "rloo":
        k = len(r)
        return centered * k / (k - 1) if k > 1 else np.zeros_like(r)
    if estimator == "entropic":
        return _entropic(r, beta)
    if estimator == "entropic_adaptive":
        return _entropic(r, adaptive_beta(r))
    raise ValueError(f"unknown advantage estimator {estimator!r}")
