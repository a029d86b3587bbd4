"""The embedded engine's Tinker API: futures and ordering, gradient accumulation, AdamW and clipping,
checkpoints (tinker:// paths, optimizer state), pinned sampling clients, sampling parameters,
concurrent sampling, exact prefix packing, capabilities, errors, and the tiny architectures.

Fast: the tiny random-weight models (tinkrl/tiny-*), which share SmolLM2's tokenizer.
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from helpers.engine import (  # noqa: F401
    TEST_DTYPE,
    TEXTS,
    TINY,
    assert_close_vectors,
    datum,
    flat,
    logprobs_of,
    lora_grads,
    lora_weights,
    on_engine,
    randomize_lora,
    zero_grads,
)
from tinker import types

from tinkrl.local import LocalFuture, ServiceClient, transformer
from tinkrl.local.checkpoints import CheckpointNotFound
from tinkrl.local.models import DEFAULT_MODEL, ModelNotFoundError
from tinkrl.local.packing import pack_sequences, pack_tensors, shared_opening
from tinkrl.local.sampler import _inverse_cdf
from tinkrl.local.transformer import frozen_linear, ieee_attention

pytestmark = pytest.mark.cpu_class  # `make test-avx2` runs it again as an AVX2-only CPU


@pytest.fixture(scope="module")
def service():
    return ServiceClient(dtype=TEST_DTYPE)


@pytest.fixture(scope="module")
def tok(service):
    return service.create_sampling_client(base_model=TINY).get_tokenizer()


@pytest.fixture(scope="module")
def seqs(tok):
    return [tok.encode(t)[:20] for t in TEXTS]


def ce(s: list[int]) -> types.Datum:
    return datum(s, weights=np.ones(len(s) - 1))


def new_tc(service, seed: int = 0, rank: int = 4):
    return service.create_lora_training_client(TINY, rank=rank, seed=seed)


def hold_engine(tc):
    """Block the engine thread until the returned event is set (requests queue up behind it)."""
    started, release = threading.Event(), threading.Event()

    def block():
        started.set()
        release.wait(30)

    tc.engine.submit(block)
    assert started.wait(30)
    return release


# -- futures ------------------------------------------------------------------------------------------------


def test_calls_return_futures_at_once_and_run_in_submission_order(service, seqs):
    tc = new_tc(service)
    before = logprobs_of(tc.forward([ce(seqs[0])]).result())[0]
    release = hold_engine(tc)
    try:
        done: list[str] = []
        futs = {
            "fb": tc.forward_backward([ce(seqs[0])]),
            "optim": tc.optim_step(types.AdamParams(learning_rate=0.05)),
            "fwd": tc.forward([ce(seqs[0])]),
        }
        for name, f in futs.items():
            assert isinstance(f, LocalFuture)
            f.add_done_callback(lambda _f, name=name: done.append(name))
        assert not any(f.done() for f in futs.values())  # the engine is busy: nothing ran yet
    finally:
        release.set()
    after = logprobs_of(futs["fwd"].result())[0]
    assert done == ["fb", "optim", "fwd"]
    # the forward submitted after optim_step saw the updated weights
    assert np.abs(after - before).max() > 1e-3
    assert futs["optim"].result().metrics["step:max"] == 1.0


def test_futures_are_awaitable(service, seqs):
    tc = new_tc(service)
    sc = tc.save_weights_and_get_sampling_client()

    async def go():
        fwd = await tc.forward([ce(seqs[0])])
        fb = await tc.forward_backward([ce(seqs[0])])
        opt = await tc.optim_step(types.AdamParams(learning_rate=1e-3))
        sample = await sc.sample(types.ModelInput.from_ints(seqs[0][:5]), 1, types.SamplingParams(max_tokens=3))
        via_result_async = await tc.forward([ce(seqs[0])]).result_async(30)
        return fwd, fb, opt, sample, via_result_async

    fwd, fb, opt, sample, again = asyncio.run(go())
    assert isinstance(fwd, types.ForwardBackwardOutput) and isinstance(fb, types.ForwardBackwardOutput)
    assert isinstance(opt, types.OptimStepResponse) and len(sample.sequences[0].tokens) == 3
    assert fwd.metrics["loss:sum"] == pytest.approx(fb.metrics["loss:sum"], rel=1e-6)
    assert again.metrics["loss:sum"] != fwd.metrics["loss:sum"]  # after the step


# -- gradients and the optimizer -----------------------------------------------------------------------------


def test_gradients_accumulate_until_optim_step(service, seqs):
    tc = new_tc(service)
    randomize_lora(tc)
    tc.forward_backward([ce(seqs[0])]).result()
    tc.forward_backward([ce(seqs[1])]).result()
    accumulated = flat(lora_grads(tc))
    zero_grads(tc)
    tc.forward_backward([ce(seqs[0]), ce(seqs[1])]).result()
    together = flat(lora_grads(tc))
    assert_close_vectors(accumulated, together, rel=1e-4)
    out = tc.optim_step(types.AdamParams(learning_rate=1e-4)).result()
    assert out.metrics["grad_norm:mean"] == pytest.approx(float(together.norm()), rel=1e-4)
    assert float(flat(lora_grads(tc)).norm()) == 0.0  # cleared by the step
    # a step with no new gradients reports 0
    assert tc.optim_step(types.AdamParams(learning_rate=1e-4)).result().metrics["grad_norm:mean"] == 0.0


def _reference_adamw(params0, grads_per_step, p: types.AdamParams):
    names = sorted(params0)
    leaves = [params0[n].clone().double().requires_grad_(True) for n in names]
    opt = torch.optim.AdamW(
        leaves, lr=p.learning_rate, betas=(p.beta1, p.beta2), eps=p.eps, weight_decay=p.weight_decay
    )
    norms = []
    for grads in grads_per_step:
        for leaf, n in zip(leaves, names):
            leaf.grad = grads[n].clone().double()
        clip = p.grad_clip_norm if p.grad_clip_norm > 0 else float("inf")
        norms.append(float(torch.nn.utils.clip_grad_norm_(leaves, clip)))
        opt.step()
    return {n: leaf.detach() for n, leaf in zip(names, leaves)}, norms


@pytest.mark.parametrize("clip", [0.0, "tenth"])
def test_adamw_matches_torch_and_clipping(service, seqs, clip):
    """Two steps against torch.optim.AdamW on the same gradients. eps is large so the update depends on
    the gradient's magnitude (plain Adam is scale-free on its first step) and clipping shows."""
    tc = new_tc(service)
    randomize_lora(tc)
    w0 = lora_weights(tc)
    grads_seen, norms_reported = [], []
    p = None
    for step in range(2):
        tc.forward_backward([ce(seqs[step]), ce(seqs[2])]).result()
        g = lora_grads(tc)
        norm = float(flat(g).norm())
        grads_seen.append(g)
        if p is None:
            p = types.AdamParams(
                learning_rate=0.01,
                beta1=0.8,
                beta2=0.9,
                eps=1.0,
                weight_decay=0.1,
                grad_clip_norm=0.0 if clip == 0.0 else norm / 10,
            )
        norms_reported.append(tc.optim_step(p).result().metrics["grad_norm:mean"])
    expected, ref_norms = _reference_adamw(w0, grads_seen, p)
    got = lora_weights(tc)
    assert norms_reported == pytest.approx(ref_norms, rel=1e-4)  # the pre-clip norm, clipped or not
    moved = flat({n: got[n] - w0[n] for n in got})
    assert_close_vectors(moved, flat({n: expected[n] - w0[n] for n in got}), rel=1e-4)
    if clip != 0.0:  # clipping made the update smaller than the unclipped reference's
        unclipped, _ = _reference_adamw(w0, grads_seen, p.model_copy(update={"grad_clip_norm": 0.0}))
        assert float(moved.norm()) < 0.5 * float(flat({n: unclipped[n] - w0[n] for n in got}).norm())


# -- checkpoints -----------------------------------------------------------------------------------------------


def _train_step(tc, data, lr=0.02):
    tc.forward_backward(data).result()
    tc.optim_step(types.AdamParams(learning_rate=lr)).result()


def test_save_state_resume_continues_exactly(service, seqs, isolated_home):
    data = [ce(seqs[0]), ce(seqs[1])]
    tc = new_tc(service, seed=3)
    _train_step(tc, data)
    path = tc.save_state("mid").result().path
    assert path == f"tinker://{tc.run_id}/weights/mid"
    ckpt = isolated_home / "checkpoints" / tc.run_id / "weights" / "mid"
    assert (ckpt / "tinkrl_meta.json").is_file() and (ckpt / "optimizer.pt").is_file()
    _train_step(tc, data)
    uninterrupted = tc.forward(data).result().metrics["loss:sum"]

    resumed = service.create_training_client_from_state_with_optimizer(path)
    assert resumed.trainer.step == 1
    _train_step(resumed, data)
    assert resumed.forward(data).result().metrics["loss:sum"] == pytest.approx(uninterrupted, rel=1e-6, abs=1e-6)

    # weights only: same weights, fresh optimizer -> a different next step
    fresh = service.create_training_client_from_state(path)
    loaded = lora_weights(fresh)
    other = service.create_training_client_from_state_with_optimizer(path)
    for n, w in lora_weights(other).items():
        torch.testing.assert_close(loaded[n], w, rtol=0, atol=0)
    assert len(fresh.trainer.optimizer.state) == 0 and len(other.trainer.optimizer.state) > 0
    _train_step(fresh, data)
    assert abs(fresh.forward(data).result().metrics["loss:sum"] - uninterrupted) > 1e-3

    # absolute directory paths work too
    by_dir = service.create_training_client_from_state_with_optimizer(str(ckpt))
    _train_step(by_dir, data)
    assert by_dir.forward(data).result().metrics["loss:sum"] == pytest.approx(uninterrupted, rel=1e-6, abs=1e-6)


def test_tinker_paths_resolve_through_tinkrl_home(service, seqs, isolated_home, tmp_path, monkeypatch):
    tc = new_tc(service)
    _train_step(tc, [ce(seqs[0])], lr=0.05)
    path = tc.save_weights_for_sampler("s1").result().path
    assert path == f"tinker://{tc.run_id}/sampler_weights/s1"
    ckpt = isolated_home / "checkpoints" / tc.run_id / "sampler_weights" / "s1"
    assert (ckpt / "adapter_config.json").is_file() and not (ckpt / "optimizer.pt").exists()
    prompt = types.ModelInput.from_ints(seqs[0][:6])
    params = types.SamplingParams(max_tokens=6, seed=7)
    live = tc.save_weights_and_get_sampling_client().sample(prompt, 1, params).result().sequences[0]
    for p in (path, str(ckpt)):
        got = service.create_sampling_client(model_path=p).sample(prompt, 1, params).result().sequences[0]
        assert list(got.tokens) == list(live.tokens)
        np.testing.assert_allclose(got.logprobs, live.logprobs, atol=1e-5)
    # a sampler checkpoint holds no optimizer state
    with pytest.raises(CheckpointNotFound, match="optimizer"):
        service.create_training_client_from_state_with_optimizer(path)
    # another TINKRL_HOME does not know the run; the error says where it looked
    monkeypatch.setenv("TINKRL_HOME", str(tmp_path / "elsewhere"))
    with pytest.raises(CheckpointNotFound, match="elsewhere"):
        service.create_sampling_client(model_path=path)
    # ... but the absolute directory still works
    service.create_sampling_client(model_path=str(ckpt))


def test_a_checkpoint_name_saved_again_serves_the_new_weights(service, seqs, isolated_home):
    tc = new_tc(service)
    prompt = types.ModelInput.from_ints(seqs[0][:6])
    params = types.SamplingParams(max_tokens=4, seed=1)
    path = tc.save_weights_for_sampler("latest").result().path
    first = service.create_sampling_client(model_path=path).sample(prompt, 1, params).result().sequences[0]
    _train_step(tc, [ce(seqs[0])], lr=0.1)
    assert tc.save_weights_for_sampler("latest").result().path == path
    again = service.create_sampling_client(model_path=path).sample(prompt, 1, params).result().sequences[0]
    live = tc.save_weights_and_get_sampling_client().sample(prompt, 1, params).result().sequences[0]
    np.testing.assert_allclose(again.logprobs, live.logprobs, atol=1e-5)
    assert np.abs(np.asarray(again.logprobs) - np.asarray(first.logprobs)).max() > 1e-3


def test_sampling_client_is_pinned_to_its_weights(service, seqs):
    tc = new_tc(service)
    randomize_lora(tc, scale=0.02)
    prompt = types.ModelInput.from_ints(seqs[1][:8])
    params = types.SamplingParams(max_tokens=8, seed=11, temperature=1.0)
    pinned = tc.save_weights_and_get_sampling_client()
    first = pinned.sample(prompt, 2, params).result()
    _train_step(tc, [ce(seqs[1])], lr=0.05)
    # without the first call's keys/values: a bf16 sampler's shorter prefill would round differently
    pinned.engine.submit(pinned.engine.prefix_cache.clear).result()
    again = pinned.sample(prompt, 2, params).result()
    fresh = tc.save_weights_and_get_sampling_client().sample(prompt, 2, params).result()
    for a, b in zip(first.sequences, again.sequences):
        assert list(a.tokens) == list(b.tokens)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    diff = max(
        np.abs(np.asarray(a.logprobs[:1]) - np.asarray(b.logprobs[:1])).max()
        for a, b in zip(first.sequences, fresh.sequences)
    )
    tokens_differ = any(list(a.tokens) != list(b.tokens) for a, b in zip(first.sequences, fresh.sequences))
    assert tokens_differ or diff > 1e-3


def test_fp32_samplers_of_different_adapters_sample_their_own_policy(seqs):
    """In fp32 the sampler merges the adapter into its weights (one merged tree per engine):
    clients of adapters with different targets and ranks, used in turn, each sample exactly the
    policy their trainer computes (the MLP and head merged for the first adapter are restored
    for the attention-only one, and merged again after it)."""
    service = ServiceClient(dtype="float32")
    full = service.create_lora_training_client(TINY, rank=4, seed=0)
    attn_only = service.create_lora_training_client(TINY, rank=8, seed=1, train_mlp=False, train_unembed=False)
    randomize_lora(full, scale=0.05, seed=2)
    randomize_lora(attn_only, scale=0.05, seed=3)
    clients = {
        "full": (full, full.save_weights_and_get_sampling_client()),
        "attn_only": (attn_only, attn_only.save_weights_and_get_sampling_client()),
    }
    prompt = seqs[0][:8]
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3, stop=[])
    for name in ("full", "attn_only", "full"):
        tc, sc = clients[name]
        for s in sc.sample(types.ModelInput.from_ints(prompt), 2, params).result().sequences:
            forward = logprobs_of(tc.forward([ce(prompt + list(s.tokens))]).result())[0][len(prompt) - 1 :]
            np.testing.assert_allclose(forward, s.logprobs, atol=1e-4, err_msg=name)


def test_attention_leaves_the_bf16_math_mode_as_it_found_it():
    """CPU attention runs outside the bf16 math mode (same result, a path up to ~35x faster);
    the engine's mode is back afterwards, also when the attention raises."""
    previous = torch.backends.mkldnn.matmul.fp32_precision
    try:
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        with ieee_attention(torch.device("cpu")):
            assert torch.backends.mkldnn.matmul.fp32_precision == "ieee"
        assert torch.backends.mkldnn.matmul.fp32_precision == "bf16"
        with pytest.raises(RuntimeError), ieee_attention(torch.device("cpu")):
            raise RuntimeError("attention failed")
        assert torch.backends.mkldnn.matmul.fp32_precision == "bf16"
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = previous


@pytest.mark.parametrize("with_bias", [False, True])
def test_frozen_linear_equals_f_linear_in_value_and_input_gradient(with_bias):
    """Frozen fp32 projections run through oneDNN on x86 (MKL's sgemm is 2-3x slower on AMD):
    same values and input gradients as `F.linear`, for 3-D and non-contiguous inputs, and
    without autograd from the packed weight, also after the weight is rewritten in place."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 40, generator=g)
    bias = torch.randn(48, generator=g) if with_bias else None
    x = torch.randn(3, 7, 80, generator=g)[..., ::2]  # [3, 7, 40], not contiguous
    grad_out = torch.randn(3, 7, 48, generator=g)
    results = []
    for fn in (frozen_linear, torch.nn.functional.linear):
        xi = x.clone().requires_grad_()
        y = fn(xi, weight, bias)
        y.backward(grad_out)
        results.append((y.detach(), xi.grad))
    (y, gx), (y_ref, gx_ref) = results
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx, gx_ref, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # the sampler's path: a packed copy of the weight, remade when the weight changes
        torch.testing.assert_close(frozen_linear(x, weight, bias), y_ref, rtol=1e-5, atol=1e-5)
        weight.mul_(2)
        torch.testing.assert_close(
            frozen_linear(x, weight, bias), torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-5
        )


@pytest.mark.skipif(not transformer._ONEDNN, reason="oneDNN's products are for x86 CPUs; here F.linear runs")
def test_onednn_sees_a_few_dozen_row_counts_whatever_the_batches(monkeypatch):
    """oneDNN compiles and keeps kernels for every row count it is given (what grew a long-running
    server's memory with every new prompt length): products of any length, with and without autograd,
    reach it only in the sizes `padded_rows` allows, with the values and input gradients of `F.linear`."""
    seen: set[int] = set()
    call = transformer._onednn_call

    def recorded(x, weight, bias):
        seen.add(x.shape[0])
        return call(x, weight, bias)

    monkeypatch.setattr(transformer, "_onednn_call", recorded)
    g = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(24, 16, generator=g), torch.randn(24, generator=g)
    for rows in [*range(1, 70), 255, 256, 257, 511, 512, 513, 1024, 1500, 2049]:
        x = torch.randn(rows, 16, generator=g, requires_grad=True)
        y = frozen_linear(x, weight, bias)
        y.backward(torch.ones_like(y))
        torch.testing.assert_close(y, torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x.grad, weight.sum(0).expand(rows, -1), rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            torch.testing.assert_close(frozen_linear(x, weight), x @ weight.T, rtol=1e-5, atol=1e-5)
    allowed = {transformer.padded_rows(r) for r in range(1, transformer.ROW_CHUNK + 1)}
    assert seen <= allowed and len(allowed) <= 36, sorted(seen - allowed)
    assert all(transformer.padded_rows(r) <= 1.25 * r for r in range(1, transformer.ROW_CHUNK + 1))
    with pytest.raises(ValueError, match="ROW_CHUNK"):
        transformer.padded_rows(transformer.ROW_CHUNK + 1)


# -- sampling ----------------------------------------------------------------------------------------------------


def test_two_level_draw_is_the_inverse_cdf_and_never_picks_filtered_tokens():
    """The sampler finds the token for u in two levels (vocabulary blocks, then inside one);
    on a grid of u it picks what a search of the full cumulative sum picks, and never a
    token of probability zero (top-k/top-p filtered), also at u = 0 and u just below 1."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 1000, generator=g) * 3
    logits[2:] = logits[2:].masked_fill(torch.rand(2, 1000, generator=g) > 0.02, float("-inf"))  # filtered rows
    probs = logits.softmax(-1)
    grid = torch.cat([torch.tensor([0.0, 1 - 2**-24]), (torch.arange(2000) + 0.5) / 2000])
    mismatches = 0
    for u in grid:
        us = u.repeat(4)
        got = _inverse_cdf(probs, us)
        assert (probs.gather(-1, got[:, None]) > 0).all()
        ref = torch.searchsorted(probs.cumsum(-1), (us * probs.sum(-1))[:, None], right=True)[:, 0]
        mismatches += int((got != ref.clamp_max(999)).sum())
    assert mismatches <= 4  # float rounding at a token boundary, or u just below 1


@pytest.fixture(scope="module")
def sampler(service):
    tc = new_tc(service, seed=1)
    randomize_lora(tc, scale=0.02, seed=1)
    return tc, tc.save_weights_and_get_sampling_client()


def _one(sc, tokens, n=1, **params):
    return sc.sample(types.ModelInput.from_ints(tokens), n, types.SamplingParams(**params)).result()


def test_greedy_is_deterministic_and_length_stops(sampler, seqs):
    _, sc = sampler
    a = _one(sc, seqs[0][:8], max_tokens=10, temperature=0.0).sequences[0]
    b = _one(sc, seqs[0][:8], max_tokens=10, temperature=0.0, seed=123).sequences[0]
    assert list(a.tokens) == list(b.tokens) and len(a.tokens) == 10
    assert a.stop_reason == "length"
    top1 = _one(sc, seqs[0][:8], max_tokens=10, temperature=1.0, top_k=1, seed=5).sequences[0]
    assert list(top1.tokens) == list(a.tokens)
    tiny_p = _one(sc, seqs[0][:8], max_tokens=10, temperature=1.0, top_p=1e-6, seed=5).sequences[0]
    assert list(tiny_p.tokens) == list(a.tokens)


def test_stop_token_ids_and_stop_strings(sampler, seqs, tok):
    _, sc = sampler
    prompt = seqs[2][:8]
    ref = list(_one(sc, prompt, max_tokens=12, temperature=0.0).sequences[0].tokens)
    k = 5
    first = ref.index(ref[k])  # the first occurrence of that token
    stopped = _one(sc, prompt, max_tokens=12, temperature=0.0, stop=[ref[k]]).sequences[0]
    assert list(stopped.tokens) == ref[: first + 1] and stopped.stop_reason == "stop"

    text = tok.decode(ref)
    pieces = [tok.decode(ref[:i]) for i in range(1, len(ref) + 1)]
    target_end = next(i for i in range(3, len(ref)) if len(pieces[i].strip()) > len(pieces[2].strip()))
    stop_string = text[len(pieces[2]) : len(pieces[target_end])][-3:]
    assert stop_string
    by_string = _one(sc, prompt, max_tokens=12, temperature=0.0, stop=[stop_string]).sequences[0]
    out = tok.decode(list(by_string.tokens))
    assert by_string.stop_reason == "stop" and stop_string in out
    assert stop_string not in tok.decode(list(by_string.tokens)[:-1])
    assert list(by_string.tokens) == ref[: len(by_string.tokens)]


def test_seeds_num_samples_and_temperature(sampler, seqs):
    _, sc = sampler
    prompt = seqs[1][:8]
    a = _one(sc, prompt, 4, max_tokens=8, seed=42)
    b = _one(sc, prompt, 4, max_tokens=8, seed=42)
    c = _one(sc, prompt, 4, max_tokens=8, seed=43)
    assert len(a.sequences) == 4
    assert [list(s.tokens) for s in a.sequences] == [list(s.tokens) for s in b.sequences]
    assert [list(s.tokens) for s in a.sequences] != [list(s.tokens) for s in c.sequences]
    assert len({tuple(s.tokens) for s in a.sequences}) > 1  # the samples of one request differ
    for s in a.sequences:
        assert len(s.logprobs) == len(s.tokens) and all(lp <= 0 for lp in s.logprobs)


def test_prompt_logprobs_and_sampled_logprobs_equal_forward(sampler, seqs):
    tc, sc = sampler
    prompt = seqs[0][:12]
    resp = _one(sc, prompt, max_tokens=6, seed=3, temperature=0.7)
    computed = sc.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
    included = (
        sc.sample(
            types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=1), include_prompt_logprobs=True
        )
        .result()
        .prompt_logprobs
    )
    assert computed[0] is None and included[0] is None and len(computed) == len(prompt)
    full = prompt + list(resp.sequences[0].tokens)
    fwd = logprobs_of(tc.forward([ce(full)]).result())[0]
    np.testing.assert_allclose(np.asarray(computed[1:], dtype=np.float64), fwd[: len(prompt) - 1], atol=1e-3)
    np.testing.assert_allclose(np.asarray(included[1:], dtype=np.float64), fwd[: len(prompt) - 1], atol=1e-3)
    # the sampled tokens' logprobs are the policy's (T=1, untruncated) even when drawn at T=0.7
    np.testing.assert_allclose(resp.sequences[0].logprobs, fwd[len(prompt) - 1 :], atol=1e-3)


def test_prompts_sharing_an_opening_sample_as_they_do_alone(sampler, seqs, tok):
    """Prompts that open alike (a chat template's system turn) prefill that opening once and copy its
    keys/values to every row; each request still gets what it gets alone: greedy tokens, their
    logprobs, and prompt logprobs (prefix and rest), with prompts of different lengths."""
    tc, sc = sampler
    opening = tok.encode("You are a careful assistant. Answer the user's question briefly.")
    assert len(opening) >= 8
    prompts = [opening + s[:n] for s, n in zip(seqs, (1, 4, 9, 6))]
    params = types.SamplingParams(max_tokens=5, temperature=0.0)
    futures = [sc.sample(types.ModelInput.from_ints(p), 1, params, include_prompt_logprobs=True) for p in prompts]
    together = [f.result() for f in futures]  # submitted together: one batch, shared prefill
    for p, got in zip(prompts, together):
        alone = sc.sample(types.ModelInput.from_ints(p), 1, params, include_prompt_logprobs=True).result()
        assert list(got.sequences[0].tokens) == list(alone.sequences[0].tokens)
        np.testing.assert_allclose(got.sequences[0].logprobs, alone.sequences[0].logprobs, atol=1e-4)
        np.testing.assert_allclose(
            np.asarray(got.prompt_logprobs[1:], dtype=np.float64),
            np.asarray(alone.prompt_logprobs[1:], dtype=np.float64),
            atol=1e-4,
        )
        fwd = logprobs_of(tc.forward([ce(p + list(got.sequences[0].tokens))]).result())[0]
        np.testing.assert_allclose(np.asarray(got.prompt_logprobs[1:], dtype=np.float64), fwd[: len(p) - 1], atol=1e-3)


def test_concurrent_samples_agree_with_sequential(sampler, seqs):
    _, sc = sampler
    prompts = [s[: 6 + i % 4] for i, s in enumerate(seqs * 4)]

    def run(i):  # mixed lengths, budgets (rows finish at different steps) and top_k / top_p filters
        extra = [{"top_k": 5}, {"top_p": 0.9}, {}, {"temperature": 0.0}][i % 4]
        params = {"max_tokens": 3 + i % 5, "seed": 100 + i, "temperature": 1.0, **extra}
        return _one(sc, prompts[i], 2, **params)

    sequential = [run(i) for i in range(len(prompts))]
    with ThreadPoolExecutor(len(prompts)) as pool:
        concurrent = list(pool.map(run, range(len(prompts))))
    assert [len(r.sequences[0].tokens) for r in sequential] == [3 + i % 5 for i in range(len(prompts))]
    for s, c in zip(sequential, concurrent):
        for a, b in zip(s.sequences, c.sequences):
            assert list(a.tokens) == list(b.tokens)
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-3)


@pytest.mark.parametrize("static", [False, True])
def test_static_decoding_samples_as_eager_decoding(sampler, seqs, static):
    """The fixed-shape decode step (what CUDA replays as a graph: keys/values written at a tensor
    index, the whole cache attended under a mask) samples what eager decoding samples: same tokens,
    stop reasons and logprobs, through a LoRA tree, with rows finishing at different steps (finished
    rows stay in the batch until half are gone, then the batch is compacted), seeds, filters and
    stop tokens. On CUDA the default is static, so the parameter compares each mode with the other."""
    from tinkrl.local.sampler import SampleJob, sample_batch

    tc, sc = sampler
    engine = sc.engine
    stop_token = seqs[2][7]

    def jobs():
        out = []
        for i, s in enumerate(seqs * 3):
            extra = [{"top_k": 5}, {"top_p": 0.9}, {"stop": [stop_token]}, {"temperature": 0.0}][i % 4]
            params = {"max_tokens": 2 + 2 * (i % 7), "seed": 100 + i, "temperature": 1.0, **extra}
            out.append(SampleJob(s[: 6 + i % 5], 2, types.SamplingParams(**params)))
        return out

    def run(use_static):
        batch = jobs()
        tree = engine.sampler_tree(sc.snapshot)
        engine.submit(
            lambda: sample_batch(
                tree, engine.paths, batch, engine.tokenizer, engine.eos_id, engine.max_context, static=use_static
            )
        ).result()
        return [seq for job in batch for seq in job.result.sequences]

    reference, got = run(not static), run(static)
    assert len({len(s.tokens) for s in reference}) >= 5  # rows really finished at different steps
    for a, b in zip(reference, got):
        assert list(a.tokens) == list(b.tokens) and a.stop_reason == b.stop_reason
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_empty_prompt_and_bad_num_samples_are_errors(sampler):
    _, sc = sampler
    with pytest.raises(ValueError, match="num_samples"):
        sc.sample(types.ModelInput.from_ints([1, 2]), 0, types.SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="empty"):
        sc.sample(types.ModelInput.from_ints([]), 1, types.SamplingParams(max_tokens=2)).result()
    with pytest.raises(ValueError, match="49152 is outside the vocabulary"):
        sc.sample(types.ModelInput.from_ints([1, 49152]), 1, types.SamplingParams(max_tokens=2)).result()


def test_a_bad_request_does_not_fail_the_requests_batched_with_it(sampler):
    _, sc = sampler
    release = hold_engine(sampler[0])  # queue the requests so they would be merged into one batch
    try:
        good = [
            sc.sample(types.ModelInput.from_ints([1, 2, 3 + i]), 1, types.SamplingParams(max_tokens=3))
            for i in range(3)
        ]
        for bad in ([], [-1], [10**7]):
            with pytest.raises(ValueError):
                sc.sample(types.ModelInput.from_ints(bad), 1, types.SamplingParams(max_tokens=3)).result(30)
    finally:
        release.set()
    assert [len(g.result(60).sequences[0].tokens) for g in good] == [3, 3, 3]


# -- packing -------------------------------------------------------------------------------------------------------


def test_groups_of_different_prompts_pack_apart():
    """Two GRPO groups whose prompts share only the chat template's opening: merging them would
    run more tokens (each member's shared prefix shrinks) in one long, quadratic-attention pack."""
    opening = list(range(100, 130))
    # (a next group's first member would run 3 tokens cheaper in the first pack than alone)
    groups = [opening + [p] * 9 + [1000 + k] * 16 for p in (7, 8) for k in range(4)]
    packs = pack_sequences(groups)
    assert sorted(len(p.members) for p in packs) == [4, 4]
    assert sum(len(p.tokens) for p in packs) == 2 * (39 + 4 * 16)
    # single sequences sharing the opening still pack: there it saves tokens
    loose = [opening + [k] * 40 for k in range(3)]
    assert sum(len(p.tokens) for p in pack_sequences(loose)) < sum(map(len, loose))


def test_groups_sharing_an_opening_train_exactly(service, seqs, tok):
    """Two GRPO groups whose prompts open alike, plus a lone sequence with the same opening: the
    opening runs once for the micro-batch (shared_opening), yet every datum's logprobs and the
    summed gradients equal those of each datum run alone."""
    tc = new_tc(service)
    randomize_lora(tc, scale=0.02)
    opening = tok.encode("You are a careful assistant. Answer the user's question briefly.")
    prompts = [opening + tok.encode(q) for q in ("What is 12 + 30?", "Name a colour.")]
    data_seqs = [p + s[:n] for p in prompts for s, n in zip(seqs, (3, 5, 2))] + [opening + seqs[2][:7]]
    packs = pack_sequences(data_seqs)
    assert sorted(len(p.members) for p in packs) == [1, 3, 3]
    assert shared_opening(packs) == len(opening)
    data = [ce(s) for s in data_seqs]
    zero_grads(tc)
    together = logprobs_of(tc.forward_backward(data, "cross_entropy").result())
    packed = flat(lora_grads(tc))
    zero_grads(tc)
    for d, lp in zip(data, together):
        alone = logprobs_of(tc.forward_backward([d], "cross_entropy").result())[0]
        np.testing.assert_allclose(lp, alone, atol=1e-4)
    assert_close_vectors(packed, flat(lora_grads(tc)), rel=1e-3)
    zero_grads(tc)


def test_untrained_positions_of_a_grpo_batch_report_their_own_logprobs(service, seqs, tok):
    """RL datums train only their last tokens; every other position (the prompt, and the first
    response tokens, whose targets differ between a group's members at the same pack position)
    is computed once per distinct hidden state and target. Each datum still gets its own logprob
    at every position, as when it runs alone through the exact head."""
    tc = new_tc(service)
    randomize_lora(tc, scale=0.02)
    opening = tok.encode("You are a careful assistant. Answer the user's question briefly.")
    prompts = [opening + tok.encode(q) for q in ("What is 12 + 30?", "Name a colour.")]
    data_seqs = [p + s[:n] for p in prompts for s, n in zip(seqs, (4, 6, 5))]
    rl = []
    for s in data_seqs:
        trained = np.zeros(len(s) - 1)
        trained[-2:] = 1.0
        rl.append(datum(s, logprobs=-0.5 * trained, advantages=0.3 * trained))
    together = logprobs_of(tc.forward(rl, "importance_sampling").result())
    atol = 1e-4 if TEST_DTYPE == "float32" else 2e-2  # untrained positions use the compute-dtype head
    for s, lp in zip(data_seqs, together):
        alone = logprobs_of(tc.forward([ce(s)]).result())[0]
        np.testing.assert_allclose(lp, alone, atol=atol)


def test_packing_is_exact(service, seqs, tok):
    tc = new_tc(service)
    randomize_lora(tc, scale=0.02)
    prompt = tok.encode("A shared prompt that every member of the group starts with, like a GRPO group.")
    suffixes = [tok.encode(t)[:n] for t, n in zip(TEXTS + ["ok"], (3, 9, 14, 1))]
    group = [prompt + s for s in suffixes] + [seqs[0]]  # plus one unrelated sequence
    packs = pack_sequences(group)
    shared = [p for p in packs if len(p.members) > 1]
    assert len(shared) == 1 and len(shared[0].members) == 4
    assert len(shared[0].tokens) == len(prompt) + sum(len(s) for s in suffixes)
    # every member sees exactly its own tokens at its own positions
    ids, pos, mask = pack_tensors(packs, "cpu")
    for b, p in enumerate(packs):
        for i, idx in p.members:
            assert ids[b, idx].tolist() == group[i] and pos[b, idx].tolist() == list(range(len(group[i])))
            sub = mask[b, 0][idx][:, idx]
            assert torch.equal(sub, torch.tril(torch.ones(len(idx), len(idx), dtype=torch.bool)))
            others = [j for j in range(ids.shape[1]) if j not in idx]
            assert not mask[b, 0][idx][:, others].any()

    data = [ce(s) for s in group]
    together = logprobs_of(tc.forward(data).result())
    for d, lp in zip(data, together):
        alone = logprobs_of(tc.forward([d]).result())[0]
        np.testing.assert_allclose(lp, alone, atol=1e-4)
    # and gradients: the packed batch equals the sum of the single-datum gradients
    zero_grads(tc)
    tc.forward_backward(data, "cross_entropy").result()
    packed = flat(lora_grads(tc))
    zero_grads(tc)
    for d in data:
        tc.forward_backward([d]).result()
    assert_close_vectors(packed, flat(lora_grads(tc)), rel=1e-3)
    zero_grads(tc)


# -- models ----------------------------------------------------------------------------------------------------------


def test_capabilities_list_default_and_tiny_models(service):
    names = [m.model_name for m in service.get_server_capabilities().supported_models]
    assert DEFAULT_MODEL in names
    assert {"tinkrl/tiny-llama", "tinkrl/tiny-qwen2", "tinkrl/tiny-qwen3"} <= set(names)


def test_dtype_names(monkeypatch):
    from tinkrl.errors import TinkrlError
    from tinkrl.local.models import default_dtype

    assert ServiceClient(dtype="fp32").dtype == ServiceClient(dtype="float32").dtype == torch.float32
    assert ServiceClient(dtype="bf16").dtype == torch.bfloat16
    with pytest.raises(TinkrlError, match="float16.*float32 or bfloat16"):
        ServiceClient(dtype="float16")
    # the environment override reads the same names, with the same error
    monkeypatch.setenv("TINKRL_DTYPE", "bf16")
    assert default_dtype(torch.device("cpu")) == torch.bfloat16
    monkeypatch.setenv("TINKRL_DTYPE", "float16")
    with pytest.raises(TinkrlError, match="float16.*float32 or bfloat16"):
        default_dtype(torch.device("cpu"))


def test_missing_model_is_one_clear_line(service, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # not on disk, no download: tests/test_model_downloads.py has the rest
    with pytest.raises(ModelNotFoundError) as info:
        service.create_lora_training_client("no-such-org/no-such-model-7b")
    msg = str(info.value)
    assert "\n" not in msg and "no-such-org/no-such-model-7b" in msg
    assert "looked in" in msg and "Hugging Face cache" in msg and str(tmp_path / "hub") in msg


@pytest.mark.parametrize("model", ["tinkrl/tiny-llama", "tinkrl/tiny-qwen2", "tinkrl/tiny-qwen3"])
def test_tiny_architectures_match_transformers_and_train(service, model, seqs):
    """Our transformer's forward equals the transformers model's own forward, and sample +
    forward_backward + optim_step work, for each tiny architecture."""
    from tinkrl.local.models import load_model

    tc = service.create_lora_training_client(model, rank=4)
    s = seqs[1]
    ours = logprobs_of(tc.forward([ce(s)]).result())[0]
    hf = load_model(model, torch.device("cpu"), torch.float32).model
    with torch.no_grad():
        logits = hf(torch.tensor([s[:-1]])).logits[0].double()
    theirs = logits.log_softmax(-1).gather(-1, torch.tensor(s[1:])[:, None])[:, 0].numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-3)
    assert tc.get_info().model_data.arch == hf.config.model_type

    sc = tc.save_weights_and_get_sampling_client()
    out = sc.sample(types.ModelInput.from_ints(s[:6]), 2, types.SamplingParams(max_tokens=5, seed=0)).result()
    assert [len(q.tokens) for q in out.sequences] == [5, 5]
    before = tc.forward_backward([ce(s)]).result().metrics["loss:sum"]
    tc.optim_step(types.AdamParams(learning_rate=0.02)).result()
    after = tc.forward([ce(s)]).result().metrics["loss:sum"]
    assert after < before  # one step of cross-entropy lowers the loss on its own datum


# -- torch.compile ---------------------------------------------------------------------------------------------


def test_compiled_code_is_cached_per_instruction_set(service, tmp_path, monkeypatch):
    """torch.compile's cache is tinkrl's own (under ~/.cache/tinkrl, kept across reboots, which `tinkrl
    train --prepare` fills), a folder per instruction set: code compiled under `ATEN_CPU_CAPABILITY=avx2`
    aborts a process running without the cap. A cache directory the user set is kept."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""))  # restored after
    monkeypatch.setattr(transformer, "_USER_COMPILE_CACHE", None)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    here = transformer.compile_cache_dir()
    assert here.parent == tmp_path / "tinkrl" / "inductor"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    capped = transformer.compile_cache_dir()
    assert capped.parent == here.parent and capped != here
    tree = service._engine(TINY).new_tree()
    assert transformer.compile_layers(tree)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(capped)  # where inductor writes when it compiles
    monkeypatch.setattr(transformer, "_USER_COMPILE_CACHE", str(tmp_path / "mine"))
    assert transformer.compile_cache_dir() == tmp_path / "mine"


def test_compiled_training_matches_eager(service, seqs, tok):
    """compile=True fuses the layers' elementwise work; losses, logprobs and gradients stay those of
    the eager forward, across batches of different shapes (dynamic shapes, no wrong cached graph)."""
    eager, compiled = new_tc(service), new_tc(ServiceClient(dtype=TEST_DTYPE, compile=True))
    assert compiled.trainer.model.compiled and not eager.trainer.model.compiled
    for tc in (eager, compiled):
        randomize_lora(tc, scale=0.02)
    prompt = tok.encode("Shared prompt of a group")
    opening = tok.encode("You are a careful assistant. Answer the user's question briefly.")
    two_groups = [ce(opening + tok.encode(q) + s[:n]) for q in ("Hi?", "Why?") for s, n in zip(seqs, (2, 4))]
    batches = [
        [ce(s) for s in seqs],
        [ce(prompt + s[:n]) for s, n in zip(seqs, (2, 5, 7, 3))],
        [ce(seqs[1])],
        two_groups,
    ]
    for data in batches:
        outs = []
        for tc in (eager, compiled):
            zero_grads(tc)
            out = tc.forward_backward(data, "cross_entropy").result()
            outs.append((out.metrics["loss:sum"], logprobs_of(out), flat(lora_grads(tc))))
        (loss_e, lp_e, g_e), (loss_c, lp_c, g_c) = outs
        assert loss_c == pytest.approx(loss_e, rel=1e-4)
        for a, b in zip(lp_e, lp_c):
            np.testing.assert_allclose(b, a, atol=1e-4)
        assert_close_vectors(g_c, g_e, rel=1e-3)


def test_unembedding_lora_forward_equals_peft(service):
    """The fused unembedding LoRA (one addmm into the base logits) computes peft's sum, and its gradients."""
    tc = new_tc(service)
    randomize_lora(tc, scale=0.05)
    head = tc.trainer.model.lm_head
    x = torch.randn(7, head.in_features).to(head.weight.device)
    grads = []
    for forward in (head.forward, lambda h: type(head).forward(head, h)):  # ours, then peft's own
        params = [head.lora_A["default"].weight, head.lora_B["default"].weight]
        out = on_engine(tc, lambda f=forward: f(x))
        g = torch.autograd.grad((out * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum(), params)
        grads.append((out.detach(), g))
    (ours, g_ours), (peft_out, g_peft) = grads
    torch.testing.assert_close(ours, peft_out, atol=1e-5, rtol=1e-5)
    for a, b in zip(g_ours, g_peft):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert float(g_ours[0].abs().sum()) > 0  # the adapter is live
