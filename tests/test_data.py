"""Trajectories -> datums (docs/design.md, "Environments, rollouts, data"): alignment, masks, multi-turn merging and splitting,
forced (mask-0) action tokens, and the sampler's logprobs on observation positions for dro."""

from __future__ import annotations

import numpy as np
import pytest
import tinker

from tinkrl.rl.data import SequenceData, fill_observation_logprobs, trajectory_to_sequences
from tinkrl.rl.types import Trajectory, Transition


def tr(ob, ac, lps=None, mask=None, reward=0.0, done=False):
    lps = lps if lps is not None else [-0.1 * (i + 1) for i in range(len(ac))]
    return Transition(tinker.ModelInput.from_ints(ob), list(ac), list(lps), reward, done, ac_mask=mask)


def test_single_turn_alignment_and_masks():
    (seq,) = trajectory_to_sequences(Trajectory([tr([1, 2, 3], [4, 5], [-0.5, -0.25], done=True)]), 2.0)
    assert seq.tokens == [1, 2, 3, 4, 5]
    assert seq.logprobs == [0, 0, 0, -0.5, -0.25]
    assert seq.advantages == [0, 0, 0, 2.0, 2.0]
    assert seq.mask == [0, 0, 0, 1, 1]
    d = seq.to_datum()
    assert d.model_input.to_ints() == [1, 2, 3, 4]  # input = full[:-1]
    li = d.loss_fn_inputs
    assert li["target_tokens"].to_numpy().tolist() == [2, 3, 4, 5]  # targets = full[1:]
    assert li["logprobs"].to_numpy().tolist() == pytest.approx([0, 0, -0.5, -0.25])
    assert li["advantages"].to_numpy().tolist() == pytest.approx([0, 0, 2, 2])
    assert all(v.to_numpy().shape == (4,) for v in li.values())  # every tensor has the input's length
    assert seq.action_mask.tolist() == [0, 0, 1, 1]
    assert set(li) == {"target_tokens", "logprobs", "advantages"}  # no extra keys sent to the loss


def test_multi_turn_merges_when_observations_extend():
    t1 = tr([1, 2, 3], [4, 5], [-0.1, -0.2])
    t2 = tr([1, 2, 3, 4, 5, 6, 7], [8, 9], [-0.3, -0.4], done=True)  # prompt + action + tool result
    seqs = trajectory_to_sequences(Trajectory([t1, t2]), -1.5)
    assert len(seqs) == 1
    (s,) = seqs
    assert s.tokens == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert s.mask == [0, 0, 0, 1, 1, 0, 0, 1, 1]
    assert s.advantages == [0, 0, 0, -1.5, -1.5, 0, 0, -1.5, -1.5]
    assert s.logprobs == pytest.approx([0, 0, 0, -0.1, -0.2, 0, 0, -0.3, -0.4])
    # an observation that adds nothing new still extends (the next action follows directly)
    t3 = tr([1, 2, 3, 4, 5, 6, 7, 8, 9], [10], [-0.5], done=True)
    (s3,) = trajectory_to_sequences(Trajectory([t1, t2, t3]), 1.0)
    assert s3.tokens == list(range(1, 11)) and s3.mask[-1] == 1


def test_multi_turn_splits_when_observations_do_not_extend():
    t1 = tr([1, 2, 3], [4, 5])
    t2 = tr([1, 2, 3, 99, 6], [7], done=True)  # the action was re-rendered differently: no prefix
    seqs = trajectory_to_sequences(Trajectory([t1, t2]), 0.5)
    assert [s.tokens for s in seqs] == [[1, 2, 3, 4, 5], [1, 2, 3, 99, 6, 7]]
    assert [s.mask for s in seqs] == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 1]]
    assert [s.advantages for s in seqs] == [[0, 0, 0, 0.5, 0.5], [0, 0, 0, 0, 0, 0.5]]
    # a shorter observation (context was truncated) also starts a new datum
    t3 = tr([4, 5], [6], done=True)
    assert len(trajectory_to_sequences(Trajectory([t1, t3]), 1.0)) == 2


def test_mask_zero_action_tokens_get_no_advantage():
    t = tr([1, 2], [3, 4, 5, 6], [-1, -2, -3, -4], mask=[1, 0, 0, 1], done=True)
    (s,) = trajectory_to_sequences(Trajectory([t]), 3.0)
    assert s.advantages == [0, 0, 3.0, 0, 0, 3.0]
    assert s.mask == [0, 0, 1, 0, 0, 1]
    assert s.logprobs == [0, 0, -1, -2, -3, -4]  # the sampler's logprobs are kept (exact head in training)
    d = s.to_datum()
    assert d.loss_fn_inputs["advantages"].to_numpy().tolist() == [0, 3.0, 0, 0, 3.0]


def test_empty_and_single_token_sequences():
    assert trajectory_to_sequences(Trajectory([]), 1.0) == []
    assert SequenceData([7], [0.0], [0.0], [0.0]).to_datum() is None


def test_fill_observation_logprobs():
    t1 = tr([1, 2, 3], [4, 5], [-0.1, -0.2])
    t2 = tr([1, 2, 3, 4, 5, 6], [7], [-0.3], done=True)
    (s,) = trajectory_to_sequences(Trajectory([t1, t2]), 1.0)
    prompt_lps = [None, -1.0, -2.0, -9.0, -9.0, -6.0, -9.0]  # as compute_logprobs returns: entry 0 None
    fill_observation_logprobs(s, prompt_lps)
    # observation positions take the sampler's logprobs; action positions keep the sampled ones;
    # position 0 (no logprob exists) stays 0 and is dropped by the shift anyway
    assert s.logprobs == pytest.approx([0.0, -1.0, -2.0, -0.1, -0.2, -6.0, -0.3])
    d = s.to_datum()
    assert d.loss_fn_inputs["logprobs"].to_numpy().tolist() == pytest.approx([-1.0, -2.0, -0.1, -0.2, -6.0, -0.3])
    assert d.loss_fn_inputs["advantages"].to_numpy().tolist() == pytest.approx([0, 0, 1, 1, 0, 1])
    # forced (mask-0) action tokens are observation-like: they take the sampler's value too
    t = tr([1, 2], [3, 4], [-0.5, -0.7], mask=[0, 1], done=True)
    (s2,) = trajectory_to_sequences(Trajectory([t]), 1.0)
    fill_observation_logprobs(s2, [None, -1.5, -2.5, -3.5])
    assert s2.logprobs == pytest.approx([0.0, -1.5, -2.5, -0.7])
    assert np.asarray(s2.advantages).tolist() == [0, 0, 0, 1.0]
