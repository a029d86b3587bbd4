"""The default-precision rule (`tinkrl/local/compute_plan.py`) and the agreement every default keeps.

What must hold: each CPU class has one default with the measurement behind it (fp32 on every
class measured so far); this machine's engine takes the default of its own class; and with
that default, sampled with the trainer's own arithmetic (the `matched` sampler, which the tests
run everywhere: tests/conftest.py), the sampler's logprobs and the trainer's `forward()` logprobs
on the same tokens differ by at most `AGREEMENT_BOUND` (max |dlogprob|), before and after a
training step. A class whose default sampler is bf16 trades that agreement for speed only where
it learned as well (tests/test_sampler_precision.py).
"""

from __future__ import annotations

from typing import get_args

import pytest
import torch
from helpers.engine import TEXTS, TINY, assert_agreement_before_and_after_a_step
from tinker import types

from tinkrl.local import ServiceClient
from tinkrl.local.compute_plan import AGREEMENT_BOUND, CPU_RULES, CpuClass, cpu_class_of, default_rule, probe
from tinkrl.local.models import default_dtype, parse_dtype

pytestmark = pytest.mark.cpu_class  # `make test-avx2` runs it again as an AVX2-only CPU


def test_every_cpu_class_has_a_measured_default():
    assert set(CPU_RULES) == set(get_args(CpuClass))
    for cls, rule in CPU_RULES.items():
        assert rule.precision == "float32", cls  # no faster mode has met the bound on any class yet
        assert rule.measured.strip(), cls


@pytest.mark.parametrize(
    ("flags", "cls"),
    [
        ({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}, "amx_bf16"),
        ({"avx2", "avx512f", "avx512_bf16"}, "avx512_bf16"),
        ({"avx2", "avx512f"}, "other"),
        (set(), "other"),
    ],
)
def test_cpu_class_from_flags(flags, cls):
    assert cpu_class_of(flags) == cls


def test_this_machine_defaults_to_its_class_rule(monkeypatch):
    monkeypatch.delenv("TINKRL_DTYPE", raising=False)
    rule = default_rule(probe(), "cpu")
    assert rule is CPU_RULES[probe().cpu_class]
    assert default_dtype(torch.device("cpu")) == parse_dtype(rule.precision) == torch.float32
    assert ServiceClient().dtype is None  # the engine picks the rule's default when none is asked for


def test_default_precision_sampler_and_trainer_agree(monkeypatch):
    monkeypatch.delenv("TINKRL_DTYPE", raising=False)
    tc = ServiceClient(device="cpu").create_lora_training_client(TINY, rank=8, seed=0)
    assert tc.engine.dtype == default_dtype(torch.device("cpu"))
    tok = tc.get_tokenizer()
    prompts = [types.ModelInput.from_ints(tok.encode(t)[:12]) for t in TEXTS]
    assert_agreement_before_and_after_a_step(tc, prompts, AGREEMENT_BOUND, f"default {tc.engine.dtype}")
