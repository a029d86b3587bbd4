"""bf16 sampling (`sampler_precision="bfloat16"`): the sampler multiplies bf16 activations by bf16
copies of the weights, the trainer keeps its own arithmetic.

What must hold: the bf16 copies are the sampler's alone (the trainer of such an engine computes
exactly what a matched engine's trainer does); the sampler samples its own policy (a sampled
token's logprob is what the same bf16 tree gives the finished sequence, for the base model and for
LoRA snapshots, each pinned to its weight version); it stays within bf16 rounding of the trainer's
policy; and the setting reaches the engine from a run config or `TINKRL_SAMPLER_PRECISION`, an
unknown name being one clear error.

Fast: the tiny random-weight model.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
import torch
from helpers.engine import TEXTS, TINY, assert_bf16_tracks, datum, logprobs_of, randomize_lora
from tinker import types

from tinkrl.backends import make_service_client
from tinkrl.config import BackendConfig
from tinkrl.errors import TinkrlError
from tinkrl.local import ServiceClient
from tinkrl.local.compute_plan import CPU_SAMPLER_RULES, Choice, SamplerClass, probe, sampler_class_of, usable_flags
from tinkrl.local.kernels import paths
from tinkrl.local.models import TINY_ARCHS, default_sampler_precision
from tinkrl.local.transformer import Linear

pytestmark = pytest.mark.cpu_class  # `make test-avx2` runs it again as an AVX2-only CPU


@pytest.fixture(scope="module")
def bf16_service():
    return ServiceClient(device="cpu", dtype="float32", sampler_precision="bfloat16")


@pytest.fixture(scope="module")
def prompts(bf16_service):
    tok = bf16_service.create_sampling_client(base_model=TINY).get_tokenizer()
    return [types.ModelInput.from_ints(tok.encode(t)[:12]) for t in TEXTS]


def rescored(sc, prompt: types.ModelInput, tokens: list[int]) -> np.ndarray:
    """The logprobs the sampling client's own tree gives `tokens` after `prompt`, by prefill."""
    full = types.ModelInput.from_ints(prompt.to_ints() + tokens)
    lp = sc.compute_logprobs(full).result()
    return np.asarray(lp[prompt.length :], dtype=np.float64)


def assert_samples_own_policy(sc, prompts: list[types.ModelInput]) -> None:
    params = types.SamplingParams(max_tokens=10, temperature=1.0, seed=5, stop=[])
    futures = [sc.sample(p, 2, params) for p in prompts]
    for p, f in zip(prompts, futures):
        for s in f.result().sequences:
            own = rescored(sc, p, list(s.tokens))
            # decode and prefill multiply with different kernel blockings: bf16 outputs may round apart
            np.testing.assert_allclose(s.logprobs, own, atol=2e-2)


def test_the_bf16_copies_are_the_samplers_alone(bf16_service, prompts):
    matched = ServiceClient(device="cpu", dtype="float32", sampler_precision="matched")
    data = [datum(p.to_ints() + [42, 43], weights=np.ones(p.length + 1)) for p in prompts]
    trainers = [s.create_lora_training_client(TINY, rank=4, seed=0) for s in (bf16_service, matched)]
    for tc in trainers:
        randomize_lora(tc, scale=0.05, seed=1)
        tc.save_weights_and_get_sampling_client().sample(prompts[0], 1, types.SamplingParams(max_tokens=2)).result()
    bf16_engine = trainers[0].engine
    assert bf16_engine is not trainers[1].engine and bf16_engine.sampler == "bfloat16"
    a, b = (np.concatenate(logprobs_of(tc.forward(data).result())) for tc in trainers)
    np.testing.assert_array_equal(a, b)
    assert all(m.weight.dtype == torch.float32 for m in bf16_engine.base.modules() if isinstance(m, Linear))
    merged = bf16_engine._merged_tree
    assert merged is not None
    assert all(m.weight.dtype == torch.bfloat16 for m in merged.modules() if isinstance(m, Linear))


@pytest.mark.parametrize("model", sorted(TINY_ARCHS))  # Qwen2's q/k/v biases, Qwen3's q/k norms fused too
def test_bf16_sampler_samples_its_own_policy_base_and_lora(bf16_service, prompts, model):
    assert_samples_own_policy(bf16_service.create_sampling_client(base_model=model), prompts)
    tc = bf16_service.create_lora_training_client(model, rank=4, seed=0)
    randomize_lora(tc, scale=0.05, seed=2)
    assert_samples_own_policy(tc.save_weights_and_get_sampling_client(), prompts)
    assert_bf16_tracks(tc, tc.save_weights_and_get_sampling_client(), prompts)


def test_bf16_sampler_tracks_the_trainer_and_is_pinned_to_its_version(bf16_service, prompts):
    tc = bf16_service.create_lora_training_client(TINY, rank=4, seed=0)
    randomize_lora(tc, scale=0.05, seed=3)
    first = tc.save_weights_and_get_sampling_client()
    assert_bf16_tracks(tc, first, prompts)  # bf16 rounding: not the trainer's arithmetic, but its policy

    probe = [datum(p.to_ints() + [42, 43, 44], weights=np.ones(p.length + 2)) for p in prompts]
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=9, stop=[])
    before = first.sample(prompts[0], 2, params).result()
    tc.forward_backward(probe).result()
    tc.optim_step(types.AdamParams(learning_rate=5e-3)).result()
    second = tc.save_weights_and_get_sampling_client()
    assert_bf16_tracks(tc, second, prompts)  # merged again for the new weights
    again = first.sample(prompts[0], 2, params).result()  # the first client still samples its own version
    for a, b in zip(before.sequences, again.sequences):
        assert list(a.tokens) == list(b.tokens)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)


def _sample_base_and_merged(service: ServiceClient, prompt) -> None:
    """Two samples of 3 tokens from the base model's sampler, then from a fresh LoRA's merged tree, each
    prefilling the whole prompt (no keys/values of an earlier call's are reused)."""
    params = types.SamplingParams(max_tokens=3, temperature=1.0, stop=[])
    engine = service._engine(TINY)
    engine.submit(engine.prefix_cache.clear).result()
    service.create_sampling_client(base_model=TINY).sample(prompt, 2, params).result()
    tc = service.create_lora_training_client(TINY, rank=4, seed=0)
    tc.save_weights_and_get_sampling_client().sample(prompt, 2, params).result()


def test_only_the_bf16_sampler_keeps_its_kv_cache_in_bf16(bf16_service, prompts, monkeypatch):
    """bf16 sampling, off-policy by its rounding already, halves its KV cache's bytes where the decode
    kernels read it; a matched sampler's cache stays fp32, the trainer's arithmetic."""
    from tinkrl.local.transformer import KVCache

    allocated, real = [], KVCache.allocate.__func__
    monkeypatch.setattr(KVCache, "allocate", classmethod(lambda cls, *a: allocated.append(a[-1]) or real(cls, *a)))
    for service in (bf16_service, ServiceClient(device="cpu", dtype="float32", sampler_precision="matched")):
        _sample_base_and_merged(service, prompts[0])
    bf16 = torch.bfloat16 if bf16_service._engine(TINY).plan.cache.path == "bfloat16" else torch.float32
    assert allocated == [bf16, bf16, torch.float32, torch.float32]


def test_only_the_bf16_sampler_multiplies_its_head_in_bf16(bf16_service, prompts, monkeypatch):
    """Its logits come from bf16 products summed in fp32 where the CPU has bf16 dot products, its
    merged trees' too; a matched sampler's head stays the trainer's fp32 product."""
    calls, real = [], paths.head_bf16

    def head_calls(x, *args):
        calls.append(x.shape[0])
        return real(x, *args)

    monkeypatch.setattr(paths, "head_bf16", head_calls)
    _sample_base_and_merged(ServiceClient(device="cpu", dtype="float32", sampler_precision="matched"), prompts[0])
    assert calls == []
    _sample_base_and_merged(bf16_service, prompts[0])
    path = bf16_service._engine(TINY).paths  # the path this machine's plan chose
    applies = isinstance(path, paths.CpuKernels) and path.head is not None
    assert calls == ([1, 2, 2, 1, 2, 2] if applies else [])  # the prompt's last position, then 2 rows


def test_only_the_bf16_samplers_prefill_runs_in_the_kernels(prompts, monkeypatch, fake_cpu):
    """The bf16 sampler's prefill (base and merged trees) runs in the kernels where its plan says so (on
    Intel's CPUs with AVX512-BF16, faked here through the probe): its norms and SiLU in the decode
    kernels, their bf16 outputs straight into the products. Its prompt logprobs stay within bf16
    rounding of `forward`'s on the same tree. A matched sampler's prefill stays `forward`, the
    trainer's own arithmetic."""
    if "linear_bf16" not in probe().kernels:
        pytest.skip(f"no bf16 products in the kernels here ({probe().kernels_why or 'no AVX512-BF16'})")
    here = probe()
    fake_cpu(" ".join(sorted(here.flags)), "GenuineIntel", kernels=here.kernels)  # this CPU, as an Intel Xeon
    bf16_service = ServiceClient(device="cpu", dtype="float32", sampler_precision="bfloat16")
    calls, real = [], paths.CpuKernels.prefill_layer
    monkeypatch.setattr(
        paths.CpuKernels, "prefill_layer", lambda self, layer, x, *a: calls.append(x.shape) or real(self, layer, x, *a)
    )
    _sample_base_and_merged(ServiceClient(device="cpu", dtype="float32", sampler_precision="matched"), prompts[0])
    assert calls == []
    _sample_base_and_merged(bf16_service, prompts[0])
    layers = bf16_service._engine(TINY).base.config.num_hidden_layers
    assert len(calls) == 2 * layers and all(shape[1] == prompts[0].length for shape in calls)

    sc = bf16_service.create_sampling_client(base_model=TINY)

    def prompt_logprobs() -> list[np.ndarray]:  # all prompts in one batch: a shared opening, then the rest
        futures = [sc.compute_logprobs(p) for p in prompts]
        return [np.asarray(f.result()[1:], dtype=np.float64) for f in futures]

    calls.clear()
    kernels = prompt_logprobs()
    assert calls
    engine = bf16_service._engine(TINY)
    op_by_op_plan = dataclasses.replace(engine.plan, prefill=Choice("reference", "the test's"))
    monkeypatch.setattr(engine, "paths", paths.for_plan(op_by_op_plan))
    calls.clear()
    op_by_op = prompt_logprobs()
    assert calls == []
    for a, b in zip(kernels, op_by_op, strict=True):
        np.testing.assert_allclose(a, b, atol=2e-2)


def test_a_long_prefill_attends_in_query_blocks_as_in_one_call(monkeypatch):
    """A prefill of more than `QUERY_BLOCK` queries attends in blocks, each over the keys up to its last
    query: after a cached shared opening and with left padding, what one call computes, to fp32
    rounding. A mask that is not one row per query runs in one call."""
    from types import SimpleNamespace

    from tinkrl.local import transformer
    from tinkrl.local.transformer import Attention, additive_mask, causal_mask

    monkeypatch.setattr(transformer, "QUERY_BLOCK", 8)
    cfg = SimpleNamespace(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, model_type="llama")
    attention = Attention(cfg, 0, has_qkv_bias=False)
    B, shared, T, D = 3, 5, 37, 16
    attn = torch.ones(B, shared + T, dtype=torch.long)
    attn[1, shared : shared + 3] = 0  # left padding after the shared opening, as sample_batch lays rows out
    attn[2, shared : shared + 11] = 0
    mask = additive_mask(causal_mask(attn, T, shared))
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, 4, T, D, generator=g)
    k, v = torch.randn(B, 2, shared + T, D, generator=g), torch.randn(B, 2, shared + T, D, generator=g)
    calls, real = [], torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional,
        "scaled_dot_product_attention",
        lambda q, *a, **kw: calls.append(q.shape[2]) or real(q, *a, **kw),
    )
    with torch.no_grad():
        whole = attention._sdpa(q, k, v, mask, blocks=False)
        blocked = attention._sdpa(q, k, v, mask, blocks=True)
        broadcast = attention._sdpa(q, k, v, mask[:, :, -1:], blocks=True)
    assert calls == [T, 8, 8, 8, 8, 5, T]
    assert (blocked - whole).abs().max().item() < 1e-5
    assert torch.equal(broadcast, real(q, k, v, attn_mask=mask[:, :, -1:], enable_gqa=True))


def test_the_bf16_projections_of_a_decode_steps_rows_multiply_in_the_kernels_with_fp32_sums(bf16_service, monkeypatch):
    """A bf16 weight's product of a decode step's rows without autograd (the bf16 sampler's) runs in the
    kernels, AMX tiles where lent, else AVX512-BF16 dot products: bf16 products, fp32 sums with the
    bias, rounded to bf16 as oneDNN's product rounds them; with autograd, or for a prefill's many rows,
    it stays torch's product."""
    path = bf16_service._engine(TINY).paths
    if not getattr(path, "products", None):
        pytest.skip("no bf16 dot products (AVX512-BF16) on this CPU, or no kernels: bf16 products stay oneDNN's")
    limit = path.plan.product_rows
    g = torch.Generator().manual_seed(0)
    w, bias = (torch.randn(96, 200, generator=g) * 0.1).bfloat16(), torch.randn(96, generator=g).bfloat16()
    linear = Linear(200, 96).requires_grad_(False)
    linear.weight, linear.bias = torch.nn.Parameter(w, False), torch.nn.Parameter(bias, False)
    x = (torch.randn(5, 1, 200, generator=g) * 2).bfloat16()
    expect = (x.double() @ w.double().t() + bias.double()).float()
    calls, real = [], paths.linear_bf16
    monkeypatch.setattr(paths, "linear_bf16", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    with torch.no_grad():
        got = path.project(linear, x)
    assert calls == [(5, 1, 200)] and got.dtype == torch.bfloat16 and got.shape == (5, 1, 96)
    assert torch.equal(got, expect.bfloat16())  # fp32 sums, one rounding
    path.project(linear, x)  # autograd on: torch's own product
    linear.bias = None
    with torch.no_grad():  # a prefill's many rows: oneDNN's product, faster there
        path.project(linear, torch.zeros(limit, 200).bfloat16())
        path.project(linear, torch.zeros(limit + 1, 200).bfloat16())
    assert calls == [(5, 1, 200), (limit, 200)]


def test_the_bf16_samplers_layers_decode_in_one_call_to_the_same_bits(bf16_service, prompts, monkeypatch):
    """On CPUs with AVX512-BF16, each layer of a bf16 sampler's decode step runs in one kernel call:
    the same kernels in the same order as the layer's op-by-op decode, so rows that finish at
    different steps (left in place in the cache) get the same tokens and the same logprobs to the bit;
    a merged LoRA tree's layers too. Batches of up to the plan's `one_call_rows` rows (here lowered to
    64 so the test samples few rows) run so (more run op by op), and sample their own policy (the
    tree's own prefill gives their tokens the same logprobs, to bf16 rounding)."""
    engine = bf16_service._engine(TINY)
    if engine.plan.decode.path != "one call":
        pytest.skip(f"no bf16 products in the kernels here ({engine.plan.projections.why}): layers decode op by op")
    layer_rows = min(engine.plan.one_call_rows, 64)
    # op by op, the products run in the kernels as far as the one call does: the same products
    plan = dataclasses.replace(engine.plan, product_rows=layer_rows, one_call_rows=layer_rows)
    monkeypatch.setattr(engine, "paths", paths.for_plan(plan))
    calls, real = [], paths.decode_layer_bf16
    monkeypatch.setattr(paths, "decode_layer_bf16", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    tc = bf16_service.create_lora_training_client(TINY, rank=4, seed=0)
    randomize_lora(tc)
    clients = [bf16_service.create_sampling_client(base_model=TINY), tc.save_weights_and_get_sampling_client()]

    def sample(sc):
        futures = [
            sc.sample(p, 2, types.SamplingParams(max_tokens=4 * (i + 1), temperature=1.0, seed=i, stop=[]))
            for i, p in enumerate(prompts)
        ]  # and rows enough to pass 32, in the same batch
        futures.append(sc.sample(prompts[0], 40, types.SamplingParams(max_tokens=3, temperature=1.0, seed=9, stop=[])))
        return [(s.tokens, s.logprobs) for f in futures for s in f.result().sequences]

    one_call = [sample(sc) for sc in clients]
    assert calls and min(calls) <= 32  # one call a layer
    assert max(calls) > 32
    calls.clear()
    monkeypatch.setattr(engine, "paths", paths.for_plan(dataclasses.replace(plan, one_call_rows=0)))
    per_op = [sample(sc) for sc in clients]
    assert calls == []
    assert one_call == per_op
    assert len({len(tokens) for tokens, _ in one_call[0]}) > 1  # rows finished at different steps
    monkeypatch.setattr(engine, "paths", paths.for_plan(plan))  # a batch of layer_rows rows runs so, one more op by op
    params = types.SamplingParams(max_tokens=3, temperature=1.0, seed=1, stop=[])
    for rows in (layer_rows, layer_rows + 1):
        for s in clients[1].sample(prompts[0], rows, params).result().sequences:
            np.testing.assert_allclose(s.logprobs, rescored(clients[1], prompts[0], list(s.tokens)), atol=2e-2)
    assert layer_rows in calls and layer_rows + 1 not in calls


def test_every_cpu_class_has_a_measured_sampler_default(monkeypatch):
    assert set(CPU_SAMPLER_RULES) == set(get_args(SamplerClass))
    # bf16 sampling learned as well as matched where AMX multiplies it and on Intel's AVX512-BF16;
    # on AMD's EPYC it ran fewer steps to a lower accuracy (make train, docs/performance.md)
    expected = {"amx_bf16": "bfloat16", "avx512_bf16_intel": "bfloat16", "avx512_bf16": "matched", "other": "matched"}
    assert {cls: rule.precision for cls, rule in CPU_SAMPLER_RULES.items()} == expected
    for cls, rule in CPU_SAMPLER_RULES.items():
        assert rule.measured.strip(), cls
    monkeypatch.delenv("TINKRL_SAMPLER_PRECISION", raising=False)
    machine = probe()
    expected_here = CPU_SAMPLER_RULES[machine.sampler_class].precision
    if machine.sampler_class == "avx512_bf16_intel" and "linear_bf16" not in machine.kernels:
        expected_here = "matched"  # below: that class's bf16 needs the kernels
    assert default_sampler_precision(torch.device("cpu")) == expected_here
    assert ServiceClient().sampler_precision is None  # the engine takes its class's default


@pytest.mark.parametrize(
    "cls, vendor, expected",
    [
        ("amx_bf16", "intel", "amx_bf16"),
        ("avx512_bf16", "intel", "avx512_bf16_intel"),
        ("avx512_bf16", "amd", "avx512_bf16"),
        ("avx512_bf16", "other", "avx512_bf16"),
        ("other", "intel", "other"),
        ("other", "amd", "other"),
    ],
)
def test_the_sampler_class_sets_intels_avx512_bf16_apart(cls, vendor, expected):
    assert sampler_class_of(cls, vendor) == expected


def test_intels_avx512_bf16_samples_matched_without_the_kernels(monkeypatch, fake_cpu):
    """There the bf16 default rests on the kernels' dot products; oneDNN's bf16 products are slower
    than fp32 ones on such CPUs. The class is faked through the plan's probe: its flags decide, not
    this machine's."""
    monkeypatch.delenv("TINKRL_SAMPLER_PRECISION", raising=False)
    xeon = "fpu avx2 fma avx512f avx512bw avx512vl avx512dq avx512_bf16"
    fake_cpu(xeon, "GenuineIntel")  # with the kernels such a CPU builds: its dot products
    assert default_sampler_precision(torch.device("cpu")) == "bfloat16"
    fake_cpu(xeon, "GenuineIntel", kernels=False)
    assert default_sampler_precision(torch.device("cpu")) == "matched"
    monkeypatch.setenv("TINKRL_SAMPLER_PRECISION", "bfloat16")  # asked for, it is what runs
    assert default_sampler_precision(torch.device("cpu")) == "bfloat16"


def test_an_avx2_cpu_asked_for_bf16_runs_a_path_that_runs(monkeypatch, fake_cpu):
    """On a CPU without AVX-512 (a laptop's AVX2), bf16 asked for is no crash mid-run: the plan keeps the
    trainer's products in fp32 (the bf16 math mode needs AMX) and the bf16 sampler's products in torch's
    own bf16 product (oneDNN's needs AVX-512), says why, and a sampled step and a training step run."""
    monkeypatch.delenv("TINKRL_SAMPLER_PRECISION", raising=False)
    machine = fake_cpu("fpu sse4_2 avx avx2 fma f16c", "AuthenticAMD")
    assert machine.cpu_class == "other" and not machine.onednn_bf16 and "linear_bf16" not in machine.kernels
    assert default_sampler_precision(torch.device("cpu")) == "matched"
    service = ServiceClient(device="cpu", dtype="bfloat16", sampler_precision="bfloat16")
    tc = service.create_lora_training_client(TINY, rank=4, seed=0)
    plan = tc.engine.plan
    assert (plan.precision.path, plan.products.path, plan.sampler.path) == ("bfloat16", "fp32", "bfloat16")
    assert plan.projections.path == "torch bf16" and "oneDNN has no bf16 here" in plan.projections.why
    assert plan.logits.path == "fp32"
    tok = tc.get_tokenizer()
    prompt = types.ModelInput.from_ints(tok.encode(TEXTS[0])[:12])
    seqs = tc.save_weights_and_get_sampling_client().sample(prompt, 2, types.SamplingParams(max_tokens=4)).result()
    tokens = prompt.to_ints() + list(seqs.sequences[0].tokens)
    tc.forward_backward([datum(tokens, weights=np.ones(len(tokens) - 1))], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()


def test_this_machines_vendor_and_sampler_class_come_from_cpuinfo():
    """The class of the flags the libraries may use here: /proc/cpuinfo's, capped by `ONEDNN_MAX_CPU_ISA`."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    vendor_id = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("vendor_id")), "")
    assert probe().vendor == {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(vendor_id, "other")
    listed = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    flags, _ = usable_flags(frozenset(listed), os.environ.get("ONEDNN_MAX_CPU_ISA", ""))
    if "amx_bf16" in flags:
        expected = "amx_bf16"
    elif "avx512_bf16" in flags:
        expected = "avx512_bf16_intel" if vendor_id == "GenuineIntel" else "avx512_bf16"
    else:
        expected = "other"
    assert probe().sampler_class == expected


def test_the_setting_reaches_the_engine_and_bad_names_are_refused(monkeypatch):
    monkeypatch.delenv("TINKRL_SAMPLER_PRECISION", raising=False)
    config = BackendConfig(model_name=TINY, backend="local", device="cpu", sampler_precision="bfloat16")
    sc = make_service_client(config).create_sampling_client(base_model=TINY)
    assert sc.engine.sampler == "bfloat16"
    monkeypatch.setenv("TINKRL_SAMPLER_PRECISION", "bf16")
    assert default_sampler_precision(torch.device("cpu")) == "bfloat16"
    monkeypatch.setenv("TINKRL_SAMPLER_PRECISION", "fp8")
    with pytest.raises(TinkrlError, match="sampler precision 'fp8' is not supported"):
        default_sampler_precision(torch.device("cpu"))
    with pytest.raises(ValueError, match="sampler_precision"):
        BackendConfig(sampler_precision="half")
