"""Qwen2.5-Coder-0.5B-Instruct, the agents' offline model (`make qwen-coder`), in the embedded engine:
its hub name finds the dequantised copy with the network off and renders as Qwen2.5; the engine's
logprobs equal transformers' on its real weights (fp32); sampler and trainer agree at the default
precision, with the trainer's arithmetic and with the bf16 sampler. Slow (a 2 GB model): `make
test-all` runs it, and it is skipped, saying why, where `make qwen-coder` has not run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.engine import TEXTS, assert_agreement_before_and_after_a_step, assert_bf16_tracks, logprobs_of
from tinker import types

from tinkrl.local import ServiceClient
from tinkrl.local.compute_plan import AGREEMENT_BOUND
from tinkrl.local.model_files import describe_model, find_local_model, tinkrl_model_dir
from tinkrl.renderers import get_renderer, load_tokenizer
from tinkrl.renderers.names import recommend

pytestmark = pytest.mark.slow
MODEL = "Qwen/Qwen2.5-Coder-0.5B-Instruct"


@pytest.fixture(scope="module", autouse=True)
def offline_copy():
    where = tinkrl_model_dir(MODEL)
    if not (where / "config.json").is_file():
        pytest.skip(f"{MODEL} is not in the tinkrl cache ({where}): `make qwen-coder` puts it there")
    return where


@pytest.fixture(scope="module")
def prompts():
    tok = load_tokenizer(MODEL)
    return [types.ModelInput.from_ints(tok.encode(t)[:16]) for t in TEXTS]


def test_the_hub_name_finds_the_offline_copy_and_renders_as_qwen(offline_copy, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert find_local_model(MODEL) == offline_copy and str(offline_copy) in describe_model(MODEL)
    assert recommend(MODEL).name == "qwen2"
    renderer = get_renderer(load_tokenizer(MODEL), MODEL)
    text = renderer.tokenizer.decode(renderer.build_generation_prompt([{"role": "user", "content": "hi"}]).to_ints())
    assert text.startswith("<|im_start|>system\nYou are Qwen") and text.endswith("<|im_start|>assistant\n")


def test_the_engines_logprobs_are_transformers_on_the_real_weights(prompts):
    from tinkrl.local.models import load_model

    tc = ServiceClient(device="cpu", dtype="float32").create_lora_training_client(MODEL, rank=8, seed=0)
    tokens = prompts[2].to_ints() + prompts[0].to_ints()
    target = np.asarray(tokens[1:])
    data = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": target, "weights": np.ones(len(target), dtype=np.float32)},
    )
    ours = logprobs_of(tc.forward([data], "cross_entropy").result())[0]
    hf = load_model(MODEL, torch.device("cpu"), torch.float32).model
    with torch.no_grad():
        logits = hf(torch.tensor([tokens[:-1]])).logits[0].double()
    theirs = logits.log_softmax(-1).gather(-1, torch.tensor(target)[:, None])[:, 0].numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-3)
    assert theirs.mean() > -6  # a real model: far likelier than uniform over 151,936 tokens (-11.9)


def test_sampler_and_trainer_agree_at_the_default_precision(prompts):
    tc = ServiceClient(device="cpu", sampler_precision="matched").create_lora_training_client(MODEL, rank=8, seed=0)
    assert_agreement_before_and_after_a_step(tc, prompts, AGREEMENT_BOUND, f"{MODEL} default {tc.engine.dtype}")
    bf16 = ServiceClient(device="cpu", sampler_precision="bfloat16").create_lora_training_client(MODEL, rank=8, seed=0)
    assert_bf16_tracks(bf16, bf16.save_weights_and_get_sampling_client(), prompts)
