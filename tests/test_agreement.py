"""Sampler/trainer agreement on the real SmolLM2-135M (docs/design.md, "The embedded engine").

For the same weights, the logprobs `sample()` returns for its tokens and the logprobs the
trainer's `forward()` computes on the same tokens must agree: a mismatch biases every
importance ratio (the field's first cause of RL collapse). Checked at temperature 1 and 0.7
(sampled logprobs are the policy's own, not the tempered distribution's), for the base
weights and after an optim_step has made the LoRA adapter non-zero, in fp32 and in bf16.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.engine import REAL, datum, logprobs_of
from tinker import types

from tinkrl.local import ServiceClient
from tinkrl.renderers import get_renderer

pytestmark = pytest.mark.real_model

QUESTIONS = ["What is 12 + 30?", "Name a colour of the sky.", "Write one word that rhymes with cat."]
TOLERANCE = {"float32": 1e-3, "bfloat16": 2e-2}


def max_disagreement(tc, sc, prompts, temperature: float) -> float:
    params = types.SamplingParams(max_tokens=16, temperature=temperature, seed=17, stop=[])
    futures = [sc.sample(p, 2, params) for p in prompts]  # submitted together: decoded as one batch
    responses = [f.result() for f in futures]
    data, spans = [], []
    for p, resp in zip(prompts, responses):
        for s in resp.sequences:
            assert len(s.tokens) == 16 and len(s.logprobs) == 16
            full = p.to_ints() + list(s.tokens)
            n = len(full) - 1
            weights = np.zeros(n)
            weights[p.length - 1 :] = 1.0  # the sampled tokens, as an RL datum trains on
            data.append(datum(full, weights=weights))
            spans.append((p.length - 1, np.asarray(s.logprobs, dtype=np.float64)))
    fwd = logprobs_of(tc.forward(data).result())
    return max(float(np.abs(lp[start:] - sampled).max()) for lp, (start, sampled) in zip(fwd, spans))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sampler_and_trainer_logprobs_agree(dtype):
    service = ServiceClient(dtype=dtype)
    tc = service.create_lora_training_client(REAL, rank=8, seed=0)
    renderer = get_renderer(tc.get_tokenizer(), REAL)
    prompts = [renderer.build_generation_prompt([{"role": "user", "content": q}]) for q in QUESTIONS]
    tol = TOLERANCE[dtype]

    base_sc = tc.save_weights_and_get_sampling_client()
    for temperature in (1.0, 0.7):
        diff = max_disagreement(tc, base_sc, prompts, temperature)
        print(f"{dtype} base T={temperature}: max |sample - forward| = {diff:.2e}")
        assert diff <= tol

    # one step with a learning rate that visibly moves the policy: the adapter is live
    probe = [datum(p.to_ints() + [42, 43, 44], weights=np.ones(p.length + 2)) for p in prompts]
    before = np.concatenate(logprobs_of(tc.forward(probe).result()))
    tc.forward_backward(probe).result()
    tc.optim_step(types.AdamParams(learning_rate=2e-3)).result()
    after = np.concatenate(logprobs_of(tc.forward(probe).result()))
    assert np.abs(after - before).max() > 0.05
    trained_sc = tc.save_weights_and_get_sampling_client()
    for temperature in (1.0, 0.7):
        diff = max_disagreement(tc, trained_sc, prompts, temperature)
        print(f"{dtype} trained T={temperature}: max |sample - forward| = {diff:.2e}")
        assert diff <= tol
