"""The host side of the framed protocol spoken with a bwrap sandbox's pid 1 over its stdin/stdout.

A frame is a 4-byte big-endian field count, then each field as a 4-byte length and its
bytes; `bwrap_server.py` (`encode_frame`, `send`, `recv`) and `bwrap_init.c` speak the same format, and a
change here must be mirrored there. Reads take a deadline, so a hung or dead pid 1 is
noticed instead of blocking the caller forever.
"""

from __future__ import annotations

import os
import select
import time

from tinkrl.sandbox.bwrap.bwrap_server import encode_frame  # one encoder: the server's, which runs stdlib-only

__all__ = ["FrameReader", "encode_frame"]


class FrameReader:
    """Reads frames from the server's stdout with a deadline."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buf = bytearray()

    def _need(self, n: int, deadline: float) -> bytes:
        while len(self.buf) < n:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.fd], [], [], wait)
            if ready:
                chunk = os.read(self.fd, max(1 << 16, n - len(self.buf)))
                if not chunk:
                    raise EOFError
                self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def recv(self, deadline: float) -> list[bytes]:
        """The next frame's fields; TimeoutError past `deadline`, EOFError when the server is gone."""
        count = int.from_bytes(self._need(4, deadline), "big")
        fields = []
        for _ in range(count):
            n = int.from_bytes(self._need(4, deadline), "big")
            fields.append(self._need(n, deadline) if n else b"")
        return fields
