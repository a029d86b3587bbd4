"""What the container providers (docker, kubernetes) share: a sandbox and a provider base,
the exec shell script, output capping, and who owns a sandbox (labels the reaper reads).

`ContainerSandbox` implements the whole `Sandbox` interface once (open and absolute-path
checks, exec with its timeout judgement, copies through tar, close) over a few transport
methods each provider supplies: run an argv with a deadline, write/read one file, put/get
a tar of a tree, destroy. `ContainerProvider` turns a config (model, dict or None, plus
keyword options) into the provider's config class and keeps the owner, run id and the
set of live sandboxes it closes on `close`.

A container image may have no Python, so everything that runs inside is POSIX sh: each
exec is one `bash -c` (or `sh -c` when the image has no bash) that restores the cwd and
exported environment the previous command left (like a terminal, as the bwrap provider
does), runs the command under `timeout` when the image has one, and saves its state on
exit. Ownership is written on every container/pod as labels and annotations, so a reaper
can later tell a live run's sandboxes from a dead run's without any state of its own.
"""

from __future__ import annotations

import abc
import os
import re
import shlex
import socket
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tinkrl.config import DEFAULT_MAX_OUTPUT
from tinkrl.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxProvider, SandboxSpec
from tinkrl.sandbox.files import check_abs, safe_extract, tar_host_path

if TYPE_CHECKING:
    from pydantic import BaseModel

STATE_DIR = "/tmp/.tinkrl"  # inside the sandbox: the shell state between exec calls
STATE_FILE = STATE_DIR + "/state"
# PID 1 of every container sandbox: waits forever, reaps orphans (`wait` = waitpid(-1)),
# exits at once on TERM so deletion never waits out a grace period.
KEEPALIVE = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait; done"
TIMEOUT_EXIT_CODES = (124, 137, 143)  # coreutils timeout / busybox timeout (TERM, KILL)
HARD_DEADLINE_GRACE_S = 15.0  # past a command's timeout, stop waiting for its stream


class Capture:
    """Keeps the head and tail of a byte stream (at most `limit` bytes in all)."""

    def __init__(self, limit: int = DEFAULT_MAX_OUTPUT):
        self.limit = max(limit, 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        """Take the next chunk of the stream."""
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
        """(the text kept, with a marker where the middle was cut; whether anything was cut)."""
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
        """This process, and its pod when the downward API names one."""
        pid = os.getpid()
        return cls(
            host=socket.gethostname(),
            pid=pid,
            start=_proc_start_ticks(pid),
            pod=os.environ.get("POD_NAME", ""),
            pod_uid=os.environ.get("POD_UID", ""),
            namespace=os.environ.get("POD_NAMESPACE", ""),
        )

    @classmethod
    def recorded(cls, keys: dict[str, str], prefix: str) -> Owner:
        """The owner process written on a sandbox as `{prefix}owner-host`, `-pid` and `-start`."""
        return cls(
            host=keys.get(f"{prefix}owner-host", ""),
            pid=int(keys.get(f"{prefix}owner-pid") or 0),
            start=keys.get(f"{prefix}owner-start", ""),
        )

    @property
    def name(self) -> str:
        """The pod name in a cluster, else host-pid."""
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
    """A lowercase DNS-label piece of `text` (for container and pod names)."""
    v = re.sub(r"[^a-z0-9-]+", "-", text.lower())[:limit].strip("-")
    return v or "x"


def task_id_of(spec: SandboxSpec) -> str:
    """The task a sandbox is for, from its labels ("" when none is named)."""
    return spec.labels.get("task_id") or spec.labels.get("task") or ""


# -- the bases -----------------------------------------------------------------------------
class ContainerSandbox(Sandbox):
    """One container or pod: the `Sandbox` interface over the provider's transport methods.

    A subclass supplies `_run`, `_write`, `_read`, `_put_tree`, `_get_tree` and `_destroy`;
    every public method here checks that the sandbox is open and that paths are absolute.
    """

    def __init__(self, provider: ContainerProvider, spec: SandboxSpec, name: str):
        self.provider = provider
        self.spec = spec
        self.name = name
        self._closed = False

    # -- transport (per provider) --------------------------------------------------------
    @abc.abstractmethod
    def _run(self, argv: list[str], timeout: float, user: str | None = None) -> tuple[int, str, str, bool, bool, float]:
        """(exit code or -1, stdout, stderr, gave_up, truncated, seconds) of one argv, output capped."""

    @abc.abstractmethod
    def _write(self, path: str, data: bytes, mode: int) -> None:
        """Write one file at absolute `path`, creating its parent directories."""

    @abc.abstractmethod
    def _read(self, path: str) -> bytes:
        """One file's bytes (FileNotFoundError if absent)."""

    @abc.abstractmethod
    def _put_tree(self, dest: str, tar: bytes) -> None:
        """Unpack a tar stream into directory `dest`, creating it."""

    @abc.abstractmethod
    def _get_tree(self, src: str) -> bytes:
        """A tar stream of file or directory `src`, its top entry named by `src`'s last part."""

    @abc.abstractmethod
    def _destroy(self) -> None:
        """Delete the container or pod; failures are noted, not raised (the reaper collects leaks)."""

    # -- Sandbox API ---------------------------------------------------------------------
    def exec(
        self,
        command: str,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        self._check_open()
        script = exec_script(command, timeout, env=env, workdir=workdir, default_workdir=self.spec.workdir)
        code, out, err, gave_up, cut, dur = self._run(shell_argv(script), timeout, user=user)
        timed_out = gave_up or judge_timeout(code, dur, timeout)
        if gave_up:
            self.kill_all()
        return ExecResult(
            exit_code=-1 if timed_out else code,
            stdout=out,
            stderr=err,
            timed_out=timed_out,
            truncated=cut,
            duration_s=dur,
        )

    def kill_all(self) -> None:
        self._check_open()
        self._run(shell_argv(KILL_ALL_SCRIPT), 30.0)

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._check_open()
        self._write(check_abs(path), data.encode() if isinstance(data, str) else data, mode)

    def read_file(self, path: str) -> bytes:
        self._check_open()
        return self._read(check_abs(path))

    def copy_in(self, src: Path, dest: str) -> None:
        """A host file to `dest`, or a host directory's contents into directory `dest`."""
        self._check_open()
        src, dest = Path(src), check_abs(dest)
        if src.is_file():
            self.write_file(dest, src.read_bytes(), src.stat().st_mode & 0o777)
            return
        if not src.is_dir():
            raise FileNotFoundError(2, "No such file or directory", str(src))
        self._put_tree(dest, tar_host_path(src, "."))

    def copy_out(self, src: str, dest: Path) -> None:
        """A sandbox file to host path `dest`, or a directory's contents into directory `dest`."""
        self._check_open()
        safe_extract(self._get_tree(check_abs(src)), Path(dest), strip_top=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._destroy()
        finally:
            self.provider._forget(self)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.name} is closed", "sandbox_closed")

    def _infra(self, message: str) -> SandboxError:
        return SandboxError(f"{self.provider.name} sandbox {self.name}: {message}", "sandbox_error")


class ContainerProvider(SandboxProvider):
    """What the docker and kubernetes providers share: config, owner, run id and live sandboxes.

    Options: a `config_class` instance, a dict of its fields or None, plus its fields as
    keyword arguments (which win).
    """

    config_class: ClassVar[type[BaseModel]]

    def __init__(self, config: BaseModel | dict[str, Any] | None = None, **options: Any):
        if isinstance(config, self.config_class):
            config = config.model_dump()
        self.config = self.config_class(**{**(config or {}), **options})
        self.owner = Owner.current()
        self.run_id = self.config.run_id or uuid.uuid4().hex[:12]
        self.notes: list[str] = []
        self._live: set[ContainerSandbox] = set()
        self._lock = threading.Lock()
        self._closed = False

    def _image(self, spec: SandboxSpec) -> str:
        """The image a sandbox for `spec` runs: the task's own, else the configured default."""
        image = spec.image or self.config.image
        if not image:
            raise SandboxError(
                f"the {self.name} provider needs an image: the task names none and sandbox.{self.name}.image is unset",
                "bad_config",
            )
        return image

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"{self.name} provider is closed", "sandbox_closed")

    def _track(self, sb: ContainerSandbox) -> None:
        with self._lock:
            self._live.add(sb)

    def _forget(self, sb: ContainerSandbox) -> bool:
        """Drop a closed sandbox from the live set; True only the first time (so slots free once)."""
        with self._lock:
            if sb not in self._live:
                return False
            self._live.discard(sb)
            return True

    def _release(self) -> None:
        """Release what the provider itself holds, after its sandboxes are closed (once)."""

    def close(self) -> None:
        """Close every sandbox this provider still has, then release its own resources. Idempotent."""
        first = not self._closed
        self._closed = True
        with self._lock:
            live = list(self._live)
        for sb in live:
            sb.close()
        if first:
            self._release()
