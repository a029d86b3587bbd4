"""The sampler's C kernels (tinkrl/local/kernels/) and the paths through a model that use them.

What must hold: a decode step's attention computes what torch's `scaled_dot_product_attention`
computes for one query token per row (grouped query heads, views of a longer cache, padding in the
middle of a row, a mask shared by all rows), to fp32 rounding; the sampler decodes the same tokens
with the same logprobs through the kernels' path as through the reference forward; the norms, SiLU
and the bf16 products compute what torch computes (the bf16 products to the bit of their stated
order of sums); what the kernels do not handle is a clear error or the plan's reference path; and a
machine that cannot compile them gets one clear reason, not an error.

Fast: random tensors and the tiny random-weight model.
"""

from __future__ import annotations

import ctypes
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from helpers.engine import TEXTS, TINY
from tinker import types

from tinkrl.local import ServiceClient
from tinkrl.local.compute_plan import Choice, Machine, make_plan, probe
from tinkrl.local.kernels import library, ops
from tinkrl.local.kernels.paths import CpuKernels, Reference, for_plan
from tinkrl.local.transformer import KVCache, _rotate_half

pytestmark = pytest.mark.cpu_class  # `make test-avx2` runs it again as an AVX2-only CPU


def _case(B: int, H: int, Hkv: int, D: int, T: int, cache_len: int, mask_rows: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    kc = torch.randn(B, Hkv, cache_len, D, generator=g)
    vc = torch.randn(B, Hkv, cache_len, D, generator=g)
    q = torch.randn(B, H, 1, D, generator=g) * 2
    mask = torch.zeros(mask_rows, 1, 1, T)
    for r in range(mask_rows):  # padding between a shared prefix and the rest, as the sampler lays rows out
        lo = int(torch.randint(1, max(2, T // 2), (1,), generator=g))
        mask[r, ..., lo : lo + r % 4 + 1] = float("-inf")
    return q, kc[:, :, :T], vc[:, :, :T], mask


@pytest.mark.parametrize(
    "B,H,Hkv,D,T,cache_len,mask_rows",
    [
        (4, 9, 3, 64, 37, 50, 4),  # SmolLM2's heads
        (3, 14, 2, 64, 200, 256, 3),  # Qwen2.5-0.5B's 7 query heads per KV head
        (2, 16, 8, 128, 65, 65, 2),  # Qwen3's head_dim 128
        (5, 4, 4, 16, 9, 12, 1),  # no grouping; one mask row for every row
        (1, 4, 2, 16, 1, 8, 1),  # a single cached position
    ],
)
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_kernel_computes_what_torch_computes(B, H, Hkv, D, T, cache_len, mask_rows, cache_dtype):
    """The attention of a decode step (here without rotation: cos 1, sin 0), the step's own key and value
    written at the last position first."""
    q, k, v, mask = _case(B, H, Hkv, D, T, cache_len, mask_rows)
    k, v = k.to(cache_dtype), v.to(cache_dtype)  # a bf16 cache is read widened, exactly
    expect = F.scaled_dot_product_attention(q, k.float(), v.float(), attn_mask=mask, enable_gqa=Hkv != H)
    kc, vc = (torch.zeros(B, Hkv, cache_len, D, dtype=cache_dtype) for _ in range(2))
    kc[:, :, : T - 1], vc[:, :, : T - 1] = k[:, :, : T - 1], v[:, :, : T - 1]
    new_k, new_v = (t[:, :, T - 1].float().reshape(B, 1, Hkv * D) for t in (k, v))
    step = ops.decode_step(torch.ones(B, 1, D), torch.zeros(B, 1, D), T - 1, mask, None, B)
    with torch.no_grad():
        got = ops.rope_decode_attention(q.reshape(B, 1, H * D), new_k, new_v, step, kc, vc, torch.float32)
    assert got.shape == (B, 1, H * D)
    assert (got - expect.transpose(1, 2).reshape(B, 1, H * D)).abs().max().item() < 1e-5


def test_what_the_kernels_do_not_handle_is_an_error_or_the_reference():
    """Keys and values in other dtypes or layouts are a clear error, not a wrong result; a head width the
    kernels' vectors do not divide is the plan's reference path."""
    B, H, Hkv, D = 2, 4, 2, 16
    step = ops.decode_step(torch.ones(B, 1, D), torch.zeros(B, 1, D), 3, torch.zeros(B, 1, 1, 4), None, B)
    q, kv, cache = torch.zeros(B, 1, H * D), torch.zeros(B, 1, Hkv * D), torch.zeros(B, Hkv, 8, D)
    with torch.no_grad():
        with pytest.raises(ValueError, match="share a dtype"):
            ops.rope_decode_attention(q, kv.bfloat16(), kv, step, cache, cache.clone(), torch.float32)
        with pytest.raises(ValueError, match="fp32/bf16"):
            ops.rope_decode_attention(q.half(), kv.half(), kv.half(), step, cache, cache.clone(), torch.float32)
        with pytest.raises(ValueError, match="positions must be contiguous"):
            layout = cache.transpose(2, 3).contiguous().transpose(2, 3)
            ops.rope_decode_attention(q, kv, kv, step, layout, layout.clone(), torch.float32)
    built = frozenset({"rope_decode_attention", "rms_norm", "silu_mul"})
    machine = Machine("amd", frozenset({"avx512f"}), built, "", False)
    fp32 = Choice("float32", "as asked")
    assert make_plan(machine, "cpu", fp32, Choice("matched", ""), head_dim=16).decode.path == "kernels"
    plan = make_plan(machine, "cpu", fp32, Choice("matched", ""), head_dim=8)
    assert plan.decode.path == "reference" and "head_dim 8" in plan.decode.why


def test_sampler_decodes_the_same_through_the_kernels_and_the_reference(monkeypatch):
    """Greedy decoding of the tiny model, rows finishing at different steps (so the batch drops rows):
    whole decode layers in the kernels reading the cache's rows in place, the reference forward on
    those rows gathered, and the reference on a compacted cache all give the same tokens, logprobs
    within fp32 rounding."""
    service = ServiceClient(device="cpu", dtype="float32")
    client = service.create_sampling_client(base_model=TINY)
    engine = service._engine(TINY)
    assert type(engine.paths) is type(for_plan(engine.plan)), engine.plan.decode.why  # what the plan chose runs
    if not {"rope_decode_attention", "rms_norm", "silu_mul"} <= probe().kernels:
        pytest.skip(f"the decode kernels are not built here ({probe().kernels_why})")
    # the kernels' decode, also where the plan leaves it out (without AVX-512 it ran slower, not wrong)
    kernels = CpuKernels(dataclasses.replace(engine.plan, decode=Choice("kernels", "the test's")))
    monkeypatch.setattr(engine, "paths", kernels)
    tok = client.get_tokenizer()
    calls, kept = [], []
    real_keep, real_attention = KVCache.keep, ops.rope_decode_attention

    def keep(cache, rows):
        out = real_keep(cache, rows)
        kept.append(out.rows is not None)
        return out

    def sample():
        futures = [
            client.sample(
                types.ModelInput.from_ints(tok.encode(t)),
                2,
                types.SamplingParams(max_tokens=8 * (i + 1), temperature=0.0, stop=[]),
            )
            for i, t in enumerate(TEXTS)
        ]
        return [s for f in futures for s in f.result().sequences]

    def counting(*args):
        calls.append(args[3].rows is not None)
        return real_attention(*args)

    monkeypatch.setattr(KVCache, "keep", keep)
    monkeypatch.setattr("tinkrl.local.kernels.paths.rope_decode_attention", counting)
    fused = sample()
    assert calls and any(calls), "no decode step in the kernels read rows left in place"
    assert kept and all(kept)
    gathering = Reference(engine.plan)
    gathering.rows_in_place = True  # the reference reads the batch's rows out of the whole cache
    monkeypatch.setattr(engine, "paths", gathering)
    gathered = sample()
    monkeypatch.setattr(engine, "paths", Reference(engine.plan))
    kept.clear()
    compacted = sample()
    assert kept == []  # rows copied out (`select`), never kept in place
    assert [len(s.tokens) for s in gathered] == [8, 8, 16, 16, 24, 24]
    for f, b, c in zip(fused, gathered, compacted, strict=True):
        assert f.tokens == b.tokens == c.tokens
        assert max(abs(x - y) for x, y in zip(f.logprobs, b.logprobs)) < 1e-4
        assert b.logprobs == c.logprobs  # the reference on the same rows, gathered or copied


def _close_in(dtype: torch.dtype, got: torch.Tensor, expect: torch.Tensor) -> None:
    """fp32: equal to rounding; bf16: equal to the reference rounded to bf16, but where the fp32 values
    sit at a rounding boundary (one bf16 step, in a few elements)."""
    assert got.dtype == dtype and got.shape == expect.shape
    if dtype == torch.float32:
        assert (got - expect).abs().max().item() < 1e-5 * max(1.0, expect.abs().max().item())
        return
    rounded = expect.to(torch.bfloat16).float()
    off = (got.float() - rounded).abs()
    assert (off > 0).float().mean().item() < 0.02
    assert (off <= rounded.abs() * 2**-7 + 1e-30).all()


@pytest.mark.parametrize("shape", [(5, 1), (3, 7)], ids=["decode-rows", "prefill-rows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_and_silu_kernels_compute_what_torch_computes(dtype, shape):
    """On a decode step's [B, 1, n] rows and a prefill's [B, T, n] alike: RMSNorm after adding a block's
    output into the stream in place, and SiLU(gate) * up of a fused gate/up product's halves."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(*shape, 96, generator=g) * 3, torch.rand(96, generator=g) + 0.5
    added = torch.randn(*shape, 96, generator=g).to(dtype)
    expect_x = x + added.float()
    expect = w * (expect_x * torch.rsqrt(expect_x.pow(2).mean(-1, keepdim=True) + 1e-5))
    with torch.no_grad():
        got = ops.rms_norm(x, w, 1e-5, dtype, add=added)
    assert (x - expect_x).abs().max().item() < 1e-6  # the stream took the addition in place
    _close_in(dtype, got, expect)
    fused = (torch.randn(*shape, 2 * 80, generator=g) * 4).to(dtype)  # gate and up side by side, as fused
    gate, up = fused.chunk(2, -1)
    _close_in(dtype, ops.silu_mul(gate, up, dtype), F.silu(gate.float()) * up.float())


def test_norm_and_silu_kernels_refuse_rows_they_cannot_walk():
    """Rows not evenly spaced in memory, or an addition of another shape, are a clear error, not a
    wrong result."""
    x, w = torch.randn(3, 4, 32), torch.ones(32)
    uneven = torch.randn(4, 3, 64).transpose(0, 1)[..., :32]  # [3, 4, 32], rows 64 and 192 apart
    with torch.no_grad():
        with pytest.raises(ValueError, match="evenly spaced"):
            ops.silu_mul(uneven, uneven, torch.float32)
        with pytest.raises(ValueError, match="evenly spaced"):
            ops.rms_norm(x, w, 1e-5, torch.float32, add=uneven)
        with pytest.raises(ValueError, match="adds a"):
            ops.rms_norm(x, w, 1e-5, torch.float32, add=torch.zeros(3, 1, 32))


def _skip_without_bf16_dot_products() -> None:
    if "head_bf16" not in probe().kernels:
        pytest.skip("no bf16 dot products (AVX512-BF16) on this CPU, or no kernels: the head stays fp32")


# The ways the bf16 products multiply: dot products in the bf16 instruction or in fp32 FMAs, AMX tiles.
WAYS = ["dpbf16", "fma", "amx"]


def _skip_without(way: str) -> None:
    _skip_without_bf16_dot_products()
    if way == "amx" and not probe().amx_lent:
        pytest.skip("no AMX tiles on this CPU (or Linux did not lend them): bf16 products in dot products")


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=["fp32-x", "bf16-x"])
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(
    "M, K, N", [(1, 64, 96), (5, 577, 1000), (13, 128, 4096), (16, 64, 96), (40, 96, 160), (64, 96, 160)]
)
def test_bf16_head_sums_bf16_products_in_fp32(M, K, N, way, x_dtype):
    """The bf16 sampler's unembedding (and, on AMX, its projections), in dot products (the bf16
    instruction's or fp32 FMAs') and in AMX tiles: x and w rounded to bf16, their products summed in
    fp32, fp32 logits; any row count (AMX: blocks of 32 and 16 rows), an odd width, a vocabulary that
    is not a multiple of 32, strided rows, x in fp32 or already in bf16."""
    _skip_without(way)
    g = torch.Generator().manual_seed(M)
    w = torch.randn(N, K, generator=g) * 0.1
    x = (torch.randn(M, K + 7, generator=g) * 2).to(x_dtype)[:, :K]  # rows K + 7 apart
    with torch.no_grad():
        got = ops.head_bf16(x, ops.pack(w), N, way)
    expect = x.bfloat16().double() @ w.bfloat16().double().t()
    assert got.shape == (M, N) and got.dtype == torch.float32
    assert (got.double() - expect).abs().max().item() < 1e-4
    assert (got.double() - x.double() @ w.double().t()).abs().max().item() > 1e-3  # bf16 products, not fp32
    with torch.no_grad():  # leading dimensions kept, as for [rows, positions, hidden]
        batched = ops.head_bf16(x.reshape(1, M, K), ops.pack(w), N, way)
    assert batched.shape == (1, M, N) and torch.equal(batched[0], got)


@pytest.mark.parametrize("M, K, N", [(1, 64, 96), (9, 577, 70), (16, 200, 3072)])
def test_fma_dot_products_add_each_product_in_order_with_one_rounding(M, K, N):
    """Dot products in fp32 FMAs: each sum adds the bf16 products of k = 1, 0, 3, 2, ... (each pair odd
    first, as the bf16 dot-product instruction adds them) one at a time, rounding once each (a product
    of two bf16 values is exact in fp32): the same bits as that sequence run in torch. The instruction's
    own sums agree with it to fp32 rounding (on Intel's CPUs, to the bit)."""
    _skip_without_bf16_dot_products()
    g = torch.Generator().manual_seed(K)
    w = (torch.randn(N, K, generator=g) * 0.1).bfloat16()
    x = (torch.randn(M, K, generator=g) * 2).bfloat16()
    order = [k ^ 1 for k in range(K + K % 2) if k ^ 1 < K]  # 1, 0, 3, 2, ...; a last odd k alone
    want = torch.zeros(M, N)
    for k in order:  # fp32 adds, one rounding each
        want = want + x[:, k, None].float() * w[None, :, k].float()
    with torch.no_grad():
        fma = ops.head_bf16(x, ops.pack(w), N, "fma")
        dpbf16 = ops.head_bf16(x, ops.pack(w), N, "dpbf16")
    assert torch.equal(fma, want)
    assert (dpbf16 - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def test_dot_products_multiply_the_vendors_way():
    """How dot products multiply is the plan's, from the CPU's vendor (no timing): fp32 FMAs on Intel's
    Xeons, the bf16 dot-product instruction elsewhere; with AMX lent, tiles (dot products below)."""
    built = frozenset({"rope_decode_attention", "rms_norm", "silu_mul", "head_bf16", "linear_bf16"})
    fp32, bf16 = Choice("float32", ""), Choice("bfloat16", "")
    flags = frozenset({"avx512f", "avx512_bf16", "avx512bw", "avx512vl", "avx512dq"})
    for vendor, way in (("intel", "fma"), ("amd", "dpbf16"), ("other", "dpbf16")):
        plan = make_plan(Machine(vendor, flags, built, "", False), "cpu", fp32, bf16, head_dim=64)
        assert (plan.projections.path, plan.logits.path, plan.dots) == (f"dots {way}", f"dots {way}", way)
    amx = make_plan(Machine("intel", flags | {"amx_bf16"}, built, "", True), "cpu", fp32, bf16, head_dim=64)
    assert (amx.projections.path, amx.logits.path, amx.dots) == ("amx", "amx", "fma")


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("M, K, N", [(1, 64, 96), (5, 577, 70), (16, 576, 960), (17, 96, 33), (32, 200, 3072)])
def test_bf16_projection_rounds_its_fp32_sums_once(M, K, N, bias, way):
    """The bf16 sampler's decode-step projections, in dot products (the bf16 instruction's or fp32
    FMAs') and in AMX tiles: bf16 rows times a bf16 weight, the products and the bias summed in fp32
    and rounded to bf16 once (as torch rounds: to nearest even), written as bf16 for any row count, an
    odd width, a width that is not a multiple of 32, strided rows; a row that holds a NaN gives NaNs."""
    _skip_without(way)
    g = torch.Generator().manual_seed(M)
    w = (torch.randn(N, K, generator=g) * 0.1).bfloat16()
    b = torch.randn(N, generator=g).bfloat16() if bias else None
    x = (torch.randn(M, K + 7, generator=g) * 2).bfloat16()[:, :K]  # rows K + 7 apart
    clean = M - 1 if M > 1 else M  # rows before the last; the last holds a NaN where there are more
    if clean < M:
        x[-1, 0] = float("nan")
    with torch.no_grad():
        got = ops.linear_bf16(x, ops.pack(w), N, b, way)
        sums = ops.head_bf16(x, ops.pack(w), N, way)  # the same kernel's fp32 sums
    if b is not None:
        sums += b.float()
    assert got.shape == (M, N) and got.dtype == torch.bfloat16
    assert got[clean:].isnan().all() and not got[:clean].isnan().any()
    assert torch.equal(got[:clean], sums[:clean].bfloat16())  # fp32 sums, one rounding
    exact = x[:clean].double() @ w.double().t() + (0 if b is None else b.double())
    assert (got[:clean].double() - exact).abs().max().item() <= 2**-8 * exact.abs().max().item()
    with torch.no_grad():  # leading dimensions kept, as for [rows, positions, hidden]
        batched = ops.linear_bf16(x.reshape(M, 1, K), ops.pack(w), N, b, way)
    assert batched.shape == (M, 1, N) and torch.equal(batched[:, 0].view(torch.int16), got.view(torch.int16))


def test_bf16_head_refuses_a_weight_of_another_width():
    _skip_without_bf16_dot_products()
    with torch.no_grad(), pytest.raises(ValueError, match="packed weight of width 64"):
        ops.head_bf16(torch.zeros(2, 64), ops.pack(torch.zeros(32, 96)), 32, "dpbf16")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_rope_attention_kernel_writes_the_cache_and_attends_as_torch(dtype, fused, cache_dtype):
    """RoPE on q and k, the new key and value at `pos` in the cache rows the batch rows live in (the
    others untouched; a bf16 cache holds them rounded to nearest), attention over the positions so
    far with padding masked: as torch computes it."""
    B, H, Hkv, D, pos, rows = 3, 6, 2, 32, 11, torch.tensor([4, 0, 2])
    g = torch.Generator().manual_seed(2)
    kc, vc = (torch.randn(6, Hkv, 20, D, generator=g).to(cache_dtype) for _ in range(2))
    qkv = torch.randn(B, 1, (H + 2 * Hkv) * D, generator=g).to(dtype)
    if fused:
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], -1)
    else:
        q, k, v = (t.contiguous() for t in qkv.split([H * D, Hkv * D, Hkv * D], -1))
    angle = torch.rand(B, 1, D // 2, generator=g) * 6
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    mask = torch.zeros(B, 1, 1, pos + 1)
    mask[1, ..., 3:5] = float("-inf")
    heads = [t.float().view(B, 1, n, D).transpose(1, 2) for t, n in ((q, H), (k, Hkv), (v, Hkv))]
    qr, kr = (x * cos[:, None] + _rotate_half(x) * sin[:, None] for x in heads[:2])
    before_k, before_v = kc.clone(), vc.clone()
    with torch.no_grad():
        got = ops.rope_decode_attention(q, k, v, ops.decode_step(cos, sin, pos, mask, rows, 6), kc, vc, dtype)
    new_k, new_v = kc[rows, :, pos].float(), vc[rows, :, pos].float()
    if cache_dtype == torch.float32:
        assert (new_k - kr[:, :, 0]).abs().max().item() < 1e-5
    else:  # rounded as torch rounds, but where RoPE's fp32 result sits at a rounding boundary
        rounded = kr[:, :, 0].to(torch.bfloat16).float()
        assert ((new_k - rounded).abs() <= rounded.abs() * 2**-7).all()
        assert ((new_k - rounded) != 0).float().mean().item() < 0.02
    assert torch.equal(new_v, heads[2][:, :, 0].to(cache_dtype).float())
    others = torch.ones(kc.shape[:3], dtype=torch.bool)
    others[rows, :, pos] = False
    assert torch.equal(kc[others], before_k[others])
    assert torch.equal(vc[others], before_v[others])
    expect = F.scaled_dot_product_attention(
        qr, kc[rows, :, : pos + 1].float(), vc[rows, :, : pos + 1].float(), attn_mask=mask, enable_gqa=True
    )
    _close_in(dtype, got, expect.transpose(1, 2).reshape(B, 1, H * D))


def test_a_decode_step_is_checked_once_and_fits_only_its_cache():
    """The kernels write through `rows` unchecked, so a step's rows, mask and shapes are checked when
    the step is prepared, and a layer refuses a step prepared for another cache."""
    cos = sin = torch.ones(2, 1, 16)
    with pytest.raises(ValueError, match="additive fp32 mask"):
        ops.decode_step(cos, sin, 5, torch.zeros(2, 1, 1, 5), None, 4)
    with pytest.raises(IndexError, match="outside the cache"):
        ops.decode_step(cos, sin, 5, torch.zeros(2, 1, 1, 6), torch.tensor([0, 4]), 4)
    with pytest.raises(IndexError, match="2 rows in a cache of 1"):
        ops.decode_step(cos, sin, 5, torch.zeros(1, 1, 1, 6), None, 1)
    step = ops.decode_step(cos, sin, 5, torch.zeros(1, 1, 1, 6), torch.tensor([3, 1]), 4)
    q, kv = torch.zeros(2, 1, 32), torch.zeros(2, 1, 16)
    cache = torch.zeros(3, 1, 8, 16)  # 3 rows, not the step's 4
    with torch.no_grad(), pytest.raises(ValueError, match="prepared for another batch or cache"):
        ops.rope_decode_attention(q, kv, kv, step, cache, cache.clone(), torch.float32)


def test_no_compiler_gives_a_reason_and_the_reference_runs(monkeypatch, tmp_path):
    """A failed build is one reason, nothing half-written is left, and the plan runs the reference with
    that reason (the engine warns once)."""
    from tinkrl.local.engine import Engine

    monkeypatch.setenv("TINKRL_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")
    library.load.cache_clear()
    try:
        fn, why = library.load()
        assert fn is None and why.startswith("cannot compile kernels.c")
        assert not list(tmp_path.iterdir())  # no half-written library left behind
    finally:
        library.load.cache_clear()
    bare = dataclasses.replace(probe(), kernels=frozenset(), kernels_why=why, amx_lent=False)
    monkeypatch.setattr("tinkrl.local.engine.probe", lambda: bare)
    fp32 = Choice("float32", "as asked")
    with pytest.warns(UserWarning, match="cannot compile kernels.c"):
        engine = Engine(TINY, torch.device("cpu"), fp32, Choice("matched", "as asked"))
    assert type(engine.paths) is Reference and engine.plan.decode.why == why


def test_a_missing_compiler_is_a_reason_and_a_damaged_build_is_made_again(monkeypatch, tmp_path):
    monkeypatch.setenv("TINKRL_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "/nonexistent/cc -O2")  # CC may carry arguments, as `ccache gcc` does
    library.load.cache_clear()
    try:
        fn, why = library.load()
        assert fn is None and why.startswith("cannot build or load kernels.c")
        monkeypatch.delenv("CC")
        library.load.cache_clear()
        assert library.load()[0] is not None
        (built,) = tmp_path.glob("kernels-*.so")
        damaged = tmp_path / "other" / built.name  # another cache (a loaded path would not be read again)
        damaged.parent.mkdir()
        damaged.write_bytes(b"not a shared library")
        monkeypatch.setenv("TINKRL_KERNEL_CACHE", str(damaged.parent))
        library.load.cache_clear()
        fn, why = library.load()
        assert fn is not None, why
        assert damaged.read_bytes().startswith(b"\x7fELF")
    finally:
        library.load.cache_clear()


def test_opt_out_and_the_cache_key(monkeypatch, tmp_path):
    monkeypatch.setenv("TINKRL_DECODE_ATTENTION", "torch")
    library.load.cache_clear()
    try:
        assert library.load() == (None, "TINKRL_DECODE_ATTENTION=torch")
        monkeypatch.delenv("TINKRL_DECODE_ATTENTION")
        monkeypatch.setenv("TINKRL_KERNEL_CACHE", str(tmp_path))
        library.load.cache_clear()
        fn, why = library.load()
        assert fn is not None, why
        built = list(tmp_path.glob("kernels-*.so"))
        assert len(built) == 1
        ctypes.CDLL(str(built[0]))  # a loadable library, named for its source, compiler and instruction set
    finally:
        library.load.cache_clear()
