"""Decode attention on CPU: one new query per row over the KV cache, in a small C kernel.

A decode step's attention is one query token per row against every cached position. torch's CPU
attention kernel (`scaled_dot_product_attention`) is built for long queries: at one query token it
runs each query head alone (re-reading the keys and values its KV head shares with the other query
heads of its group) and spends most of its time outside the arithmetic. `decode_attention.c` runs
one task per (row, KV head): the scores of all of that head's query heads over the cache (each key
read once), a softmax, and the weighted values (each value read once), skipping masked positions
(padding, and cache slots not yet written). Same fp32 result as torch's kernel, to rounding.

The kernel is compiled on first use with the machine's C compiler (`-march=native`, OpenMP: the
same OpenMP runtime torch's CPU kernels run on, so both share one thread pool) into
`$TINKRL_KERNEL_CACHE` (default `~/.cache/tinkrl/kernels`), keyed by the source, the compiler and
the CPU. Without a compiler (or OpenMP), torch's kernel is used and one warning says why.
`TINKRL_DECODE_ATTENTION=torch` uses torch's kernel anyway.
"""

from __future__ import annotations

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
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("decode_attention.c")
BASE_FLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-shared", "-fPIC"]
ARCH_FLAGS = (["-march=native"], ["-mcpu=native"], [])  # the first one the compiler accepts
_LANES = 16  # the kernel's vector width in floats: head_dim must be a multiple of it
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
def load_kernel() -> tuple[ctypes._CFuncPtr | None, str]:
    """The compiled kernel's entry point, built on first use; (None, why) where it can't be."""
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
                    fn = ctypes.CDLL(str(target)).decode_attention
                    break
                except OSError:
                    if attempt == 2:
                        raise
                    target.unlink(missing_ok=True)  # a damaged build: made again once
    except OSError as e:  # no such compiler, an unwritable cache, a library that does not load
        return None, f"cannot build or load {SOURCE.name}: {e}"
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 5 + [ctypes.c_int64] * 3 + [ctypes.c_float, ctypes.c_int]
    return fn, ""


@functools.cache
def _warn_unavailable(why: str) -> None:
    warnings.warn(f"decode attention: {why}; sampling uses torch's attention kernel (slower)", stacklevel=3)


def reads_cache(k: torch.Tensor) -> bool:
    """Whether the kernel can read this cache ([layers, rows, H_kv, positions, D]) in place: then a
    batch may keep its rows where they are (`rows` of `decode_attention`) instead of copying them."""
    return k.device.type == "cpu" and k.dtype == torch.float32 and k.shape[-1] % _LANES == 0 and _available()


def _available() -> bool:
    fn, why = load_kernel()
    if fn is None and not why.startswith("TINKRL_DECODE_ATTENTION"):
        _warn_unavailable(why)
    return fn is not None


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor | None = None
) -> torch.Tensor | None:
    """Attention of one new query token per row, or None where the kernel does not apply (the caller
    then runs torch's kernel).

    `q`: [B, H, 1, D]; `k`, `v`: [B, H_kv, T, D] views of the cache (positions contiguous), or with
    `rows` (int64 [B]) the cache's rows of every batch row, `k` and `v` then being views of all the
    cache's rows; `mask`: additive [B or 1, 1, 1, T], -inf where a row must not look. Returns
    [B, H, 1, D] like `scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)`.
    Applies on CPU, in fp32, without autograd, with head_dim a multiple of 16.
    """
    B, H, Q, D = q.shape
    T = k.shape[2]
    if (
        q.device.type != "cpu"
        or Q != 1
        or torch.is_grad_enabled()
        or D % _LANES
        or not (q.dtype == k.dtype == v.dtype == mask.dtype == torch.float32)
        or H % k.shape[1]
        or k.stride() != v.stride()
        or k.stride(3) != 1
        or k.stride(2) != D
        or mask.shape[1:] != (1, 1, T)
        or mask.shape[0] not in (1, B)
        or mask.stride(3) != 1
        or (rows is None and k.shape[0] != B)
        or (rows is not None and (rows.dtype != torch.int64 or rows.shape != (B,) or not rows.is_contiguous()))
        or not _available()
    ):
        return None
    if rows is not None:
        lo, hi = (int(x) for x in torch.aminmax(rows))
        if lo < 0 or hi >= k.shape[0]:
            raise IndexError(f"decode attention: cache rows {lo}..{hi} outside the cache's {k.shape[0]}")
    fn = load_kernel()[0]
    q = q.reshape(B, H, D).contiguous()
    out = torch.empty((B, H, D), dtype=torch.float32)
    mask_stride = mask.stride(0) if mask.shape[0] == B else 0
    rc = fn(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), None if rows is None else rows.data_ptr(), mask.data_ptr(),
        out.data_ptr(),
        B, H, k.shape[1], D, T, k.stride(0), k.stride(1), mask_stride, D**-0.5, torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise MemoryError("decode attention: a thread's scratch memory could not be allocated")
    return out.view(B, H, 1, D)
