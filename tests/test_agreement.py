"""Sampler/trainer agreement on the real SmolLM2-135M (docs/design.md, "The embedded engine").

For the same weights, the logprobs `sample()` returns for its tokens and the logprobs the
trainer's `forward()` computes on the same tokens must agree: a mismatch biases every
importance ratio (the field's first cause of RL collapse). Checked at temperature 1 and 0.7
(sampled logprobs are the policy's own, not the tempered distribution's), for the base
weights and after an optim_step has made the LoRA adapter non-zero, in fp32 and in bf16.
This machine's default precision must agree within `AGREEMENT_BOUND` (tests/test_precision.py
checks the same on the tiny model, in the fast suite).
"""

from __future__ import annotations

import pytest
import torch
from helpers.engine import BF16_ON_AMX, REAL, assert_agreement_before_and_after_a_step

from tinkrl.local import ServiceClient
from tinkrl.local.compute_plan import AGREEMENT_BOUND
from tinkrl.local.models import default_dtype, parse_dtype
from tinkrl.renderers import get_renderer

pytestmark = [pytest.mark.real_model, pytest.mark.cpu_class]  # cpu_class: `make test-avx2` runs it again

QUESTIONS = ["What is 12 + 30?", "Name a colour of the sky.", "Write one word that rhymes with cat."]
# bf16 on an AMX CPU runs its products in bf16 (5.3e-2 to over 1e-1 apart on two Xeons: `BF16_ON_AMX`),
# which is why it is no default there.
TOLERANCE = {"float32": 1e-3, "bfloat16": AGREEMENT_BOUND}


def test_the_default_precision_is_checked_here_within_the_bound(monkeypatch):
    monkeypatch.delenv("TINKRL_DTYPE", raising=False)
    default = next(name for name in TOLERANCE if parse_dtype(name) == default_dtype(torch.device("cpu")))
    assert TOLERANCE[default] <= AGREEMENT_BOUND


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sampler_and_trainer_logprobs_agree(dtype):
    if dtype == "bfloat16" and BF16_ON_AMX:
        pytest.skip(
            "on a CPU with AMX the bfloat16 setting multiplies in bf16 and is no default there: "
            "its mismatch is reported per step, not bounded"
        )
    service = ServiceClient(dtype=dtype)
    tc = service.create_lora_training_client(REAL, rank=8, seed=0)
    renderer = get_renderer(tc.get_tokenizer(), REAL)
    prompts = [renderer.build_generation_prompt([{"role": "user", "content": q}]) for q in QUESTIONS]
    assert_agreement_before_and_after_a_step(tc, prompts, TOLERANCE[dtype], dtype)
