"""Tinker's built-in losses, computed exactly as documented (docs/design.md, "The seam").

Per-token, summed over tokens and datums, never length-normalised. `lp` are the learner's
logprobs of `target_tokens`, `q` the sampler's (`loss_fn_inputs["logprobs"]`), `A` the
advantages, `r = exp(lp - q)`. RL losses ignore `weights`; keeping prompt tokens out of
training is the datum builder's job (advantage 0; for dro, q = the sampler's prompt logprobs).
"""

from __future__ import annotations

import torch

from tinkrl.errors import TinkrlError

REQUIRED_INPUTS = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
    "cispo": ("target_tokens", "logprobs", "advantages"),
    "dro": ("target_tokens", "logprobs", "advantages"),
    "gspo": ("target_tokens", "logprobs", "advantages", "sequence_ratio_mask"),
}
DEFAULT_CLIP = {"ppo": (0.8, 1.2), "gspo": (0.8, 1.2), "cispo": (0.0, 4.0)}
ALLOWED_CONFIG = {
    "ppo": {"clip_low_threshold", "clip_high_threshold"},
    "gspo": {"clip_low_threshold", "clip_high_threshold"},
    "cispo": {"clip_low_threshold", "clip_high_threshold"},
    "dro": {"beta"},
    "cross_entropy": set(),
    "importance_sampling": set(),
}


class LossInputError(TinkrlError, ValueError):
    """A `forward_backward` call the engine refuses: unknown loss, missing or mis-sized inputs, bad config, no data."""


def check_loss(loss_fn: str, config: dict | None, input_keys: set[str]) -> None:
    """Raise one clear line for an unknown loss, a missing input or an unknown config key."""
    if loss_fn not in REQUIRED_INPUTS:
        raise LossInputError(f"unknown loss_fn {loss_fn!r}; expected one of {', '.join(REQUIRED_INPUTS)}")
    missing = [k for k in REQUIRED_INPUTS[loss_fn] if k not in input_keys]
    if missing:
        raise LossInputError(
            f"loss_fn {loss_fn!r} needs loss_fn_inputs {list(REQUIRED_INPUTS[loss_fn])}; missing {missing}"
        )
    unknown = set(config or {}) - ALLOWED_CONFIG[loss_fn]
    if unknown:
        raise LossInputError(
            f"loss_fn_config keys {sorted(unknown)} are not used by {loss_fn!r} "
            f"(allowed: {sorted(ALLOWED_CONFIG[loss_fn]) or 'none'})"
        )
    if loss_fn == "dro" and "beta" not in (config or {}):
        raise LossInputError("loss_fn 'dro' needs loss_fn_config {'beta': float}")


def active_positions(loss_fn: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Positions whose loss term (or gradient) can be non-zero under the formula."""
    if loss_fn == "cross_entropy":
        return inputs["weights"] != 0
    if loss_fn == "dro":
        return torch.ones_like(inputs["advantages"], dtype=torch.bool)
    # Sampled tokens (non-zero sampler logprob) always get the exact head, so the logprobs
    # reported for them are exact even where the advantage happens to be 0.
    active = (inputs["advantages"] != 0) | (inputs["logprobs"] != 0)
    if loss_fn == "gspo":
        active |= inputs["sequence_ratio_mask"] != 0
    return active


def _clip(loss_fn: str, config: dict, inputs: dict[str, torch.Tensor]):
    lo, hi = DEFAULT_CLIP[loss_fn]
    lo = inputs.get("clip_low_threshold", config.get("clip_low_threshold", lo))
    hi = inputs.get("clip_high_threshold", config.get("clip_high_threshold", hi))
    return lo, hi


def datum_loss(loss_fn: str, lp: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict | None) -> torch.Tensor:
    """The loss of one datum (a scalar), summed over its tokens."""
    config = config or {}
    if loss_fn == "cross_entropy":
        return -(lp * inputs["weights"]).sum()
    q, adv = inputs["logprobs"], inputs["advantages"]
    if loss_fn == "importance_sampling":
        return -(torch.exp(lp - q) * adv).sum()
    if loss_fn == "ppo":
        ratio = torch.exp(lp - q)
        lo, hi = _clip(loss_fn, config, inputs)
        return -torch.minimum(ratio * adv, torch.clamp(ratio, lo, hi) * adv).sum()
    if loss_fn == "cispo":
        ratio = torch.exp(lp - q)
        lo, hi = _clip(loss_fn, config, inputs)
        return -(torch.clamp(ratio, lo, hi).detach() * lp * adv).sum()
    if loss_fn == "dro":
        beta = float(config["beta"])
        return -(lp * adv - 0.5 * beta * (lp - q) ** 2).sum()
    if loss_fn == "gspo":
        mask = inputs["sequence_ratio_mask"] != 0
        log_ratio = (lp.detach() - q)[mask].mean() if bool(mask.any()) else lp.new_zeros(())
        ratio = torch.exp(log_ratio + lp - lp.detach())
        lo, hi = _clip(loss_fn, config, inputs)
        return -torch.minimum(ratio * adv, torch.clamp(ratio, lo, hi) * adv).sum()
    raise LossInputError(f"unknown loss_fn {loss_fn!r}")
