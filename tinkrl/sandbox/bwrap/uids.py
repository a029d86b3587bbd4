"""Host uids for bwrap sandboxes when tinkrl runs as root: one unprivileged uid per live sandbox.

Each sandbox runs as a uid of its own from a reserved range, so rlimits and cgroups are never
shared between concurrent sandboxes. The lock is a flock on one file per uid: it makes a uid
unique host-wide (across processes too) and is released by the kernel when its holder dies.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from tinkrl.sandbox.base import SandboxError

DEFAULT_UID_BASE = 2_000_000_000
DEFAULT_UID_COUNT = 4096


class UidPool:
    """Hands out host uids from a reserved range; a flock per uid makes them unique host-wide."""

    def __init__(self, lock_dir: Path, base: int, count: int):
        self.lock_dir, self.base, self.count = lock_dir, base, count
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        self._next = 0
        self._mutex = threading.Lock()

    def acquire(self) -> tuple[int, int]:
        """(uid, fd of its held lock); SandboxError when every uid of the range is taken."""
        with self._mutex:
            start = self._next
            for i in range(self.count):
                idx = (start + i) % self.count
                uid = self.base + idx
                fd = os.open(self.lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._next = (idx + 1) % self.count
                return uid, fd
        raise SandboxError(f"all {self.count} sandbox uids from {self.base} are in use", "sandbox_capacity")

    @staticmethod
    def release(fd: int) -> None:
        """Give back the uid whose lock `fd` holds."""
        try:
            os.close(fd)  # closing drops the flock
        except OSError:
            pass
