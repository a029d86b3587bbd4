"""Sampler replies for tests that drive the RL loop's rollouts without a model."""

from __future__ import annotations

import numpy as np
from tinker import types


def response_of(n_tokens: int) -> types.SampleResponse:
    """One sampled sequence of `n_tokens` copies of token 5, each with logprob -0.1, stopped cleanly."""
    seq = types.SampledSequence(
        stop_reason="stop",
        sequence_id="s0",
        tokens_np=np.full(n_tokens, 5, dtype=np.int32),
        logprobs_np=np.full(n_tokens, -0.1, dtype=np.float32),
    )
    return types.SampleResponse(sequences=[seq])
