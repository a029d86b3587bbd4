"""Decode attention on CPU: one new query per row over the KV cache, in a small C kernel.

A decode step's attention is one query token per row against every cached position. torch's CPU
attention kernel (`scaled_dot_product_attention`) is built for long queries: at one query token it
runs each query head alone (re-reading the keys and values its KV head shares with the other query
heads of its group) and spends most of its time outside the arithmetic. `decode_attention.c` runs
one task per (row, KV head): the scores of all of that head's query heads over the cache (each key
read once), a softmax, and the weighted values (each value read once), leaving masked positions
out (padding, and cache slots not yet written). Same fp32 result as torch's kernel, to rounding.
It reads an fp32 or a bf16 cache (the bf16 sampler's: half the bytes, widened exactly).

The same library holds the rest of a decode step's work between its matrix products, so that
`transformer.DecoderLayer.decode` runs a layer as 4 products and 4 kernel calls instead of ~40 small
torch ops (each of which costs more to dispatch, and at 64 rows to fork its threads, than to run):
`rms_norm` (adding the block's output into the residual stream first), `rope_decode_attention` (RoPE
on the projections' q and k, the cache write, attention) and `silu_mul`. They read the projections'
outputs and write the next ones' inputs in fp32 or bf16, so bf16 products need no casts between.

The kernel is compiled by `make install` (`prepare_kernels`) or on first use with the machine's C
compiler (`-march=native`, OpenMP: the same OpenMP runtime torch's CPU kernels run on, so both share
one thread pool) into `$TINKRL_KERNEL_CACHE` (default `~/.cache/tinkrl/kernels`), keyed by the
source, the compiler and the CPU. Without a compiler (or OpenMP), torch's kernel is used and one
warning says why.
`TINKRL_DECODE_ATTENTION=torch` uses torch's kernel anyway.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("decode_attention.c")
BASE_FLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-shared", "-fPIC"]
ARCH_FLAGS = (["-march=native"], ["-mcpu=native"], [])  # the first one the compiler accepts
_LANES = 16  # the kernel's vector width in floats: head_dim must be a multiple of it
_CACHE_DTYPES = (torch.float32, torch.bfloat16)  # a KV cache the kernels read and write
_lock = threading.Lock()


def kernel_cache_dir() -> Path:
    """Where compiled kernels live: `$TINKRL_KERNEL_CACHE`, else `$XDG_CACHE_HOME/tinkrl/kernels`."""
    if os.environ.get("TINKRL_KERNEL_CACHE"):
        return Path(os.environ["TINKRL_KERNEL_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "tinkrl" / "kernels"


def _cpu_identity() -> str:
    """What `-march=native` depends on: the CPU's model and feature flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [ln for ln in info.splitlines() if ln.split(":")[0].strip() in ("model name", "flags", "Features")]
    return "\n".join(sorted(set(keep)))


def _compile(cc: list[str], target: Path) -> str:
    """Build the shared library at `target`; returns "" or the compiler's last error line."""
    err = ""
    target.parent.mkdir(parents=True, exist_ok=True)
    for arch in ARCH_FLAGS:
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as tmp:
            tmp_path = Path(tmp.name)
        r = subprocess.run([*cc, *BASE_FLAGS, *arch, "-o", str(tmp_path), str(SOURCE)], capture_output=True, text=True)
        if r.returncode == 0:
            os.replace(tmp_path, target)
            return ""
        tmp_path.unlink(missing_ok=True)
        err = (r.stderr.strip().splitlines() or [f"{' '.join(cc)} exited {r.returncode}"])[-1]
    return err


@functools.cache
def load_kernel() -> tuple[ctypes.CDLL | None, str]:
    """The compiled kernels' library, built on first use; (None, why) where it can't be."""
    if os.environ.get("TINKRL_DECODE_ATTENTION", "native") == "torch":
        return None, "TINKRL_DECODE_ATTENTION=torch"
    found = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    cc = shlex.split(os.environ.get("CC", "")) or ([found] if found else [])
    if not cc:
        return None, "no C compiler (cc) on PATH"
    try:
        version = subprocess.run([*cc, "--version"], capture_output=True, text=True).stdout
        key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(BASE_FLAGS), version, _cpu_identity()]).encode())
        target = kernel_cache_dir() / f"decode_attention-{key.hexdigest()[:16]}.so"
        with _lock:
            for attempt in (1, 2):
                if not target.exists():
                    err = _compile(cc, target)
                    if err:
                        return None, f"cannot compile {SOURCE.name}: {err}"
                try:
                    lib = ctypes.CDLL(str(target))
                    break
                except OSError:
                    if attempt == 2:
                        raise
                    target.unlink(missing_ok=True)  # a damaged build: made again once
    except OSError as e:  # no such compiler, an unwritable cache, a library that does not load
        return None, f"cannot build or load {SOURCE.name}: {e}"
    ptr, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    lib.decode_attention.restype = i32
    lib.decode_attention.argtypes = [ptr] * 6 + [i32] * 6 + [i64] * 3 + [f32, i32]
    lib.rope_decode_attention.restype = i32
    lib.rope_decode_attention.argtypes = [ptr] * 3 + [i32, i64, i64] + [ptr] * 4 + [i32, i64, i64]
    lib.rope_decode_attention.argtypes += [ptr, i32, ptr, i64, ptr] + [i32] * 5 + [f32, i32]
    lib.rms_norm.restype = None
    lib.rms_norm.argtypes = [ptr, ptr, i32, i64, ptr, f32, ptr, i32, i32, i32, i32]
    lib.silu_mul.restype = None
    lib.silu_mul.argtypes = [ptr, ptr, i32, i64, ptr, i32, i32, i32, i32]
    lib.head_bf16_available.restype = i32
    lib.head_bf16_available.argtypes = []
    lib.head_bf16.restype = i32
    lib.head_amx_available.restype = i32
    lib.head_amx_available.argtypes = []
    lib.head_bf16.argtypes = [ptr, i64, i32, ptr, ptr, i32, i64, i64, i64, i32, i32]
    lib.linear_bf16.restype = i32
    lib.linear_bf16.argtypes = [ptr, i64, ptr, ptr, ptr, i32, i64, i64, i64, i64, i64, i32, i32]
    lib.decode_layer_bf16.restype = i32
    lib.decode_layer_bf16.argtypes = [ptr, ptr, ptr, f32, ptr, f32] + [ptr] * 13 + [i32, i64, i64, ptr, i32, ptr, i64]
    lib.decode_layer_bf16.argtypes += [f32, ptr] + [i32] * 8
    return lib, ""


def prepare_kernels() -> str:
    """Build the kernels for this machine now (and, on CPUs with bf16 dot products, measure how they
    multiply fastest), so that the first sampler does not wait for the compiler: `make install` runs
    it. One line that says what was done, or why the kernels are not available."""
    lib, why = load_kernel()
    if lib is None:
        return f"decode kernels: not available ({why}); sampling uses torch's kernels"
    built = f"decode kernels: {lib._name}"
    return f"{built}; bf16 dot products in {dots_kernel()}" if dot_products_available() else built


@functools.cache
def _warn_unavailable(why: str) -> None:
    warnings.warn(f"decode attention: {why}; sampling uses torch's attention kernel (slower)", stacklevel=3)


def reads_cache(k: torch.Tensor) -> bool:
    """Whether the kernel can read this cache ([layers, rows, H_kv, positions, D]) in place: then a
    batch may keep its rows where they are (`rows` of `decode_attention`) instead of copying them."""
    return kernels_read(k.device, k.dtype, k.shape[-1])


def kernels_read(device: torch.device | str, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the kernels read and write a KV cache of this device, dtype (fp32 or bf16) and head_dim."""
    return torch.device(device).type == "cpu" and dtype in _CACHE_DTYPES and head_dim % _LANES == 0 and _available()


def _available() -> bool:
    fn, why = load_kernel()
    if fn is None and not why.startswith("TINKRL_DECODE_ATTENTION"):
        _warn_unavailable(why)
    return fn is not None


def _check_rows_within(rows: torch.Tensor, cache_rows: int) -> None:
    """The batch's cache rows must lie in the cache: the kernels read and write through them unchecked."""
    lo, hi = (int(x) for x in torch.aminmax(rows))
    if lo < 0 or hi >= cache_rows:
        raise IndexError(f"decode attention: cache rows {lo}..{hi} outside the cache's {cache_rows}")


def _mask_fits(mask: torch.Tensor, B: int, T: int) -> bool:
    """An additive mask the kernels read: [B or 1, 1, 1, T], positions contiguous."""
    return mask.shape[1:] == (1, 1, T) and mask.shape[0] in (1, B) and mask.stride(3) == 1


def _rows_fit(rows: torch.Tensor, B: int) -> bool:
    """Cache rows the kernels read: a contiguous int64 [B]."""
    return rows.dtype == torch.int64 and rows.shape == (B,) and rows.is_contiguous()


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor | None = None
) -> torch.Tensor | None:
    """Attention of one new query token per row, or None where the kernel does not apply (the caller
    then runs torch's kernel).

    `q`: [B, H, 1, D]; `k`, `v`: [B, H_kv, T, D] views of the cache (positions contiguous), or with
    `rows` (int64 [B]) the cache's rows of every batch row, `k` and `v` then being views of all the
    cache's rows; `mask`: additive [B or 1, 1, 1, T], -inf where a row must not look. Returns
    [B, H, 1, D] like `scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)`.
    Applies on CPU, in fp32 (the cache fp32 or bf16), without autograd, with head_dim a multiple of 16.
    """
    B, H, Q, D = q.shape
    T = k.shape[2]
    if (
        Q != 1
        or torch.is_grad_enabled()
        or not (q.dtype == mask.dtype == torch.float32 and k.dtype == v.dtype)
        or H % k.shape[1]
        or k.stride() != v.stride()
        or k.stride(3) != 1
        or k.stride(2) != D
        or not _mask_fits(mask, B, T)
        or (rows is None and k.shape[0] != B)
        or (rows is not None and not _rows_fit(rows, B))
        or not kernels_read(q.device, k.dtype, D)
    ):
        return None
    if rows is not None:
        _check_rows_within(rows, k.shape[0])
    fn = load_kernel()[0].decode_attention
    q = q.reshape(B, H, D).contiguous()
    out = torch.empty((B, H, D), dtype=torch.float32)
    mask_stride = mask.stride(0) if mask.shape[0] == B else 0
    rc = fn(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), None if rows is None else rows.data_ptr(), mask.data_ptr(),
        out.data_ptr(), _is_bf16(k),
        B, H, k.shape[1], D, T, k.stride(0), k.stride(1), mask_stride, D**-0.5, torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise MemoryError("decode attention: a thread's scratch memory could not be allocated")
    return out.view(B, H, 1, D)


# --- the rest of a decode step (transformer.DecoderLayer.decode) -------------------------------------


def decode_kernels_apply(x: torch.Tensor, cache_k: torch.Tensor) -> bool:
    """Whether a decode step ([B, 1, d] fp32 residual stream `x`, a KV cache like `reads_cache`'s) can
    run its elementwise work and attention in the kernels below."""
    return x.dtype == torch.float32 and not torch.is_grad_enabled() and reads_cache(cache_k)


def _is_bf16(t: torch.Tensor) -> int:
    return int(t.dtype == torch.bfloat16)


def _rows_apart(t: torch.Tensor) -> int:
    """The stride between the rows of a [..., n] tensor whose values are contiguous in each row and
    whose rows are evenly spaced (a [B, 1, n] decode step, a [B, T, n] prefill, or a slice of one)."""
    if t.stride(-1) != 1 or t.dtype not in (torch.float32, torch.bfloat16):
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
    """RMSNorm of the residual stream `x` ([..., d] fp32, contiguous: [B, 1, d] for a decode step, [B, T, d]
    for a prefill), in `dtype` (fp32 or bf16); with `add` (as many rows), `x += add` first, in place (the
    block's output joining the stream)."""
    if not (x.is_contiguous() and x.dtype == weight.dtype == torch.float32 and weight.is_contiguous()):
        raise ValueError("decode kernels: rms_norm takes a contiguous fp32 stream and fp32 weight")
    if add is not None and add.shape != x.shape:
        raise ValueError(f"decode kernels: rms_norm adds a {tuple(x.shape)} tensor, got {tuple(add.shape)}")
    out = torch.empty(x.shape, dtype=dtype)
    load_kernel()[0].rms_norm(
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
    load_kernel()[0].silu_mul(
        gate.data_ptr(), up.data_ptr(), _is_bf16(gate), stride, out.data_ptr(), _is_bf16(out), _rows(gate),
        gate.shape[-1], torch.get_num_threads(),
    )  # fmt: skip
    return out


@dataclass(frozen=True)
class DecodeStep:
    """What every layer of one decode step shares, checked once for the step (`decode_step`), not per
    layer: RoPE's `cos` and `sin` ([B, D], contiguous), the position `pos` the step writes, the
    additive `mask` ([B or 1, 1, 1, pos + 1] fp32) and the cache `rows` of the batch rows."""

    cos: torch.Tensor
    sin: torch.Tensor
    pos: int
    mask: torch.Tensor
    rows: torch.Tensor | None
    cache_rows: int  # the cache's row count `rows` was checked against


def decode_step(
    cos: torch.Tensor, sin: torch.Tensor, pos: int, mask: torch.Tensor, rows: torch.Tensor | None, cache_rows: int
) -> DecodeStep:
    """A `DecodeStep` for B rows: `cos`, `sin` [B, 1, D]; `mask` additive [B or 1, 1, 1, pos + 1];
    `rows` (int64 [B]) the cache rows of the batch rows, or None (batch row b in cache row b)."""
    B, D = cos.shape[0], cos.shape[-1]
    if not _mask_fits(mask, B, pos + 1) or mask.dtype != torch.float32:
        raise ValueError(f"decode kernels: an additive fp32 mask [B, 1, 1, {pos + 1}], got {tuple(mask.shape)}")
    if rows is not None:
        if not _rows_fit(rows, B):
            raise ValueError("decode kernels: `rows` must be a contiguous int64 [B]")
        _check_rows_within(rows, cache_rows)
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
    positions, D], fp32 or bf16) at `step.pos` (in `step.rows`, as `decode_attention`), then attention
    over positions 0..pos under `step.mask`. Returns [B, 1, H * D] in `dtype`, the output projection's
    input."""
    B, D = q.shape[0], step.cos.shape[-1]
    H, Hkv = q.shape[-1] // D, k.shape[-1] // D
    kv_stride = _rows_apart(k)
    if q.dtype != k.dtype or v.dtype != k.dtype or _rows_apart(v) != kv_stride:
        raise ValueError("decode kernels: q, k and v must share a dtype, and k and v a row stride")
    _check_cache(step, k_cache, v_cache, B, D)
    mask = step.mask
    out = torch.empty((B, 1, H * D), dtype=dtype)
    rc = load_kernel()[0].rope_decode_attention(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), _is_bf16(q), _rows_apart(q), kv_stride, step.cos.data_ptr(),
        step.sin.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), _is_bf16(k_cache), k_cache.stride(0),
        k_cache.stride(1), None if step.rows is None else step.rows.data_ptr(), step.pos, mask.data_ptr(),
        mask.stride(0) if mask.shape[0] == B else 0, out.data_ptr(), _is_bf16(out), B, H, Hkv, D, D**-0.5,
        torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise MemoryError("decode attention: a thread's scratch memory could not be allocated")
    return out


@dataclass(frozen=True)
class LayerWeights:
    """What `decode_layer_bf16` multiplies and normalises with in one decoder layer: the two norms'
    fp32 weights and eps, the four projections (q/k/v fused, o, gate/up fused, down) as `pack_head`
    weights with their output widths and fp32 biases (or None), and each projection's chunk
    (`linear_bf16`'s `chunk`; None: the whole width)."""

    norms: tuple[tuple[torch.Tensor, float], tuple[torch.Tensor, float]]
    projections: tuple[tuple[torch.Tensor, int, torch.Tensor | None], ...]
    chunks: tuple[int | None, ...] = (None, None, None, None)


def _check_packed(packed: torch.Tensor, k: int, n: int | None, who: str) -> None:
    """Raises ValueError unless `packed` is a contiguous `pack_head` weight of width `k` (and, given
    `n`, of `n` outputs)."""
    width = (-(-k // 32) * 16, 16, 2)
    shape_ok = packed.shape[1:] == width if n is None else packed.shape == (-(-n // 32) * 2, *width)
    if packed.dtype != torch.bfloat16 or not shape_ok or not packed.is_contiguous():
        size = f"width {k}" if n is None else f"{n} x {k}"
        raise ValueError(f"{who}: a pack_head weight of {size}, got {tuple(packed.shape)}")


def _raise_on(rc: int, who: str) -> None:
    """Turns a bf16 product kernel's return code into its exception: 2, a kernel this CPU lacks (AMX
    tiles where `head_amx_available()` is False, or chunks of k without them); any other non-zero,
    scratch memory not allocated."""
    if rc == 2:
        raise RuntimeError(f"{who}: AMX tiles (or chunks of k, which need them) where head_amx_available() is False")
    if rc != 0:
        raise MemoryError(f"{who}: scratch memory could not be allocated")


def decode_layer_bf16(
    x: torch.Tensor,
    pending: torch.Tensor | None,
    weights: LayerWeights,
    step: DecodeStep,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    heads: tuple[int, int],
    amx: bool | None = None,
) -> torch.Tensor:
    """One decoder layer of the bf16 sampler's decode step in one kernel call: the norms, the four
    projections (`linear_bf16`, in AMX tiles or with `amx` False in dot products), RoPE, the cache
    write and attention (`rope_decode_attention`) and SiLU, the same kernels in the same order as
    `DecoderLayer.decode` calls them one by one, so the same result to the bit, without a decode
    step's ~8 calls a layer from Python. `x` ([B, 1, d] fp32, contiguous) is the residual stream,
    updated in place; `pending` (bf16 [B, 1, d] or None) the previous layer's MLP output; `heads` (H,
    H_kv). Returns this layer's MLP output (bf16 [B, 1, d]). Only where `head_bf16_applies` (and for
    AMX tiles, the default where lent, `head_amx_available`), without autograd."""
    amx = head_amx_available() if amx is None else amx
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
    widths = (d, H * D, d, f)
    for packed, k, n in zip((qkv, o, gu, down), widths, (n_qkv, d, n_gu, d)):
        _check_packed(packed, k, n, "decode_layer_bf16")
    _check_cache(step, k_cache, v_cache, B, D)
    mask, out = step.mask, torch.empty((B, 1, d), dtype=torch.bfloat16)
    ptr = [None if t is None else t.data_ptr() for t in (qkv, b_qkv, o, b_o, gu, b_gu, down, b_down)]
    kc = (ctypes.c_int64 * 4)(*(_chunk_pairs(c, k, "decode_layer_bf16") for c, k in zip(weights.chunks, widths)))
    rc = load_kernel()[0].decode_layer_bf16(
        x.data_ptr(), None if pending is None else pending.data_ptr(), n1.data_ptr(), eps1, n2.data_ptr(), eps2,
        *ptr, kc, step.cos.data_ptr(), step.sin.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), _is_bf16(k_cache),
        k_cache.stride(0), k_cache.stride(1), None if step.rows is None else step.rows.data_ptr(), step.pos,
        mask.data_ptr(), mask.stride(0) if mask.shape[0] == B else 0, D**-0.5, out.data_ptr(), B, d, H, Hkv, D, f,
        _kernel_code(amx), torch.get_num_threads(),
    )  # fmt: skip
    _raise_on(rc, "decode_layer_bf16")
    return out


# --- the bf16 sampler's unembedding --------------------------------------------------------------------


def head_bf16_applies(x: torch.Tensor) -> bool:
    """Whether `head_bf16` can compute logits for these hidden states: fp32 on CPU, without autograd,
    with the kernels built for a CPU with bf16 dot products (AVX512-BF16)."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or torch.is_grad_enabled():
        return False
    return dot_products_available()


AMX_HEAD_ROWS = 8  # from this many rows on, the head's AMX tiles beat its dot products
# Up to this many rows, a bf16 projection's product runs faster in AMX tiles than through oneDNN
# (a decode step's rows; a prefill's hundreds of rows run faster through oneDNN).
AMX_PRODUCT_ROWS = 32
# Up to this many rows, a bf16 sampling tree's decode step runs each layer in one call
# (`decode_layer_bf16`), computing what the layer computes op by op to the bit: up to
# `AMX_PRODUCT_ROWS` rows the same tiles' products, above them oneDNN's, whose order of summing the
# tiles follow (`transformer.onednn_chunk`). Past this limit the one call gains nothing
# (docs/performance.md, "Decode step").
AMX_LAYER_ROWS = 128


# Up to this many rows, on a CPU with AVX512-BF16 and no AMX, a bf16 projection's product runs faster
# in dot products (`linear_bf16` without AMX) than through oneDNN, by the way they multiply here
# (`dots_kernel`; docs/performance.md, "The bf16 sampler's products").
DOT_PRODUCT_ROWS = {"dpbf16": 64, "fma": 1024}


def bf16_product_kernel(rows: int) -> str | None:
    """The kernel that multiplies a bf16 projection of `rows` rows without autograd (`frozen_linear`, a
    decode step's layers): "amx" (AMX tiles, up to `AMX_PRODUCT_ROWS` rows where `head_amx_available`),
    "dots" (dot products, up to `DOT_PRODUCT_ROWS[dots_kernel()]` rows on a CPU with AVX512-BF16 and
    no AMX), or None (oneDNN's product)."""
    if head_amx_available():
        return "amx" if rows <= AMX_PRODUCT_ROWS else None
    return "dots" if dot_products_available() and rows <= DOT_PRODUCT_ROWS[dots_kernel()] else None


DOTS_ENV = "TINKRL_BF16_DOTS"  # "dpbf16" or "fma": how dot products multiply, instead of measuring
_DOTS_CODES = {"dpbf16": 0, "fma": 2}  # the kernels' KERNEL_DOTS and KERNEL_FMA; KERNEL_AMX is 1


def _kernel_code(amx: bool) -> int:
    """The kernels' `kernel` argument: AMX tiles, or dot products in this machine's `dots_kernel()`."""
    return 1 if amx else _DOTS_CODES[dots_kernel()]


_dots_as: list[str] = []  # `dots_kernel_as`'s choice, innermost last


def dots_kernel() -> str:
    """How the bf16 products' dot products (`linear_bf16`, `head_bf16` without AMX) multiply here:
    "dpbf16", the CPU's bf16 dot-product instruction, or "fma", fp32 FMAs of the bf16 values widened in
    registers. Both give the same sums (a product of two bf16 values is exact in fp32, and the FMAs add
    in the instruction's order); which is faster depends on the CPU (docs/performance.md). So it is
    measured once per machine (`measure_dots_kernel`) and kept next to the compiled kernels;
    `$TINKRL_BF16_DOTS` picks one instead, and `dots_kernel_as` within a block. RuntimeError where
    the kernels have no bf16 dot products (`dot_products_available()`)."""
    return _dots_as[-1] if _dots_as else _machine_dots_kernel()


@contextlib.contextmanager
def dots_kernel_as(name: str) -> Iterator[None]:
    """Within the block, dot products multiply the `name` way ("dpbf16" or "fma"), in every thread:
    for benchmarks and tests that hold the two side by side."""
    if name not in _DOTS_CODES:
        raise ValueError(f"dots_kernel_as: expected one of {sorted(_DOTS_CODES)}, got {name!r}")
    _dots_as.append(name)
    try:
        yield
    finally:
        _dots_as.pop()


@functools.cache
def _machine_dots_kernel() -> str:
    """`dots_kernel` outside `dots_kernel_as`: `$TINKRL_BF16_DOTS`, else this machine's kept or new measurement."""
    forced = os.environ.get(DOTS_ENV)
    if forced:
        if forced not in _DOTS_CODES:
            raise ValueError(f"{DOTS_ENV}={forced!r}: expected one of {sorted(_DOTS_CODES)}")
        return forced
    if not dot_products_available():
        why = load_kernel()[1] or "the CPU has no AVX512-BF16"
        raise RuntimeError(f"dots_kernel: no bf16 dot products here ({why})")
    record = Path(load_kernel()[0]._name).with_suffix(".dots")
    try:
        kept = record.read_text().strip()
    except OSError:
        kept = ""
    if kept in _DOTS_CODES:
        return kept
    choice = min(measure_dots_kernel().items(), key=lambda kv: kv[1])[0]
    tmp = record.with_suffix(f".{os.getpid()}.tmp")
    try:  # written whole or not at all: another process may read it meanwhile
        tmp.write_text(choice)
        os.replace(tmp, record)
    except OSError:  # an unwritable cache: measured again by the next process
        tmp.unlink(missing_ok=True)
    return choice


def measure_dots_kernel(rows: int = 16, k: int = 576, n: int = 3072, rounds: int = 5) -> dict[str, float]:
    """The fastest of `rounds` runs of a bf16 projection of `rows` rows (k in, n out; a small model's
    decode step) in each way of summing dot products, in seconds: {"dpbf16": s, "fma": s}. Only where
    `dot_products_available()`."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, k, generator=g).bfloat16()
    packed = pack_head(torch.randn(n, k, generator=g))
    best = dict.fromkeys(_DOTS_CODES, float("inf"))
    for _ in range(rounds):
        for name in _DOTS_CODES:
            with dots_kernel_as(name):
                start = time.perf_counter()
                linear_bf16(x, packed, n, amx=False)
                best[name] = min(best[name], time.perf_counter() - start)
    return best


def dot_products_available() -> bool:
    """Whether the kernels were built for a CPU with bf16 dot products (AVX512-BF16): `head_bf16` and
    `linear_bf16` without AMX."""
    lib = load_kernel()[0]
    return lib is not None and bool(lib.head_bf16_available())


def head_amx_available() -> bool:
    """Whether `head_bf16` can use AMX tiles here (Intel Xeon from Sapphire Rapids on): the kernels were
    built for them and Linux lent this process their registers."""
    lib = load_kernel()[0]
    return lib is not None and bool(lib.head_amx_available())


def pack_head(weight: torch.Tensor) -> torch.Tensor:
    """The unembedding's weight ([N, K]) rounded to bf16 in the kernel's layout: [N' / 16, K' / 2, 16, 2],
    N' the vocabulary padded to a multiple of 32, K' the width padded to a multiple of 32, zeros in the
    padding. Each [K' / 2, 16, 2] block is also the layout an AMX tile of the weight loads."""
    n, k = weight.shape
    n_pad, k_pad = -(-n // 32) * 32, -(-k // 32) * 32
    w = torch.zeros(n_pad, k_pad, dtype=torch.bfloat16)
    w[:n, :k] = weight.detach()
    return w.view(n_pad // 16, 16, k_pad // 2, 2).permute(0, 2, 1, 3).contiguous()


def head_bf16(x: torch.Tensor, packed: torch.Tensor, vocab: int, amx: bool | None = None) -> torch.Tensor:
    """fp32 logits [..., vocab] of hidden states `x` [..., K] (fp32 or bf16) against a `pack_head` weight,
    the products in bf16 (x and the weight rounded to nearest even) summed in fp32, as a bf16 matrix
    product with fp32 output computes them. Only where `head_bf16_applies`. `amx` picks AMX tiles or
    AVX512-BF16 dot products; by default AMX tiles where `head_amx_available` for `AMX_HEAD_ROWS` rows
    or more (fewer rows read the weight as fast through dot products, docs/performance.md)."""
    n_pad, k = packed.shape[0] * 16, x.shape[-1]
    _check_packed(packed, k, None, "head_bf16")
    if x.dtype not in _CACHE_DTYPES:
        raise ValueError(f"head_bf16: hidden states in fp32 or bf16, got {x.dtype}")
    rows = x.reshape(-1, k)
    amx = rows.shape[0] >= AMX_HEAD_ROWS and head_amx_available() if amx is None else amx
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    m = rows.shape[0]
    out = torch.empty((-(-m // 16) * 16 if amx else m, n_pad), dtype=torch.float32)
    rc = load_kernel()[0].head_bf16(
        rows.data_ptr(), rows.stride(0), _is_bf16(rows), packed.data_ptr(), out.data_ptr(), m, k, packed.shape[1],
        n_pad, _kernel_code(amx), torch.get_num_threads(),
    )  # fmt: skip
    _raise_on(rc, "head_bf16")
    return out[:m, :vocab].view(*x.shape[:-1], vocab)


def linear_bf16(
    x: torch.Tensor,
    packed: torch.Tensor,
    n: int,
    bias: torch.Tensor | None = None,
    chunk: int | None = None,
    amx: bool | None = None,
) -> torch.Tensor:
    """A bf16 projection `x @ w.T + bias` ([..., n] bf16) of bf16 rows `x` [..., K] against `pack_head(w)`:
    bf16 products summed in fp32 with the bias, rounded to bf16 once, as oneDNN's bf16 product rounds
    its sums; in AMX tiles (`amx`, by default where `head_amx_available`) or in AVX512-BF16 dot
    products (`head_bf16_applies`' CPUs). Only without autograd; the kernel writes the bf16 result
    directly (no fp32 copy of it), so a decode step's small products cost little besides the weights'
    reading. `chunk` (a multiple of 32; AMX tiles only): the width of k whose products each sum alone
    from zero before the chunks' sums are added in order, as oneDNN sums its K blocks above 32 rows
    (`transformer.onednn_chunk` finds its width); None sums the whole width in one run."""
    amx = head_amx_available() if amx is None else amx
    k = x.shape[-1]
    _check_packed(packed, k, None, "linear_bf16")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"linear_bf16: bf16 rows, got {x.dtype}")
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    fp32_bias = None if bias is None else bias.float().contiguous()
    out = torch.empty(*x.shape[:-1], n, dtype=torch.bfloat16)
    rc = load_kernel()[0].linear_bf16(
        rows.data_ptr(), rows.stride(0), packed.data_ptr(), None if fp32_bias is None else fp32_bias.data_ptr(),
        out.data_ptr(), rows.shape[0], k, packed.shape[1], packed.shape[0] * 16, n, _chunk_pairs(chunk, k, "linear_bf16"),
        _kernel_code(amx), torch.get_num_threads(),
    )  # fmt: skip
    _raise_on(rc, "linear_bf16")
    return out


def _chunk_pairs(chunk: int | None, k: int, who: str) -> int:
    """The kernels' `kc` for a chunk of `chunk` columns of k (0: the whole width); ValueError unless a
    positive multiple of 32."""
    if chunk is None or chunk >= k:
        return 0
    if chunk <= 0 or chunk % 32:
        raise ValueError(f"{who}: a chunk of k is a positive multiple of 32, got {chunk}")
    return chunk // 2
