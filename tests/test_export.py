"""`tinkrl export`: a checkpoint as a PEFT adapter (loads with peft over the base transformers model)
or as a merged HF model; both reproduce the engine's trained policy, and a trained unembedding on a
tied-embedding model leaves the merged model's input embeddings untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.engine import TEXTS, TINY, datum, logprobs_of  # noqa: F401
from tinker import types

from tinkrl.cli import main as tinkrl
from tinkrl.local import ServiceClient
from tinkrl.local.models import load_model


@pytest.fixture
def trained(isolated_home):
    tc = ServiceClient().create_lora_training_client(TINY, rank=4, seed=0, train_unembed=True)
    tok = tc.get_tokenizer()
    seq = tok.encode(TEXTS[1])[:16]
    d = datum(seq, weights=np.ones(len(seq) - 1))
    for _ in range(2):  # a learning rate big enough to move the outputs visibly
        tc.forward_backward([d]).result()
        tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
    path = tc.save_weights_for_sampler("export-me").result().path
    engine_lp = logprobs_of(tc.forward([d]).result())[0]
    return path, seq, engine_lp


def _logprobs(model, seq) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.tensor([seq[:-1]])).logits[0].double()
    return logits.log_softmax(-1).gather(-1, torch.tensor(seq[1:])[:, None])[:, 0].numpy()


def test_export_adapter_and_merged_model(trained, tmp_path, capsys):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, seq, engine_lp = trained
    base = load_model(TINY, torch.device("cpu"), torch.float32).model
    base_embed = base.get_input_embeddings().weight.detach().clone()
    base_lp = _logprobs(base, seq)
    assert np.abs(engine_lp - base_lp).max() > 0.05  # training changed the policy

    assert tinkrl(["export", path, "--out", str(tmp_path / "adapter")]) == 0
    assert "PEFT adapter" in capsys.readouterr().out
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    adapted = PeftModel.from_pretrained(
        load_model(TINY, torch.device("cpu"), torch.float32).model, tmp_path / "adapter"
    )
    adapter_lp = _logprobs(adapted, seq)
    np.testing.assert_allclose(adapter_lp, engine_lp, atol=1e-3)

    assert tinkrl(["export", path, "--out", str(tmp_path / "merged"), "--merged"]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    assert AutoTokenizer.from_pretrained(tmp_path / "merged").encode(TEXTS[1])[:16] == seq  # tokenizer shipped
    np.testing.assert_allclose(_logprobs(merged, seq), adapter_lp, atol=1e-4)

    # the trained unembedding was untied: input embeddings are the base model's, the head moved
    assert not merged.config.tie_word_embeddings
    assert torch.equal(merged.get_input_embeddings().weight, base_embed)
    assert not torch.equal(merged.get_output_embeddings().weight, base_embed)


def test_export_of_a_missing_checkpoint_is_one_line(isolated_home, tmp_path, capsys):
    assert tinkrl(["export", "tinker://local-nope/sampler_weights/x", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not found" in err and "local-nope" in err
