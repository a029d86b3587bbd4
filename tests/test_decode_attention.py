"""The C decode-attention kernel (tinkrl/local/decode_attention.c).

What must hold: it computes what torch's `scaled_dot_product_attention` computes for one query token
per row (grouped query heads, views of a longer cache, padding in the middle of a row, a mask shared
by all rows), to fp32 rounding; the sampler decodes the same tokens with the same logprobs through it
as through torch's kernel; it declines (None) whatever it does not handle, so the caller falls back;
and a machine that cannot compile it gets one clear reason, not an error.

Fast: random tensors and the tiny random-weight model.
"""

from __future__ import annotations

import contextlib
import ctypes

import pytest
import torch
import torch.nn.functional as F
from helpers.engine import TEXTS, TINY
from tinker import types

from tinkrl.local import ServiceClient
from tinkrl.local import decode_attention as da
from tinkrl.local.transformer import KVCache, _rotate_half


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
    q, k, v, mask = _case(B, H, Hkv, D, T, cache_len, mask_rows)
    k, v = k.to(cache_dtype), v.to(cache_dtype)  # a bf16 cache is read widened, exactly
    expect = F.scaled_dot_product_attention(q, k.float(), v.float(), attn_mask=mask, enable_gqa=Hkv != H)
    with torch.no_grad():
        got = da.decode_attention(q, k, v, mask)
    assert got is not None, da.load_kernel()[1]
    assert got.shape == expect.shape
    assert (got - expect).abs().max().item() < 1e-5


def test_kernel_declines_what_it_does_not_handle():
    q, k, v, mask = _case(2, 4, 2, 16, 10, 10, 2)
    with torch.no_grad():
        assert da.decode_attention(q, k, v, mask) is not None
        assert da.decode_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask.bfloat16()) is None
        assert da.decode_attention(q, k.bfloat16(), v, mask) is None  # keys and values in different dtypes
        assert da.decode_attention(q, k.half(), v.half(), mask) is None
        assert da.decode_attention(q[..., :8], k[..., :8], v[..., :8], mask) is None  # head_dim not a multiple of 16
        assert da.decode_attention(q.expand(2, 4, 3, 16), k, v, mask) is None  # more than one query token
        assert da.decode_attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), v, mask) is None  # layout
    assert da.decode_attention(q, k, v, mask) is None  # autograd on: training never runs it


def test_sampler_decodes_the_same_through_either_kernel(monkeypatch):
    """Greedy decoding of the tiny model, rows finishing at different steps (so the batch drops rows):
    whole decode layers in the kernels (`DecoderLayer.decode`), torch's ops with the attention kernel
    reading the cache's rows in place, torch's kernel on those rows gathered, and torch's
    kernel on a compacted cache all give the same tokens, logprobs within fp32 rounding."""
    service = ServiceClient(device="cpu", dtype="float32")
    client = service.create_sampling_client(base_model=TINY)
    tok = client.get_tokenizer()
    calls, kept = [], []
    real_attention, real_keep = da.decode_attention, KVCache.keep

    def counting(*args):
        out = real_attention(*args)
        calls.append((out is not None, args[-1] is not None))
        return out

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

    def counting_fused(*args):
        calls.append((True, args[3].rows is not None))
        return real_fused(*args)

    real_fused = da.rope_decode_attention
    monkeypatch.setattr(KVCache, "keep", keep)
    monkeypatch.setattr("tinkrl.local.transformer.rope_decode_attention", counting_fused)
    fused = sample()
    assert calls and any(in_place for _, in_place in calls), "no fused decode step read rows left in place"
    assert kept and all(kept)
    calls.clear()
    monkeypatch.setattr("tinkrl.local.transformer.decode_kernels_apply", lambda x, k: False)
    monkeypatch.setattr("tinkrl.local.transformer.decode_attention", counting)
    native = sample()
    assert calls and all(ran for ran, _ in calls), "the sampler's decode steps did not run the kernel"
    assert any(in_place for _, in_place in calls), "no step read rows left in place"
    monkeypatch.setattr("tinkrl.local.transformer.decode_attention", lambda *a: None)
    gathered = sample()
    monkeypatch.setattr("tinkrl.local.transformer.reads_cache", lambda k: False)
    kept.clear()
    compacted = sample()
    assert kept and not any(kept)
    assert [len(s.tokens) for s in native] == [8, 8, 16, 16, 24, 24]
    for f, a, b, c in zip(fused, native, gathered, compacted, strict=True):
        assert f.tokens == a.tokens == b.tokens == c.tokens
        assert max(abs(x - y) for x, y in zip(f.logprobs, a.logprobs)) < 1e-4
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
        assert b.logprobs == c.logprobs  # torch's kernel on the same rows, gathered or copied


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
        got = da.rms_norm(x, w, 1e-5, dtype, add=added)
    assert (x - expect_x).abs().max().item() < 1e-6  # the stream took the addition in place
    _close_in(dtype, got, expect)
    fused = (torch.randn(*shape, 2 * 80, generator=g) * 4).to(dtype)  # gate and up side by side, as fused
    gate, up = fused.chunk(2, -1)
    _close_in(dtype, da.silu_mul(gate, up, dtype), F.silu(gate.float()) * up.float())


def test_norm_and_silu_kernels_refuse_rows_they_cannot_walk():
    """Rows not evenly spaced in memory, or an addition of another shape, are a clear error, not a
    wrong result."""
    x, w = torch.randn(3, 4, 32), torch.ones(32)
    uneven = torch.randn(4, 3, 64).transpose(0, 1)[..., :32]  # [3, 4, 32], rows 64 and 192 apart
    with torch.no_grad():
        with pytest.raises(ValueError, match="evenly spaced"):
            da.silu_mul(uneven, uneven, torch.float32)
        with pytest.raises(ValueError, match="evenly spaced"):
            da.rms_norm(x, w, 1e-5, torch.float32, add=uneven)
        with pytest.raises(ValueError, match="adds a"):
            da.rms_norm(x, w, 1e-5, torch.float32, add=torch.zeros(3, 1, 32))


def _skip_without_bf16_dot_products() -> None:
    with torch.no_grad():
        if not da.head_bf16_applies(torch.zeros(1, 16)):
            pytest.skip("no bf16 dot products (AVX512-BF16) on this CPU, or no kernels: the head stays fp32")


# The ways the bf16 products multiply: dot products in the bf16 instruction or in fp32 FMAs, AMX tiles.
WAYS = ["dpbf16", "fma", "amx"]


def _multiplying(way: str) -> contextlib.AbstractContextManager:
    """Dot products the `way` way within the block (AMX tiles are asked for with `amx=True`)."""
    if way == "amx" and not da.head_amx_available():
        pytest.skip("no AMX tiles on this CPU (or Linux did not lend them): bf16 products in dot products")
    return contextlib.nullcontext() if way == "amx" else da.dots_kernel_as(way)


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
    _skip_without_bf16_dot_products()
    amx = way == "amx"
    g = torch.Generator().manual_seed(M)
    w = torch.randn(N, K, generator=g) * 0.1
    x = (torch.randn(M, K + 7, generator=g) * 2).to(x_dtype)[:, :K]  # rows K + 7 apart
    with torch.no_grad(), _multiplying(way):
        got = da.head_bf16(x, da.pack_head(w), N, amx=amx)
    expect = x.bfloat16().double() @ w.bfloat16().double().t()
    assert got.shape == (M, N) and got.dtype == torch.float32
    assert (got.double() - expect).abs().max().item() < 1e-4
    assert (got.double() - x.double() @ w.double().t()).abs().max().item() > 1e-3  # bf16 products, not fp32
    with torch.no_grad(), _multiplying(way):  # leading dimensions kept, as for [rows, positions, hidden]
        batched = da.head_bf16(x.reshape(1, M, K), da.pack_head(w), N, amx=amx)
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
        with da.dots_kernel_as("fma"):
            fma = da.head_bf16(x, da.pack_head(w), N, amx=False)
        with da.dots_kernel_as("dpbf16"):
            dpbf16 = da.head_bf16(x, da.pack_head(w), N, amx=False)
    assert torch.equal(fma, want)
    assert (dpbf16 - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def test_the_machines_way_of_dot_products_is_measured_once_and_kept(monkeypatch, tmp_path):
    """`dots_kernel` measures both ways once per machine and keeps the faster one next to the compiled
    kernels; `$TINKRL_BF16_DOTS` picks one instead and a wrong value is refused by name; without the
    kernels it says so."""
    _skip_without_bf16_dot_products()
    record = tmp_path / "kernels.dots"
    monkeypatch.setattr(da.load_kernel()[0], "_name", str(tmp_path / "kernels.so"))
    monkeypatch.delenv(da.DOTS_ENV, raising=False)
    measured, measure = [], da.measure_dots_kernel
    monkeypatch.setattr(da, "measure_dots_kernel", lambda: measured.append(1) or {"dpbf16": 2.0, "fma": 1.0})
    da._machine_dots_kernel.cache_clear()
    try:
        assert da.dots_kernel() == "fma" and record.read_text() == "fma" and measured == [1]
        assert [p.name for p in tmp_path.iterdir()] == ["kernels.dots"]  # no temporary file left
        da._machine_dots_kernel.cache_clear()
        record.write_text("dpbf16")  # kept: not measured again
        assert da.dots_kernel() == "dpbf16" and measured == [1]
        da._machine_dots_kernel.cache_clear()
        monkeypatch.setenv(da.DOTS_ENV, "fma")
        assert da.dots_kernel() == "fma" and measured == [1]
        da._machine_dots_kernel.cache_clear()
        monkeypatch.setenv(da.DOTS_ENV, "avx")
        with pytest.raises(ValueError, match="TINKRL_BF16_DOTS='avx'"):
            da.dots_kernel()
        da._machine_dots_kernel.cache_clear()
        monkeypatch.delenv(da.DOTS_ENV)
        with monkeypatch.context() as m:  # no kernels: said, not an AttributeError
            m.setattr(da, "load_kernel", lambda: (None, "no C compiler (cc) on PATH"))
            with pytest.raises(RuntimeError, match="no bf16 dot products here .no C compiler"):
                da.dots_kernel()
    finally:
        da._machine_dots_kernel.cache_clear()
    times = measure(rows=4, k=64, n=96, rounds=2)  # the real measurement: both ways run
    assert set(times) == {"dpbf16", "fma"} and all(0 < t < 1 for t in times.values())


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("M, K, N", [(1, 64, 96), (5, 577, 70), (16, 576, 960), (17, 96, 33), (32, 200, 3072)])
def test_bf16_projection_rounds_its_fp32_sums_once(M, K, N, bias, way):
    """The bf16 sampler's decode-step projections, in dot products (the bf16 instruction's or fp32
    FMAs') and in AMX tiles: bf16 rows times a bf16 weight, the products and the bias summed in fp32
    and rounded to bf16 once (as torch rounds: to nearest even), written as bf16 for any row count, an
    odd width, a width that is not a multiple of 32, strided rows; a row that holds a NaN gives NaNs."""
    _skip_without_bf16_dot_products()
    amx = way == "amx"
    context = _multiplying(way)
    g = torch.Generator().manual_seed(M)
    w = (torch.randn(N, K, generator=g) * 0.1).bfloat16()
    b = torch.randn(N, generator=g).bfloat16() if bias else None
    x = (torch.randn(M, K + 7, generator=g) * 2).bfloat16()[:, :K]  # rows K + 7 apart
    clean = M - 1 if M > 1 else M  # rows before the last; the last holds a NaN where there are more
    if clean < M:
        x[-1, 0] = float("nan")
    with torch.no_grad(), context:
        got = da.linear_bf16(x, da.pack_head(w), N, b, amx=amx)
        sums = da.head_bf16(x, da.pack_head(w), N, amx=amx)  # the same kernel's fp32 sums
    if b is not None:
        sums += b.float()
    assert got.shape == (M, N) and got.dtype == torch.bfloat16
    assert got[clean:].isnan().all() and not got[:clean].isnan().any()
    assert torch.equal(got[:clean], sums[:clean].bfloat16())  # fp32 sums, one rounding
    exact = x[:clean].double() @ w.double().t() + (0 if b is None else b.double())
    assert (got[:clean].double() - exact).abs().max().item() <= 2**-8 * exact.abs().max().item()
    with torch.no_grad(), _multiplying(way):  # leading dimensions kept, as for [rows, positions, hidden]
        batched = da.linear_bf16(x.reshape(M, 1, K), da.pack_head(w), N, b, amx=amx)
    assert batched.shape == (M, 1, N) and torch.equal(batched[:, 0].view(torch.int16), got.view(torch.int16))
    if not amx:  # chunks of k follow oneDNN's order in AMX tiles only
        with pytest.raises(RuntimeError, match="chunks of k"), _multiplying(way):
            da.linear_bf16(x, da.pack_head(w), N, b, 32, amx=False)


def test_bf16_projection_in_chunks_sums_each_chunk_apart():
    """A chunked tile product: each chunk of k summed from zero in fp32, the chunks' sums added in order,
    the bias last, one rounding; a chunk that is not a multiple of 32 is refused."""
    if not da.head_amx_available():
        pytest.skip("no AMX tiles on this CPU (or Linux did not lend them): bf16 products stay oneDNN's")
    g = torch.Generator().manual_seed(0)
    M, K, N = 40, 576, 96
    w, x = (torch.randn(N, K, generator=g) * 0.1).bfloat16(), torch.randn(M, K, generator=g).bfloat16()
    b = torch.randn(N, generator=g).bfloat16()
    for chunk in (96, 192, 288, 320):  # 320: a shorter last chunk
        with torch.no_grad():
            sums = [
                da.head_bf16(x[:, i : i + chunk], da.pack_head(w[:, i : i + chunk]), N, amx=True)
                for i in range(0, K, chunk)
            ]
            got = da.linear_bf16(x, da.pack_head(w), N, b.float(), chunk)
        total = sums[0]
        for part in sums[1:]:
            total = total + part
        assert torch.equal(got, (total + b.float()).bfloat16()), chunk
    with pytest.raises(ValueError, match="multiple of 32"):
        da.linear_bf16(x, da.pack_head(w), N, None, 100)


@pytest.mark.parametrize("rows", [33, 35, 48, 64, 100, 128])
def test_chunked_tiles_compute_onednns_bf16_product_to_the_bit(rows):
    """Above 32 rows the bf16 sampler's op-by-op products are oneDNN's, which sums k in blocks that
    depend on the shape and the threads (at 8-16 threads it sums some shapes' whole width). For
    SmolLM2's four projection shapes (random weights, with and without a bias), `onednn_chunk` finds a
    chunk with which the tiles compute oneDNN's product to the bit on random rows, and its probe
    accepts no chunk that computes otherwise: every candidate the probe accepts computes oneDNN's
    bits on random rows too (a chunk of 32, one tile step, is the tiles' whole-width sum), and the
    probe refuses at least one candidate per shape."""
    from tinkrl.local.transformer import _order_probe, _order_probe_rows, _pointwise, frozen_linear, onednn_chunk

    if not da.head_amx_available():
        pytest.skip("no AMX tiles on this CPU (or Linux did not lend them): bf16 products stay oneDNN's")
    g = torch.Generator().manual_seed(rows)
    for n, k in ((960, 576), (576, 576), (3072, 576), (576, 1536)):
        for bias in (False, True):
            chunk = onednn_chunk(rows, n, k, bias)
            assert chunk is not None, (n, k, bias)
            w = (torch.randn(n, k, generator=g) * 0.05).bfloat16().requires_grad_(False)
            b = torch.randn(n, generator=g).bfloat16() if bias else None
            x = torch.randn(rows, 1, k, generator=g).bfloat16()
            fp32_b = None if b is None else b.float()
            cols, onednn_w, packed, pb = _order_probe(n, k, bias)
            probe = _order_probe_rows(rows, k, cols)
            with torch.no_grad():
                want = frozen_linear(x, w, b)  # oneDNN's, above AMX_PRODUCT_ROWS rows
                got = da.linear_bf16(x, da.pack_head(w), n, fp32_b, chunk)
                assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (n, k, bias)
                onednn = _pointwise(probe, onednn_w, pb)
                probe_b = None if pb is None else pb.float()
                refused = 0
                for other in (c for c in range(32, k + 1, 32) if k % c == 0):
                    if not torch.equal(da.linear_bf16(probe, packed, n, probe_b, other), onednn):
                        refused += 1
                        continue
                    tiles = da.linear_bf16(x, da.pack_head(w), n, fp32_b, other)
                    assert torch.equal(tiles.view(torch.int16), want.view(torch.int16)), (n, k, bias, other)
                assert refused > 0, (n, k, bias)


def test_bf16_head_refuses_a_weight_of_another_width():
    _skip_without_bf16_dot_products()
    with torch.no_grad(), pytest.raises(ValueError, match="pack_head weight of width 64"):
        da.head_bf16(torch.zeros(2, 64), da.pack_head(torch.zeros(32, 96)), 32)


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
        got = da.rope_decode_attention(q, k, v, da.decode_step(cos, sin, pos, mask, rows, 6), kc, vc, dtype)
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
        da.decode_step(cos, sin, 5, torch.zeros(2, 1, 1, 5), None, 4)
    with pytest.raises(IndexError, match="outside the cache"):
        da.decode_step(cos, sin, 5, torch.zeros(2, 1, 1, 6), torch.tensor([0, 4]), 4)
    with pytest.raises(IndexError, match="2 rows in a cache of 1"):
        da.decode_step(cos, sin, 5, torch.zeros(1, 1, 1, 6), None, 1)
    step = da.decode_step(cos, sin, 5, torch.zeros(1, 1, 1, 6), torch.tensor([3, 1]), 4)
    q, kv = torch.zeros(2, 1, 32), torch.zeros(2, 1, 16)
    cache = torch.zeros(3, 1, 8, 16)  # 3 rows, not the step's 4
    with torch.no_grad(), pytest.raises(ValueError, match="prepared for another batch or cache"):
        da.rope_decode_attention(q, kv, kv, step, cache, cache.clone(), torch.float32)


def test_no_compiler_gives_a_reason_and_torch_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("TINKRL_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")
    da.load_kernel.cache_clear()
    try:
        fn, why = da.load_kernel()
        assert fn is None and why.startswith("cannot compile decode_attention.c")
        q, k, v, mask = _case(2, 4, 2, 16, 10, 10, 2)
        with torch.no_grad(), pytest.warns(UserWarning, match="torch's attention kernel"):
            assert da.decode_attention(q, k, v, mask) is None
        assert not list(tmp_path.iterdir())  # no half-written library left behind
    finally:
        da.load_kernel.cache_clear()
        da._warn_unavailable.cache_clear()


def test_a_missing_compiler_is_a_reason_and_a_damaged_build_is_made_again(monkeypatch, tmp_path):
    monkeypatch.setenv("TINKRL_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "/nonexistent/cc -O2")  # CC may carry arguments, as `ccache gcc` does
    da.load_kernel.cache_clear()
    try:
        fn, why = da.load_kernel()
        assert fn is None and why.startswith("cannot build or load decode_attention.c")
        monkeypatch.delenv("CC")
        da.load_kernel.cache_clear()
        assert da.load_kernel()[0] is not None
        (built,) = tmp_path.glob("decode_attention-*.so")
        damaged = tmp_path / "other" / built.name  # another cache (a loaded path would not be read again)
        damaged.parent.mkdir()
        damaged.write_bytes(b"not a shared library")
        monkeypatch.setenv("TINKRL_KERNEL_CACHE", str(damaged.parent))
        da.load_kernel.cache_clear()
        fn, why = da.load_kernel()
        assert fn is not None, why
        assert damaged.read_bytes().startswith(b"\x7fELF")
    finally:
        da.load_kernel.cache_clear()


def test_opt_out_and_the_cache_key(monkeypatch, tmp_path):
    monkeypatch.setenv("TINKRL_DECODE_ATTENTION", "torch")
    da.load_kernel.cache_clear()
    try:
        assert da.load_kernel() == (None, "TINKRL_DECODE_ATTENTION=torch")
        monkeypatch.delenv("TINKRL_DECODE_ATTENTION")
        monkeypatch.setenv("TINKRL_KERNEL_CACHE", str(tmp_path))
        da.load_kernel.cache_clear()
        fn, why = da.load_kernel()
        assert fn is not None, why
        built = list(tmp_path.glob("decode_attention-*.so"))
        assert len(built) == 1
        ctypes.CDLL(str(built[0]))  # a loadable library, named for its source, compiler and CPU
    finally:
        da.load_kernel.cache_clear()
