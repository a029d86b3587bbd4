"""torch-facing calls of the C kernels (`kernels.c`): each checks what the C code trusts (shapes,
strides, dtypes, cache rows), then calls it on the tensors' memory with torch's thread count.

- `rope_decode_attention`: a decode step's attention from the q/k/v projections: RoPE, the cache
  write, then one new query per row over the KV cache (fp32 or bf16), one task per (row, KV head).
- `rms_norm` (adding a block's output to the residual stream first) and `silu_mul`, in fp32 or bf16.
- On CPUs with AVX512-BF16 (`plan.Machine.kernels` says which are built): `linear_bf16` and
  `head_bf16`, bf16 products summed in fp32 in AMX tiles or dot products, and `decode_layer_bf16`,
  a whole decoder layer in one call. `pack` lays a weight out as they read it.
Which of them runs is the plan's decision (paths.py), never made here.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from tinkrl.local.compute_plan import probe
from tinkrl.local.kernels import library

_CACHE_DTYPES = (torch.float32, torch.bfloat16)  # a KV cache the kernels read and write
KERNEL_CODES = {"dpbf16": 0, "amx": 1, "fma": 2}  # how a bf16 product multiplies (the C code's KERNEL_*)


def _lib() -> ctypes.CDLL:
    lib, why = library.load(probe().isa)
    if lib is None:
        raise RuntimeError(f"the sampler's kernels are not built here: {why}")
    return lib


def _is_bf16(t: torch.Tensor) -> int:
    return int(t.dtype == torch.bfloat16)


def _rows_apart(t: torch.Tensor) -> int:
    """The stride between the rows of a [..., n] tensor whose values are contiguous in each row and
    whose rows are evenly spaced (a [B, 1, n] decode step, a [B, T, n] prefill, or a slice of one)."""
    if t.stride(-1) != 1 or t.dtype not in _CACHE_DTYPES:
        raise ValueError(f"decode kernels: a [..., n] fp32/bf16 tensor with contiguous rows, got {t.dtype}")
    try:
        return t.view(-1, t.shape[-1]).stride(0)
    except RuntimeError:
        raise ValueError("decode kernels: the rows of a [..., n] tensor must be evenly spaced") from None


def _rows(t: torch.Tensor) -> int:
    """The rows of a [..., n] tensor: every position of every batch row."""
    return t.numel() // t.shape[-1]


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype, add: torch.Tensor | None = None
) -> torch.Tensor:
    """RMSNorm of the residual stream `x` ([..., d] fp32, contiguous) in `dtype` (fp32 or bf16); with
    `add` (as many rows), `x += add` first, in place (the block's output joining the stream)."""
    if not (x.is_contiguous() and x.dtype == weight.dtype == torch.float32 and weight.is_contiguous()):
        raise ValueError("decode kernels: rms_norm takes a contiguous fp32 stream and fp32 weight")
    if add is not None and add.shape != x.shape:
        raise ValueError(f"decode kernels: rms_norm adds a {tuple(x.shape)} tensor, got {tuple(add.shape)}")
    out = torch.empty(x.shape, dtype=dtype)
    _lib().rms_norm(
        x.data_ptr(), None if add is None else add.data_ptr(), 0 if add is None else _is_bf16(add),
        0 if add is None else _rows_apart(add), weight.data_ptr(), eps, out.data_ptr(), _is_bf16(out),
        _rows(x), x.shape[-1], torch.get_num_threads(),
    )  # fmt: skip
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """SwiGLU's `silu(gate) * up` ([..., f] each, fp32 or bf16, the same row stride) in `dtype`."""
    stride = _rows_apart(gate)
    if gate.dtype != up.dtype or _rows_apart(up) != stride or gate.shape != up.shape:
        raise ValueError("decode kernels: silu_mul's gate and up must share dtype, shape and row stride")
    out = torch.empty(gate.shape, dtype=dtype)
    _lib().silu_mul(
        gate.data_ptr(), up.data_ptr(), _is_bf16(gate), stride, out.data_ptr(), _is_bf16(out), _rows(gate),
        gate.shape[-1], torch.get_num_threads(),
    )  # fmt: skip
    return out


@dataclass(frozen=True)
class DecodeStep:
    """What every layer of one decode step shares, checked once for the step (`decode_step`): RoPE's
    `cos` and `sin` ([B, D], contiguous), the position `pos` the step writes, the additive `mask` ([B
    or 1, 1, 1, pos + 1] fp32) and the cache `rows` of the batch rows (None: batch row b is row b)."""

    cos: torch.Tensor
    sin: torch.Tensor
    pos: int
    mask: torch.Tensor
    rows: torch.Tensor | None
    cache_rows: int  # the cache's row count `rows` was checked against


def decode_step(
    cos: torch.Tensor, sin: torch.Tensor, pos: int, mask: torch.Tensor, rows: torch.Tensor | None, cache_rows: int
) -> DecodeStep:
    """A checked `DecodeStep` for B rows: `cos`, `sin` [B, 1, D]; `mask` additive [B or 1, 1, 1, pos + 1];
    `rows` (int64 [B]) the cache rows of the batch rows, or None."""
    B, D = cos.shape[0], cos.shape[-1]
    if (
        mask.shape[1:] != (1, 1, pos + 1)
        or mask.shape[0] not in (1, B)
        or mask.stride(3) != 1
        or mask.dtype != torch.float32
    ):
        raise ValueError(f"decode kernels: an additive fp32 mask [B, 1, 1, {pos + 1}], got {tuple(mask.shape)}")
    if rows is not None:
        if rows.dtype != torch.int64 or rows.shape != (B,) or not rows.is_contiguous():
            raise ValueError("decode kernels: `rows` must be a contiguous int64 [B]")
        lo, hi = (int(r) for r in torch.aminmax(rows))
        if lo < 0 or hi >= cache_rows:  # the kernels read and write through them unchecked
            raise IndexError(f"decode attention: cache rows {lo}..{hi} outside the cache's {cache_rows}")
    elif B > cache_rows:
        raise IndexError(f"decode attention: {B} rows in a cache of {cache_rows}")
    return DecodeStep(cos.reshape(B, D).contiguous(), sin.reshape(B, D).contiguous(), pos, mask, rows, cache_rows)


def _check_cache(step: DecodeStep, k_cache: torch.Tensor, v_cache: torch.Tensor, B: int, D: int) -> None:
    """Raises ValueError unless a layer's key and value caches suit the kernels and `step`: fp32 or bf16
    alike, positions contiguous, the batch and cache the step was prepared for, room at `step.pos`."""
    if k_cache.stride() != v_cache.stride() or k_cache.stride(2) != D or k_cache.stride(3) != 1:
        raise ValueError("decode kernels: the cache's positions must be contiguous, keys and values alike")
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in _CACHE_DTYPES:
        raise ValueError(f"decode kernels: an fp32 or bf16 cache, keys and values alike, got {k_cache.dtype}")
    if B != step.cos.shape[0] or k_cache.shape[0] != step.cache_rows or k_cache.shape[2] <= step.pos:
        raise ValueError("decode kernels: the step was prepared for another batch or cache")


def _step_args(step: DecodeStep, k_cache: torch.Tensor, v_cache: torch.Tensor, B: int) -> list:
    """The C arguments from `cos` to the mask's row stride, shared by the attention and the layer."""
    mask = step.mask
    return [
        step.cos.data_ptr(), step.sin.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), _is_bf16(k_cache),
        k_cache.stride(0), k_cache.stride(1), None if step.rows is None else step.rows.data_ptr(), step.pos,
        mask.data_ptr(), mask.stride(0) if mask.shape[0] == B else 0,
    ]  # fmt: skip


def rope_decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    step: DecodeStep,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """A decode step's attention straight from the projections: RoPE on `q` and `k` ([B, 1, H * D] and
    [B, 1, H_kv * D], fp32 or bf16), `k` and `v` written to the layer's cache ([cache rows, H_kv,
    positions, D], fp32 or bf16) at `step.pos` (in `step.rows`), then attention over positions 0..pos
    under `step.mask`, as torch's attention computes it to fp32 rounding. Returns [B, 1, H * D] in
    `dtype`, the output projection's input."""
    B, D = q.shape[0], step.cos.shape[-1]
    H, Hkv = q.shape[-1] // D, k.shape[-1] // D
    kv_stride = _rows_apart(k)
    if q.dtype != k.dtype or v.dtype != k.dtype or _rows_apart(v) != kv_stride:
        raise ValueError("decode kernels: q, k and v must share a dtype, and k and v a row stride")
    _check_cache(step, k_cache, v_cache, B, D)
    out = torch.empty((B, 1, H * D), dtype=dtype)
    rc = _lib().rope_decode_attention(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), _is_bf16(q), _rows_apart(q), kv_stride,
        *_step_args(step, k_cache, v_cache, B), out.data_ptr(), _is_bf16(out), B, H, Hkv, D, D**-0.5,
        torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise MemoryError("decode attention: a thread's scratch memory could not be allocated")
    return out


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A weight ([N, K]) rounded to bf16 in the bf16 products' layout: [N' / 16, K' / 2, 16, 2], N' and K'
    padded to multiples of 32 with zeros. Each [K' / 2, 16, 2] block is also what an AMX tile loads."""
    n, k = weight.shape
    n_pad, k_pad = -(-n // 32) * 32, -(-k // 32) * 32
    w = torch.zeros(n_pad, k_pad, dtype=torch.bfloat16)
    w[:n, :k] = weight.detach()
    return w.view(n_pad // 16, 16, k_pad // 2, 2).permute(0, 2, 1, 3).contiguous()


def _check_packed(packed: torch.Tensor, k: int, n: int | None, who: str) -> None:
    """Raises ValueError unless `packed` is a contiguous `pack` weight of width `k` (and, given `n`, of
    `n` outputs)."""
    width = (-(-k // 32) * 16, 16, 2)
    shape_ok = packed.shape[1:] == width if n is None else packed.shape == (-(-n // 32) * 2, *width)
    if packed.dtype != torch.bfloat16 or not shape_ok or not packed.is_contiguous():
        size = f"width {k}" if n is None else f"{n} x {k}"
        raise ValueError(f"{who}: a packed weight of {size}, got {tuple(packed.shape)}")


def _raise_on(rc: int, who: str) -> None:
    """A bf16 kernel's return code as its exception: 2, a kernel this CPU lacks; other non-zero, memory."""
    if rc == 2:
        raise RuntimeError(f"{who}: a way of multiplying this CPU or process does not have")
    if rc != 0:
        raise MemoryError(f"{who}: scratch memory could not be allocated")


def head_bf16(x: torch.Tensor, packed: torch.Tensor, vocab: int, kernel: str) -> torch.Tensor:
    """fp32 logits [..., vocab] of hidden states `x` [..., K] (fp32 or bf16) against a `pack` weight: the
    products in bf16 (x and the weight rounded to nearest even) summed in fp32, as a bf16 matrix product
    with fp32 output computes them, by `kernel` ("amx", "dpbf16" or "fma")."""
    n_pad, k = packed.shape[0] * 16, x.shape[-1]
    _check_packed(packed, k, None, "head_bf16")
    if x.dtype not in _CACHE_DTYPES:
        raise ValueError(f"head_bf16: hidden states in fp32 or bf16, got {x.dtype}")
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    m = rows.shape[0]
    out = torch.empty((-(-m // 16) * 16 if kernel == "amx" else m, n_pad), dtype=torch.float32)
    rc = _lib().head_bf16(
        rows.data_ptr(), rows.stride(0), _is_bf16(rows), packed.data_ptr(), out.data_ptr(), m, k, packed.shape[1],
        n_pad, KERNEL_CODES[kernel], torch.get_num_threads(),
    )  # fmt: skip
    _raise_on(rc, "head_bf16")
    return out[:m, :vocab].view(*x.shape[:-1], vocab)


def linear_bf16(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None, kernel: str) -> torch.Tensor:
    """A bf16 projection `x @ w.T + bias` ([..., n] bf16) of bf16 rows `x` [..., K] against `pack(w)`: bf16
    products summed in fp32 with the bias, rounded to bf16 once, as oneDNN's bf16 product rounds its sums,
    by `kernel` ("amx", "dpbf16" or "fma"). Written as bf16 directly (no fp32 copy), so a decode step's
    small products cost little besides reading the weights."""
    k = x.shape[-1]
    _check_packed(packed, k, None, "linear_bf16")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"linear_bf16: bf16 rows, got {x.dtype}")
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    fp32_bias = None if bias is None else bias.float().contiguous()
    out = torch.empty(*x.shape[:-1], n, dtype=torch.bfloat16)
    rc = _lib().linear_bf16(
        rows.data_ptr(), rows.stride(0), packed.data_ptr(), None if fp32_bias is None else fp32_bias.data_ptr(),
        out.data_ptr(), rows.shape[0], k, packed.shape[1], packed.shape[0] * 16, n, KERNEL_CODES[kernel],
        torch.get_num_threads(),
    )  # fmt: skip
    _raise_on(rc, "linear_bf16")
    return out


@dataclass(frozen=True)
class LayerWeights:
    """What `decode_layer_bf16` multiplies and normalises with in one decoder layer: the two norms' fp32
    weights and eps, and the four projections (q/k/v fused, o, gate/up fused, down) as `pack` weights
    with their output widths and fp32 biases (or None)."""

    norms: tuple[tuple[torch.Tensor, float], tuple[torch.Tensor, float]]
    projections: tuple[tuple[torch.Tensor, int, torch.Tensor | None], ...]


def decode_layer_bf16(
    x: torch.Tensor,
    pending: torch.Tensor | None,
    weights: LayerWeights,
    step: DecodeStep,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    heads: tuple[int, int],
    kernel: str,
) -> torch.Tensor:
    """One decoder layer of the bf16 sampler's decode step in one kernel call: the norms, the four
    projections (`linear_bf16` by `kernel`), RoPE, the cache write, attention and SiLU, the same kernels in
    the same order as the layer calls them one by one, so the same result to the bit. `x` ([B, 1, d] fp32,
    contiguous) is the residual stream, updated in place; `pending` (bf16 [B, 1, d] or None) the previous
    layer's MLP output; `heads` (H, H_kv). Returns this layer's MLP output (bf16 [B, 1, d])."""
    B, d = x.shape[0], x.shape[-1]
    H, Hkv = heads
    D = step.cos.shape[-1]
    (n1, eps1), (n2, eps2) = weights.norms
    (qkv, n_qkv, b_qkv), (o, n_o, b_o), (gu, n_gu, b_gu), (down, n_down, b_down) = weights.projections
    f = n_gu // 2
    if not (x.is_contiguous() and x.dtype == torch.float32 and n_qkv == (H + 2 * Hkv) * D and n_o == n_down == d):
        raise ValueError("decode_layer_bf16: a contiguous fp32 stream and projections of the layer's widths")
    if pending is not None and (pending.dtype != torch.bfloat16 or not pending.is_contiguous()):
        raise ValueError("decode_layer_bf16: the pending MLP output in contiguous bf16")
    for packed, k, n in zip((qkv, o, gu, down), (d, H * D, d, f), (n_qkv, d, n_gu, d)):
        _check_packed(packed, k, n, "decode_layer_bf16")
    _check_cache(step, k_cache, v_cache, B, D)
    out = torch.empty((B, 1, d), dtype=torch.bfloat16)
    ptr = [None if t is None else t.data_ptr() for t in (qkv, b_qkv, o, b_o, gu, b_gu, down, b_down)]
    rc = _lib().decode_layer_bf16(
        x.data_ptr(), None if pending is None else pending.data_ptr(), n1.data_ptr(), eps1, n2.data_ptr(), eps2,
        *ptr, *_step_args(step, k_cache, v_cache, B), D**-0.5, out.data_ptr(), B, d, H, Hkv, D, f,
        KERNEL_CODES[kernel], torch.get_num_threads(),
    )  # fmt: skip
    _raise_on(rc, "decode_layer_bf16")
    return out
