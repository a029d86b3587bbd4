"""The C decode-attention kernel (tinkrl/local/decode_attention.c).

What must hold: it computes what torch's `scaled_dot_product_attention` computes for one query token
per row (grouped query heads, views of a longer cache, padding in the middle of a row, a mask shared
by all rows), to fp32 rounding; the sampler decodes the same tokens with the same logprobs through it
as through torch's kernel; it declines (None) whatever it does not handle, so the caller falls back;
and a machine that cannot compile it gets one clear reason, not an error.

Fast: random tensors and the tiny random-weight model.
"""

from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F
from helpers.engine import TEXTS, TINY
from tinker import types

from tinkrl.local import ServiceClient
from tinkrl.local import decode_attention as da
from tinkrl.local.transformer import KVCache


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
def test_kernel_computes_what_torch_computes(B, H, Hkv, D, T, cache_len, mask_rows):
    q, k, v, mask = _case(B, H, Hkv, D, T, cache_len, mask_rows)
    expect = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=Hkv != H)
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
        assert da.decode_attention(q[..., :8], k[..., :8], v[..., :8], mask) is None  # head_dim not a multiple of 16
        assert da.decode_attention(q.expand(2, 4, 3, 16), k, v, mask) is None  # more than one query token
        assert da.decode_attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), v, mask) is None  # layout
    assert da.decode_attention(q, k, v, mask) is None  # autograd on: training never runs it


def test_sampler_decodes_the_same_through_either_kernel(monkeypatch):
    """Greedy decoding of the tiny model, rows finishing at different steps (so the batch drops rows):
    the kernel reading the cache's rows in place, torch's kernel on those rows gathered, and torch's
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

    monkeypatch.setattr(KVCache, "keep", keep)
    monkeypatch.setattr("tinkrl.local.transformer.decode_attention", counting)
    native = sample()
    assert calls and all(ran for ran, _ in calls), "the sampler's decode steps did not run the kernel"
    assert any(in_place for _, in_place in calls), "no step read rows left in place"
    assert kept and all(kept)
    monkeypatch.setattr("tinkrl.local.transformer.decode_attention", lambda *a: None)
    gathered = sample()
    monkeypatch.setattr("tinkrl.local.transformer.reads_cache", lambda k: False)
    kept.clear()
    compacted = sample()
    assert kept and not any(kept)
    assert [len(s.tokens) for s in native] == [8, 8, 16, 16, 24, 24]
    for a, b, c in zip(native, gathered, compacted, strict=True):
        assert a.tokens == b.tokens == c.tokens
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
        assert b.logprobs == c.logprobs  # torch's kernel on the same rows, gathered or copied


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
