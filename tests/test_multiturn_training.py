"""A multi-turn episode end to end: env -> do_rollout (real SamplingClient, tiny model) -> one datum ->
the trainer. The merged datum's forward reproduces the sampler's logprobs on every action token,
observation tokens (prompt, tool results, chat-format glue) carry advantage 0, and under every RL
loss (dro included, with the sampler's observation logprobs filled in) they add nothing to the
gradient: the full datum's LoRA gradient equals the gradient of the same loss over the action
positions alone.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tinker
import torch
from helpers.engine import TINY, assert_close_vectors, flat, lora_grads, randomize_lora, zero_grads
from tinker import types

from tinkrl.local import ServiceClient
from tinkrl.local.losses import datum_loss
from tinkrl.renderers import get_renderer
from tinkrl.rl.data import fill_observation_logprobs, trajectory_to_sequences
from tinkrl.rl.rollouts import do_rollout
from tinkrl.rl.types import Env, StepResult

TURNS = 3


class ToolLoopEnv(Env):
    """Three turns: each action gets a scripted tool result back; the second turn's first token is
    marked forced (mask 0). Observations extend prompt + action via the renderer's continuation."""

    def __init__(self, renderer):
        self.renderer = renderer
        self.turn = 0
        self.tokens: list[int] = []
        self.closed = False
        self.stop_reasons: list[str] = []

    async def initial_observation(self):
        ob = self.renderer.build_generation_prompt(
            [{"role": "system", "content": "You operate a shell."}, {"role": "user", "content": "List the files."}]
        )
        self.tokens = ob.to_ints()
        return ob, self.renderer.stop_sequences()

    async def step(self, action, *, stop_reason="stop"):
        self.turn += 1
        self.stop_reasons.append(stop_reason)
        done = self.turn >= TURNS
        mask = [0.0] + [1.0] * (len(action) - 1) if self.turn == 2 else None
        if done:
            return StepResult(1.0, True, tinker.ModelInput.from_ints([]), [], {"turn": self.turn}, action_mask=mask)
        cont = self.renderer.continuation(
            [{"role": "tool", "content": f"file_{self.turn}.txt"}], action_ended_cleanly=stop_reason == "stop"
        )
        self.tokens = self.tokens + list(action) + cont
        return StepResult(
            0.0, False, tinker.ModelInput.from_ints(self.tokens), self.renderer.stop_sequences(), action_mask=mask
        )

    async def close(self):
        self.closed = True


@pytest.fixture(scope="module")
def episode():
    tc = ServiceClient().create_lora_training_client(TINY, rank=4, seed=0)
    randomize_lora(tc, scale=0.03)
    sc = tc.save_weights_and_get_sampling_client()
    renderer = get_renderer(tc.get_tokenizer(), TINY)
    env = ToolLoopEnv(renderer)
    traj = asyncio.run(do_rollout(env, sc, max_tokens=6, temperature=1.0))
    return tc, sc, env, traj


def test_rollout_is_one_datum_with_sampler_logprobs(episode):
    tc, sc, env, traj = episode
    assert traj.failure_mode is None and env.closed
    assert len(traj.transitions) == TURNS and traj.total_reward == 1.0
    assert env.stop_reasons == [t.stop_reason for t in traj.transitions]
    seqs = trajectory_to_sequences(traj, advantage=0.75)
    assert len(seqs) == 1  # every observation extended the previous prompt + action
    (seq,) = seqs
    ob_len = traj.transitions[0].ob.length
    assert seq.tokens[:ob_len] == traj.transitions[0].ob.to_ints()
    n_action = sum(len(t.ac_tokens) for t in traj.transitions)
    assert sum(seq.mask) == n_action - 1  # one forced token
    mask = np.asarray(seq.mask)
    adv = np.asarray(seq.advantages)
    assert (adv[mask == 0] == 0).all() and (adv[mask == 1] == 0.75).all()
    is_action = np.zeros(len(seq.tokens), dtype=bool)
    pos = 0
    for t in traj.transitions:  # where each action sits in the merged sequence
        ob = t.ob.to_ints()
        pos = len(ob)
        assert seq.tokens[pos : pos + len(t.ac_tokens)] == list(t.ac_tokens)
        is_action[pos : pos + len(t.ac_tokens)] = True
    assert (adv[~is_action] == 0).all()  # prompt, tool results and format glue: advantage 0

    d = seq.to_datum()
    fwd = tc.forward(
        [
            types.Datum(
                model_input=d.model_input,
                loss_fn_inputs={**d.loss_fn_inputs, "weights": np.ones(len(seq.tokens) - 1, np.float32)},
            )
        ],
        "cross_entropy",
    ).result()
    lp = fwd.loss_fn_outputs[0]["logprobs"].to_numpy()
    sampled = np.asarray(seq.logprobs[1:])[is_action[1:]]
    np.testing.assert_allclose(lp[is_action[1:]], sampled, atol=1e-3)


LOSSES = [("importance_sampling", None), ("ppo", None), ("cispo", None), ("gspo", None), ("dro", {"beta": 0.5})]


def _inputs(tc, sc, traj, loss_fn, fill: bool):
    (seq,) = trajectory_to_sequences(traj, advantage=0.75)
    if fill:
        fill_observation_logprobs(seq, sc.compute_logprobs(types.ModelInput.from_ints(seq.tokens)).result())
    d = seq.to_datum()
    inputs = {k: v.to_numpy() for k, v in d.loss_fn_inputs.items()}
    if loss_fn == "gspo":
        inputs["sequence_ratio_mask"] = seq.action_mask
    return types.Datum(model_input=d.model_input, loss_fn_inputs=inputs), inputs, seq.action_mask > 0


def _action_only_gradient(tc, datum, inputs, act, loss_fn, cfg):
    """The same loss (the engine's own datum_loss) over the trained action positions only."""
    keep = torch.as_tensor(act)

    def loss(_data, lps):
        sub = {k: torch.as_tensor(v)[keep] for k, v in inputs.items()}
        return datum_loss(loss_fn, lps[0][keep], sub, cfg), {}

    zero_grads(tc)
    tc.forward_backward_custom([datum], loss).result()
    g = flat(lora_grads(tc))
    zero_grads(tc)
    return g


@pytest.mark.parametrize("loss_fn,cfg", LOSSES)
def test_observation_tokens_get_no_gradient(episode, loss_fn, cfg):
    tc, sc, _, traj = episode
    datum, inputs, act = _inputs(tc, sc, traj, loss_fn, fill=(loss_fn == "dro"))
    zero_grads(tc)
    tc.forward_backward([datum], loss_fn, cfg).result()
    full = flat(lora_grads(tc))
    zero_grads(tc)
    assert_close_vectors(full, _action_only_gradient(tc, datum, inputs, act, loss_fn, cfg), rel=2e-3)


def test_dro_without_sampler_observation_logprobs_would_train_observations(episode):
    """The negative control: with logprob 0 on observation positions, dro's quadratic term pulls them."""
    tc, sc, _, traj = episode
    cfg = {"beta": 0.5}
    datum, inputs, act = _inputs(tc, sc, traj, "dro", fill=False)
    zero_grads(tc)
    tc.forward_backward([datum], "dro", cfg).result()
    full = flat(lora_grads(tc))
    zero_grads(tc)
    action_only = _action_only_gradient(tc, datum, inputs, act, "dro", cfg)
    assert float((full - action_only).norm()) > 0.1 * float(action_only.norm())
