"""What the container providers (docker, kubernetes) share: the exec shell script, output
capping, and who owns a sandbox (labels the reaper reads).

A container image may have no Python, so everything that runs inside is POSIX sh: each
exec is one `bash -c` (or `sh -c` when the image has no bash) that restores the cwd and
exported environment the previous command left (like a terminal, as the bwrap provider
does), runs the command under `timeout` when the image has one, and saves its state on
exit. Ownership is written on every container/pod as labels and annotations, so a reaper
can later tell a live run's sandboxes from a dead run's without any state of its own.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

from tinkrl.config import DEFAULT_MAX_OUTPUT

STATE_DIR = "/tmp/.tinkrl"  # inside the sandbox: the shell state between exec calls
STATE_FILE = STATE_DIR + "/state"
# PID 1 of every container sandbox: waits forever, reaps orphans (`wait` = waitpid(-1)),
# exits at once on TERM so deletion never waits out a grace period.
KEEPALIVE = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait; done"
TIMEOUT_EXIT_CODES = (124, 137, 143)  # coreutils timeout / busybox timeout (TERM, KILL)


class Capture:
    """Keeps the head and tail of a byte stream (at most `limit` bytes in all)."""

    def __init__(self, limit: int = DEFAULT_MAX_OUTPUT):
        self.limit = max(limit, 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        half = self.limit // 2
        room = half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.limit - half:
                cut = len(self.tail) - (self.limit - half)
                self.dropped += cut
                del self.tail[:cut]

    def result(self) -> tuple[str, bool]:
        data = bytes(self.head)
        if self.dropped:
            data += f"\n[... {self.dropped} bytes cut ...]\n".encode()
        data += bytes(self.tail)
        return data.decode("utf-8", "replace"), self.dropped > 0


def exec_script(
    command: str,
    timeout: float,
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    default_workdir: str = "/app",
) -> str:
    """The POSIX sh program one exec runs; the command itself runs under bash when the image has it.

    `workdir` given = a one-off directory: the command runs there and the saved state is
    left alone. Otherwise the command starts where the previous one ended (first: the
    sandbox's workdir), and its final cwd and exported variables are saved on exit for the
    next call. State is saved and restored by the same shell, so `export -p`'s format fits.
    """
    q = shlex.quote
    secs = max(1, int(round(timeout)))
    inner = [f"mkdir -p {STATE_DIR} 2>/dev/null; cd {q(default_workdir)} 2>/dev/null"]
    if workdir is None:
        inner.append(f"[ -r {STATE_FILE}.env ] && . {STATE_FILE}.env >/dev/null 2>&1")
        inner.append(f'[ -r {STATE_FILE}.cwd ] && cd "$(cat {STATE_FILE}.cwd)" 2>/dev/null')
    inner += [f"export {k}={q(v)}" for k, v in (env or {}).items() if _ENV_NAME.fullmatch(k)]
    if workdir is not None:
        inner.append(f"cd {q(workdir)} || exit 1")
    else:
        inner.append(
            f"trap '{{ export -p > {STATE_FILE}.env.$$ && pwd > {STATE_FILE}.cwd.$$ && "
            f"mv -f {STATE_FILE}.env.$$ {STATE_FILE}.env && mv -f {STATE_FILE}.cwd.$$ {STATE_FILE}.cwd; }}"
            f" 2>/dev/null' EXIT"
        )
    body = "\n".join(inner) + "\n" + command
    return (
        "__tk_sh=/bin/sh; [ -x /bin/bash ] && __tk_sh=/bin/bash\n"
        f'if command -v timeout >/dev/null 2>&1; then exec timeout -k 2 {secs} "$__tk_sh" -c {q(body)}; '
        f'else exec "$__tk_sh" -c {q(body)}; fi\n'
    )


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def shell_argv(script: str) -> list[str]:
    """argv that runs `script` with the image's shell."""
    return ["/bin/sh", "-c", script]


def judge_timeout(exit_code: int, duration_s: float, timeout: float) -> bool:
    """Was this command ended by its timeout (not by failing on its own)?"""
    return exit_code in TIMEOUT_EXIT_CODES and duration_s >= timeout * 0.98


KILL_ALL_SCRIPT = "kill -9 -1 2>/dev/null; exit 0"  # every process but pid 1 (keepalive) and this shell


# -- ownership -----------------------------------------------------------------------------
def _proc_start_ticks(pid: int) -> str:
    """A process's start time (clock ticks since boot): pid + start tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


@dataclass(frozen=True)
class Owner:
    """The process that owns sandboxes: this orchestrator (and its pod, when in a cluster)."""

    host: str
    pid: int
    start: str
    pod: str = ""  # the orchestrator pod's name (downward API POD_NAME), in a cluster
    pod_uid: str = ""
    namespace: str = ""

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        return cls(
            host=socket.gethostname(),
            pid=pid,
            start=_proc_start_ticks(pid),
            pod=os.environ.get("POD_NAME", ""),
            pod_uid=os.environ.get("POD_UID", ""),
            namespace=os.environ.get("POD_NAMESPACE", ""),
        )

    @property
    def name(self) -> str:
        return self.pod or f"{self.host}-{self.pid}"

    def process_alive(self) -> bool | None:
        """True/False when the owner process is on this host; None when we cannot tell."""
        if self.host != socket.gethostname() or not self.pid:
            return None
        return bool(self.start) and _proc_start_ticks(self.pid) == self.start


def label_value(text: str, limit: int = 63) -> str:
    """A Kubernetes label value (also fine as a docker label): [A-Za-z0-9._-], ≤63, alnum ends."""
    v = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:limit].strip("-._")
    return v or "x"


def dns_name(text: str, limit: int = 40) -> str:
    v = re.sub(r"[^a-z0-9-]+", "-", text.lower())[:limit].strip("-")
    return v or "x"
