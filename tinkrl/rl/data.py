"""Trajectories -> training datums (docs/design.md, "Environments, rollouts, data").

Observations and actions are laid end to end; while each observation extends everything
before it (prompt + sampled + rendered tool results), the whole trajectory is one datum,
otherwise a new datum starts. Per token: the sampler's logprob and the advantage on action
tokens (times the action's mask: forced text carries mask 0 and gets no advantage); 0 on
observation tokens. The standard shift: input = full[:-1], targets = full[1:].

Two losses need more than the sampled tokens: `dro`, whose quadratic term covers every position,
needs the sampler's own logprobs on observation positions so (lp - lp_sampler)^2 ~ 0 there
(`add_observation_logprobs`); a KL penalty to a reference policy (the base model, or the
weights the warm start ended with) enters the advantages (`add_kl_penalty`), and so does
on-policy distillation, whose reference is the teacher and whose penalty is the whole signal.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
from tinker import types

from tinkrl.rl.advantages import compute_advantages
from tinkrl.rl.types import Metrics, Trajectory, TrajectoryGroup


@dataclass
class SequenceData:
    """One datum before the shift: full tokens and per-token arrays over them."""

    tokens: list[int]
    logprobs: list[float]
    advantages: list[float]
    mask: list[float]  # 1 on trained action tokens

    def to_datum(self, loss_fn: str = "importance_sampling") -> types.Datum | None:
        """The shifted datum for `loss_fn` (gspo also gets its sequence-ratio mask: the action tokens)."""
        if len(self.tokens) < 2:
            return None
        inputs = {
            "target_tokens": np.asarray(self.tokens[1:], dtype=np.int64),
            "logprobs": np.asarray(self.logprobs[1:], dtype=np.float32),
            "advantages": np.asarray(self.advantages[1:], dtype=np.float32),
        }
        if loss_fn == "gspo":
            inputs["sequence_ratio_mask"] = self.action_mask
        return types.Datum(model_input=types.ModelInput.from_ints(self.tokens[:-1]), loss_fn_inputs=inputs)

    @property
    def action_mask(self) -> np.ndarray:
        return np.asarray(self.mask[1:], dtype=np.float32)


def trajectory_to_sequences(traj: Trajectory, advantage: float) -> list[SequenceData]:
    """A trajectory's observations and actions laid end to end; a new sequence starts only where an observation
    does not extend the tokens so far. Action tokens carry `advantage` times their mask, observation tokens 0."""
    seqs: list[SequenceData] = []
    cur: SequenceData | None = None
    for t in traj.transitions:
        ob = t.ob.to_ints()
        if cur is not None and len(ob) >= len(cur.tokens) and ob[: len(cur.tokens)] == cur.tokens:
            new_ob = ob[len(cur.tokens) :]
        else:
            if cur is not None:
                seqs.append(cur)
            cur = SequenceData([], [], [], [])
            new_ob = ob
        cur.tokens += new_ob
        cur.logprobs += [0.0] * len(new_ob)
        cur.advantages += [0.0] * len(new_ob)
        cur.mask += [0.0] * len(new_ob)
        mask = t.ac_mask if t.ac_mask is not None else [1.0] * len(t.ac_tokens)
        cur.tokens += list(t.ac_tokens)
        cur.logprobs += list(t.ac_logprobs)
        cur.advantages += [advantage * m for m in mask]
        cur.mask += list(mask)
    if cur is not None:
        seqs.append(cur)
    return seqs


def fill_observation_logprobs(seq: SequenceData, sampler_prompt_logprobs: list[float | None]) -> None:
    """Put the sampler's logprobs on observation positions (for dro); action positions keep theirs."""
    for i, (m, lp) in enumerate(zip(seq.mask, sampler_prompt_logprobs)):
        if m == 0 and lp is not None:
            seq.logprobs[i] = float(lp)


def select_groups(
    keyed_groups: list[tuple[str, TrajectoryGroup]], max_failing: dict[str, int], remove_constant: bool
) -> tuple[list[tuple[str, TrajectoryGroup]], Metrics]:
    """The groups to train on: none with more infrastructure failures than its environment allows
    (`max_failing[key]`) and, if asked, none whose rollouts all got the same reward."""
    kept, dropped_failing, dropped_constant = [], 0, 0
    for key, g in keyed_groups:
        if len(g.failures) > max_failing[key] or len(g.trajectories_G) < 1:
            dropped_failing += 1
            continue
        r = g.total_rewards()
        if remove_constant and max(r) == min(r):
            dropped_constant += 1
            continue
        kept.append((key, g))
    if remove_constant and not kept and keyed_groups:  # keep one so the step still happens
        kept = [next((kg for kg in keyed_groups if kg[1].trajectories_G), keyed_groups[0])]
    metrics = {
        "groups/dropped_failing": dropped_failing,
        "groups/dropped_constant": dropped_constant,
        "groups/kept": len(kept),
    }
    return kept, metrics


def build_sequences(
    keyed_groups: list[tuple[str, TrajectoryGroup]], adv_estimator: str, adv_beta: float, reward_coef: float = 1.0
) -> list[tuple[SequenceData, dict]]:
    """Each kept group's advantages (times `reward_coef`: 0 leaves the reward out, as pure distillation does),
    and its trajectories as sequences, each with what the rollout log shows."""
    out = []
    for key, g in keyed_groups:
        rewards = g.total_rewards()
        advantages = [reward_coef * a for a in compute_advantages(rewards, adv_estimator, adv_beta)]
        for traj, reward, adv in zip(g.trajectories_G, rewards, advantages):
            last = traj.transitions[-1] if traj.transitions else None
            info = {
                "env": key,
                "reward": reward,
                "advantage": float(adv),
                "stop_reason": last.stop_reason if last else "",
                "logs": dict(last.logs) if last else {},
            }
            out.extend((seq, info) for seq in trajectory_to_sequences(traj, float(adv)) if len(seq.tokens) > 1)
    return out


async def add_observation_logprobs(seqs: list[SequenceData], sampling_client) -> None:
    """For `dro`: observation positions get the sampler's own logprobs (action positions keep theirs)."""
    prompt_lps = await asyncio.gather(
        *(sampling_client.compute_logprobs(types.ModelInput.from_ints(s.tokens)) for s in seqs)
    )
    for s, lps in zip(seqs, prompt_lps):
        fill_observation_logprobs(s, lps)


async def add_kl_penalty(
    seqs: list[SequenceData],
    reference_client,
    coef: float,
    name: str = "base",
    *,
    centred: bool = True,
    discount: float = 0.0,
) -> Metrics:
    """The KL to a reference policy enters the advantages, per action token: d = q - p_ref (the sampler's
    logprob minus the reference's, an estimate of the reverse KL), A += coef * (mean(d) - d) when `centred`
    (the KL penalty to the base model or the warm start), else A -= coef * d (on-policy distillation: the
    teacher is the reference). With `discount`, each token's term also counts the later action tokens'
    terms of its sequence, discounted. Reported as `kl_policy_<name>` (mean d per action token) and
    `logprob/<name>`, `logprob/policy` (mean logprobs of the action tokens)."""
    refs = await asyncio.gather(
        *(reference_client.compute_logprobs(types.ModelInput.from_ints(s.tokens)) for s in seqs)
    )
    diffs = [[(q - (b or 0.0)) * m for q, b, m in zip(s.logprobs, ref, s.mask)] for s, ref in zip(seqs, refs)]
    n = max(1.0, sum(sum(s.mask) for s in seqs))
    avg = sum(sum(d) for d in diffs) / n
    ref_lp = sum((b or 0.0) * m for s, ref in zip(seqs, refs) for b, m in zip(ref, s.mask)) / n
    policy_lp = sum(q * m for s in seqs for q, m in zip(s.logprobs, s.mask)) / n
    for s, d in zip(seqs, diffs):
        penalty = [m * ((di - avg) if centred else di) for m, di in zip(s.mask, d)]
        if discount:
            penalty = [p * m for p, m in zip(discounted_sums(penalty, discount), s.mask)]
        s.advantages = [a - coef * p for a, p in zip(s.advantages, penalty)]
    return {f"kl_policy_{name}": avg, f"logprob/{name}": ref_lp, "logprob/policy": policy_lp}


def discounted_sums(values: list[float], discount: float) -> list[float]:
    """out[i] = sum over j >= i of discount**(j - i) * values[j]: each position's value and the later ones'."""
    out, acc = [0.0] * len(values), 0.0
    for i in range(len(values) - 1, -1, -1):
        acc = values[i] + discount * acc
        out[i] = acc
    return out
