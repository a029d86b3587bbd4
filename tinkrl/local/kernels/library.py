"""Building and loading the sampler's C kernels (`kernels.c`), without torch.

The library is compiled once per machine by `make install` (through the plan's `probe`), or on first use, with the
machine's C compiler and OpenMP (torch's own runtime, so both share one thread pool), for the
instruction set the plan's probe reports (`-march=native`, or an older x86-64 level where
`ONEDNN_MAX_CPU_ISA` caps what the libraries may use), into `$TINKRL_KERNEL_CACHE` (default
`~/.cache/tinkrl/kernels`), keyed by the source, the compiler and that instruction set. Without a
compiler the plan runs the reference forward and says why; `TINKRL_DECODE_ATTENTION=torch` asks for
that too.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

SOURCE = Path(__file__).with_name("kernels.c")
BASE_FLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-shared", "-fPIC"]
OPT_OUT = "TINKRL_DECODE_ATTENTION"  # =torch: the reference forward, no kernels
_lock = threading.Lock()


def cache_dir() -> Path:
    """Where compiled kernels live: `$TINKRL_KERNEL_CACHE`, else `$XDG_CACHE_HOME/tinkrl/kernels`."""
    if os.environ.get("TINKRL_KERNEL_CACHE"):
        return Path(os.environ["TINKRL_KERNEL_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "tinkrl" / "kernels"


def _compile(cc: list[str], arch: list[list[str]], target: Path) -> str:
    """Build the library at `target` with the first of `arch`'s flag sets the compiler takes; "" or the
    compiler's last error line."""
    err = ""
    target.parent.mkdir(parents=True, exist_ok=True)
    for flags in arch:
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as tmp:
            tmp_path = Path(tmp.name)
        r = subprocess.run([*cc, *BASE_FLAGS, *flags, "-o", str(tmp_path), str(SOURCE)], capture_output=True, text=True)
        if r.returncode == 0:
            os.replace(tmp_path, target)
            return ""
        tmp_path.unlink(missing_ok=True)
        err = (r.stderr.strip().splitlines() or [f"{' '.join(cc)} exited {r.returncode}"])[-1]
    return err


@functools.cache
def load(isa: tuple[str, ...] = ("-march=native", "-mcpu=native")) -> tuple[ctypes.CDLL | None, str]:
    """The compiled kernels for the instruction set `isa` (compiler flags, the first one the compiler
    takes), built on first use; (None, why) where they can't be."""
    if os.environ.get(OPT_OUT, "native") == "torch":
        return None, f"{OPT_OUT}=torch"
    found = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    cc = shlex.split(os.environ.get("CC", "")) or ([found] if found else [])
    if not cc:
        return None, "no C compiler (cc) on PATH"
    try:
        version = subprocess.run([*cc, "--version"], capture_output=True, text=True).stdout
        key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(BASE_FLAGS), version, *isa]).encode())
        target = cache_dir() / f"kernels-{key.hexdigest()[:16]}.so"
        with _lock:
            for attempt in (1, 2):
                if not target.exists():
                    err = _compile(cc, [[flag] for flag in isa] + [[]], target)
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
    _declare(lib)
    return lib, ""


def _declare(lib: ctypes.CDLL) -> None:
    """The C functions' argument and return types (those built for this CPU: the bf16 products only
    where it has AVX512-BF16)."""
    ptr, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    signatures = {
        "rope_decode_attention": [ptr] * 3 + [i32, i64, i64] + [ptr] * 4 + [i32, i64, i64, ptr, i32, ptr, i64, ptr]
        + [i32] * 5 + [f32, i32],
        "rms_norm": [ptr, ptr, i32, i64, ptr, f32, ptr, i32, i32, i32, i32],
        "silu_mul": [ptr, ptr, i32, i64, ptr, i32, i32, i32, i32],
        "amx_lent": [],
        "head_bf16": [ptr, i64, i32, ptr, ptr, i32, i64, i64, i64, i32, i32],
        "linear_bf16": [ptr, i64, ptr, ptr, ptr, i32, i64, i64, i64, i64, i32, i32],
        "decode_layer_bf16": [ptr, ptr, ptr, f32, ptr, f32] + [ptr] * 12 + [i32, i64, i64, ptr, i32, ptr, i64, f32, ptr]
        + [i32] * 8,
    }  # fmt: skip
    for name, args in signatures.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype, fn.argtypes = (ctypes.c_int if name != "rms_norm" and name != "silu_mul" else None), args


def has(lib: ctypes.CDLL | None, name: str) -> bool:
    """Whether the library was built with the C function `name` (the bf16 products need AVX512-BF16)."""
    return lib is not None and hasattr(lib, name)
