"""The `tinkrl` command runs on tcmalloc where the machine has it: freed tensor memory is reused.

glibc's malloc keeps the memory a training step frees on its heap instead of serving the next
tensors from it: a long datum's forward, whose layers each free their temporaries while keeping
their inputs for the backward, grows the process by several times what it holds, and the memory
stays resident. tcmalloc (Debian's `libtcmalloc-minimal4`, which `make install` installs) reuses it
and runs a step as fast or faster (docs/performance.md, "Training memory"). The allocator must be
in place before the process's first allocation, so `tinkrl` starts itself again with tcmalloc
preloaded (`reexec_on_tcmalloc`), once, before anything is imported; `TINKRL_ALLOCATOR=system`
keeps glibc's. The preload is taken back out of the environment at once, so that the commands
tinkrl starts (sandboxes, servers, task tests) never inherit it. Either allocator keeps freed pages
for reuse; `release_free_memory` gives them back after a long episode's training, so that the
process's resident memory is what it holds, not its highest peak.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

TCMALLOC = "libtcmalloc_minimal.so.4"
_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
MARK = "TINKRL_ALLOCATOR"  # "system": glibc's malloc; "tcmalloc" marks the restarted process (then removed)


def tcmalloc_path() -> str | None:
    """Where this machine's tcmalloc library is, if it has one."""
    return next((str(Path(d) / TCMALLOC) for d in _DIRS if (Path(d) / TCMALLOC).is_file()), None)


def preload_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a child process that should run on tcmalloc (as `tinkrl` does), where there is one."""
    path = tcmalloc_path()
    if path is None or env.get(MARK) == "system":
        return env
    return {**env, "LD_PRELOAD": ":".join(p for p in (path, env.get("LD_PRELOAD", "")) if p), MARK: "tcmalloc"}


def reexec_on_tcmalloc() -> None:
    """Start this process again with tcmalloc preloaded (Linux, where it is installed, unless
    `TINKRL_ALLOCATOR=system` or this is already that process); in the restarted process, take the
    preload back out of the environment its children inherit."""
    mark = os.environ.get(MARK)
    if mark == "tcmalloc":  # the restarted process: its children start as this one did (a `tinkrl` child re-executes)
        del os.environ[MARK]
        preload = [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p and not p.endswith(TCMALLOC)]
        if preload:
            os.environ["LD_PRELOAD"] = ":".join(preload)
        else:
            os.environ.pop("LD_PRELOAD", None)
        return
    if mark == "system" or not sys.platform.startswith("linux") or not getattr(sys, "orig_argv", None):
        return
    env = preload_env(dict(os.environ))
    if env.get(MARK) == "tcmalloc":
        os.execve(sys.executable, sys.orig_argv, env)


def release_free_memory() -> None:
    """Return the allocator's freed pages to the system: tcmalloc's `ReleaseFreeMemory` where it is
    loaded, else glibc's `malloc_trim`; nothing where neither is there (another libc)."""
    libc = ctypes.CDLL(None)
    for name in ("MallocExtension_ReleaseFreeMemory", "malloc_trim"):
        fn = getattr(libc, name, None)
        if fn is not None:
            fn(*([0] if name == "malloc_trim" else []))
            return
