"""Training memory: token logprobs a chunk of positions at a time (`local/logprobs.py`), layers
recomputed in the backward, causal attention without a mask, and the plan's training limits
(`local/memory.py`, `plan.with_training_memory`).

What must hold: chunked logprobs equal one call's, forward and gradient, for the loss and for
`compute_logprobs` (and its top-k), with never more than one chunk of positions through the head,
backward included; recomputed layers give the same logprobs and gradients, and run only for a row
longer than the plan's threshold (a long episode, not a pack of short rows) or a micro-batch over its
token limit; a whole sequence alone attends causally without a mask, as with one; the plan
recomputes long rows and micro-batches longer than the trainer packs (or than the memory keeps), and a
micro-batch longer than the machine holds is one clear error before any work; the estimate of what
a step keeps is above what autograd keeps.

Fast: the tiny random-weight model.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers.engine import TINY, assert_close_vectors, datum, flat, logprobs_of, lora_grads, randomize_lora, zero_grads
from tinker import types

from tinkrl.local import ServiceClient, logprobs, transformer
from tinkrl.local.compute_plan import LONG_ROW_TOKENS, MICROBATCH_TOKENS, with_training_memory
from tinkrl.local.losses import LossInputError
from tinkrl.local.memory import MARGIN, StepMemory, step_memory

pytestmark = pytest.mark.cpu_class  # `make test-avx2` runs it again as an AVX2-only CPU


@pytest.fixture
def service():
    return ServiceClient(device="cpu", dtype="float32")


def _trainer(service, seed: int = 0):
    tc = service.create_lora_training_client(TINY, rank=4, seed=seed)
    randomize_lora(tc, scale=0.05, seed=seed)
    return tc


def _data(tok) -> list[types.Datum]:
    opening = "You are a careful assistant. Answer the question that follows briefly. "
    texts = [opening + "Why is the sky blue?", opening + "What is 2 + 3?", "Something else entirely, " * 3]
    seqs = [tok.encode(t) for t in texts]
    return [
        datum(
            s,
            advantages=np.linspace(-1, 1, len(s) - 1),
            logprobs=np.full(len(s) - 1, -2.0),
            weights=np.ones(len(s) - 1),
        )
        for s in seqs
    ]


def _step(tc, data, loss: str = "importance_sampling") -> tuple[list[np.ndarray], torch.Tensor]:
    zero_grads(tc)
    out = tc.forward_backward(data, loss).result()
    return logprobs_of(out), flat(lora_grads(tc))


def test_chunked_logprobs_equal_one_call_and_hold_one_chunk_at_a_time(service, monkeypatch):
    tc = _trainer(service)
    data = _data(tc.get_tokenizer())
    whole_lp, whole_grad = _step(tc, data)
    rows, real = [], transformer.Head.forward
    monkeypatch.setattr(transformer.Head, "forward", lambda self, x: rows.append(x.shape[0]) or real(self, x))
    vocab = tc.engine.config.vocab_size
    monkeypatch.setattr(logprobs, "LOGITS_CHUNK_BYTES", 4 * vocab * 7)  # 7 positions a chunk
    assert logprobs.chunk_rows(vocab) == 7
    chunked_lp, chunked_grad = _step(tc, data)
    assert rows and max(rows) <= 7
    assert sum(rows) > sum(len(lp) for lp in chunked_lp)  # the backward ran the head again, chunk by chunk
    for a, b in zip(chunked_lp, whole_lp, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert_close_vectors(chunked_grad, whole_grad, rel=1e-4)


def test_prompt_logprobs_and_their_top_k_are_chunked_alike(service, monkeypatch):
    sc = service.create_sampling_client(base_model=TINY)
    prompt = types.ModelInput.from_ints(sc.get_tokenizer().encode("Count: one two three four five six seven eight"))
    params = types.SamplingParams(max_tokens=1, temperature=0.0)

    def prompt_figures():
        out = sc.sample(prompt, 1, params, include_prompt_logprobs=True, topk_prompt_logprobs=3).result()
        return np.asarray(out.prompt_logprobs[1:], dtype=np.float64), out.topk_prompt_logprobs

    whole, whole_top = prompt_figures()
    monkeypatch.setattr(logprobs, "LOGITS_CHUNK_BYTES", 4 * service._engine(TINY).config.vocab_size * 3)
    service._engine(TINY).submit(service._engine(TINY).prefix_cache.clear).result()
    chunked, chunked_top = prompt_figures()
    np.testing.assert_allclose(chunked, whole, atol=1e-5)
    assert len(chunked_top) == prompt.length and chunked_top[0] is None
    for a, b in zip(chunked_top[1:], whole_top[1:], strict=True):
        assert [t for t, _ in a] == [t for t, _ in b]


def test_recomputed_layers_train_the_same_and_only_above_the_threshold(service, monkeypatch):
    tc = _trainer(service)
    data = _data(tc.get_tokenizer())[2:]  # one datum alone: one row, no shared opening
    engine = tc.engine
    calls, real = [], transformer.DecoderLayer.forward
    monkeypatch.setattr(
        transformer.DecoderLayer, "forward", lambda self, *a, **kw: calls.append(1) or real(self, *a, **kw)
    )
    kept_lp, kept_grad = _step(tc, data, "cross_entropy")
    layers = engine.config.num_hidden_layers
    assert len(calls) == layers  # the plan's threshold is above this datum: nothing recomputed
    calls.clear()
    monkeypatch.setattr(engine, "plan", dataclasses.replace(engine.plan, recompute_tokens=1))
    recomputed_lp, recomputed_grad = _step(tc, data, "cross_entropy")
    assert len(calls) == 2 * layers  # each layer again in the backward
    np.testing.assert_allclose(recomputed_lp[0], kept_lp[0], atol=1e-6)
    assert_close_vectors(recomputed_grad, kept_grad, rel=1e-5)
    calls.clear()
    # a row over `recompute_row` tokens recomputes; rows shorter than it do not, however many are packed
    longest = len(data[0].model_input.to_ints())
    monkeypatch.setattr(
        engine, "plan", dataclasses.replace(engine.plan, recompute_tokens=1 << 20, recompute_row=longest - 1)
    )
    _step(tc, data, "cross_entropy")
    assert len(calls) == 2 * layers
    calls.clear()
    tok = tc.get_tokenizer()
    short = [tok.encode(w) for w in ("A short answer.", "Another reply here.", "Third one, brief.")]
    assert all(len(s) < longest - 1 for s in short) and sum(map(len, short)) > longest - 1
    _step(tc, [datum(s, weights=np.ones(len(s) - 1)) for s in short], "cross_entropy")
    assert len(calls) == layers
    calls.clear()
    monkeypatch.setattr(engine, "plan", dataclasses.replace(engine.plan, recompute_tokens=1))
    # two groups (a pack each) opening alike: the opening's layers run once, and both parts recompute
    tok, opening = tc.get_tokenizer(), "You are a careful assistant. Answer the question that follows briefly. "
    seqs = [tok.encode(opening + q + a) for q in ("Why is the sky blue?", "What is 2 + 3?") for a in (" One.", " Two!")]
    _step(tc, [datum(s, weights=np.ones(len(s) - 1)) for s in seqs], "cross_entropy")
    assert len(calls) == 4 * layers


def test_a_sequence_alone_attends_causally_without_a_mask(service, monkeypatch):
    tc = _trainer(service)
    data = _data(tc.get_tokenizer())[2:]
    masks, real = [], transformer.Attention._sdpa
    monkeypatch.setattr(
        transformer.Attention,
        "_sdpa",
        lambda self, q, k, v, mask, blocks: masks.append(mask) or real(self, q, k, v, mask, blocks),
    )
    alone_lp, alone_grad = _step(tc, data, "cross_entropy")
    assert masks and all(m is None for m in masks)
    masks.clear()
    short = tc.get_tokenizer().encode("short one")
    padded = [*data, datum(short, weights=np.ones(len(short) - 1))]  # with a shorter row: padding, so a mask
    padded_lp, _ = _step(tc, padded, "cross_entropy")
    assert masks and all(m is not None for m in masks)
    np.testing.assert_allclose(padded_lp[0], alone_lp[0], atol=1e-5)
    with pytest.raises(ValueError, match="needs keys for exactly"):
        attention = tc.engine.base.model.layers[0].self_attn
        attention._sdpa(torch.zeros(1, 4, 2, 16), torch.zeros(1, 2, 3, 16), torch.zeros(1, 2, 3, 16), None, False)
    assert np.isfinite(float(alone_grad.norm()))


def test_the_plan_recomputes_long_micro_batches_and_bounds_a_datum(service):
    plan = service._engine(TINY).plan
    cpu, row = MICROBATCH_TOKENS["cpu"], LONG_ROW_TOKENS["cpu"]
    assert plan.recompute_tokens == cpu and plan.recompute_row == row < cpu
    assert plan.recompute.path == f"for rows over {row} tokens" and plan.recompute.why
    assert plan.train_tokens > cpu  # this machine's memory holds more than one packed micro-batch
    step = StepMemory(kept_per_token=1 << 20, recomputed_per_token=1 << 16, weights=1 << 30)
    roomy = with_training_memory(plan, "cpu", 64 << 30, step)
    budget = 0.6 * (64 << 30) - (1 << 30)
    assert roomy.recompute_tokens == cpu and roomy.train_tokens == int(budget // (1 << 16))
    tight = with_training_memory(plan, "cpu", 2 << 30, step)  # not even a packed micro-batch keeps its layers
    assert 0 < tight.recompute_tokens < cpu and "memory" in tight.recompute.why
    assert tight.recompute_row == min(row, tight.recompute_tokens)
    assert tight.train_tokens == int((0.6 * (2 << 30) - (1 << 30)) // (1 << 16))
    unknown = with_training_memory(plan, "cpu", 0, step)
    assert unknown.recompute_tokens == cpu and unknown.train_tokens == 0  # no limit where memory is unknown
    assert f"layers recomputed for rows over {row} tokens" in roomy.line()


def test_a_micro_batch_the_machine_cannot_hold_is_refused_before_any_work(service, monkeypatch):
    tc = _trainer(service)
    engine = tc.engine
    data = _data(tc.get_tokenizer())
    longest = data[2].model_input.length
    monkeypatch.setattr(engine, "plan", dataclasses.replace(engine.plan, train_tokens=longest - 1))
    before = flat(lora_grads(tc))
    zero_grads(tc)
    with pytest.raises(
        LossInputError, match=rf"{longest} tokens, but one training micro-batch fits at most {longest - 1}"
    ):
        tc.forward_backward(data[2:], "cross_entropy").result()
    assert float(flat(lora_grads(tc)).norm()) == 0.0 and before.numel()  # no gradient accumulated
    monkeypatch.setattr(engine, "plan", dataclasses.replace(engine.plan, train_tokens=longest))
    tc.forward_backward(data[2:], "cross_entropy").result()  # what fits trains
    tc.forward(data[2:]).result()  # a forward keeps nothing for a backward: not bounded


def test_the_estimate_is_above_what_autograd_keeps(service):
    """Per token (the slope between two lengths, so the fixed parts cancel), the bytes of the tensors a
    forward saves for its backward, kept and recomputed, are within what `step_memory` allows before
    its margin."""
    engine = service._engine(TINY)
    model = service.create_lora_training_client(TINY, rank=4, seed=0).trainer.model
    estimate = step_memory(engine.config)

    def saved(tokens: int, recompute: bool) -> int:
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        ids = torch.randint(0, 1000, (1, tokens))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(ids, torch.arange(tokens)[None], None, recompute=recompute)
        return sum(storages.values())

    for recompute, allowed in ((False, estimate.kept_per_token), (True, estimate.recomputed_per_token)):
        per_token = (saved(1024, recompute) - saved(256, recompute)) / 768
        assert 0 < per_token <= allowed / MARGIN, (recompute, per_token, allowed)
