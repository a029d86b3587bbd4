"""Trajectories -> training datums (DESIGN.md §4).

Observations and actions are laid end to end; while each observation extends everything
before it (prompt + sampled + rendered tool results), the whole trajectory is one datum,
otherwise a new datum starts. Per token: the sampler's logprob and the advantage on action
tokens (times the action's mask: forced text carries mask 0 and gets no advantage); 0 on
observation tokens. The standard shift: input = full[:-1], targets = full[1:].

For `dro`, whose quadratic term covers every position, observation positions must carry the
sampler's own logprobs so (lp - lp_sampler)^2 ~ 0 there: `fill_observation_logprobs`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tinker import types

from tinkrl.rl.types import Trajectory


@dataclass
class SequenceData:
    """One datum before the shift: full tokens and per-token arrays over them."""

    tokens: list[int]
    logprobs: list[float]
    advantages: list[float]
    mask: list[float]  # 1 on trained action tokens

    def to_datum(self) -> types.Datum:
        n = len(self.tokens)
        return (
            types.Datum(
                model_input=types.ModelInput.from_ints(self.tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": np.asarray(self.tokens[1:], dtype=np.int64),
                    "logprobs": np.asarray(self.logprobs[1:], dtype=np.float32),
                    "advantages": np.asarray(self.advantages[1:], dtype=np.float32),
                },
            )
            if n > 1
            else None
        )

    @property
    def action_mask(self) -> np.ndarray:
        return np.asarray(self.mask[1:], dtype=np.float32)


def trajectory_to_sequences(traj: Trajectory, advantage: float) -> list[SequenceData]:
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
