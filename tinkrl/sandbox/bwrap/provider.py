"""The bwrap provider: checks the host once, builds what sandboxes share, and hands sandboxes out.

With `pool=N`, a background thread keeps N started, never-used sandboxes ready for each
recently asked-for spec (`_WarmPool`), so `create` usually returns one at once; without
it every `create` starts a sandbox on demand.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

from tinkrl.errors import ConfigError
from tinkrl.sandbox.base import SandboxError, SandboxProvider, SandboxSpec
from tinkrl.sandbox.bwrap.build import SANDBOX_PYTHON, compiled_init, compiled_server, default_state_dir, generated_etc
from tinkrl.sandbox.bwrap.cgroups import Cgroups
from tinkrl.sandbox.bwrap.sandbox import STARTUP_TIMEOUT_S, BwrapSandbox, check_workdir
from tinkrl.sandbox.bwrap.uids import DEFAULT_UID_BASE, DEFAULT_UID_COUNT, UidPool

SERVERS = ("auto", "native", "python")
# Bytes of stdout (and of stderr) kept per command, head + tail: tinkrl.config.DEFAULT_MAX_OUTPUT's
# value, restated (not imported) so that bwrap-only use, e.g. `tinkrl sandbox run`, never loads pydantic.
DEFAULT_MAX_OUTPUT = 64 * 1024


def _bwrap_path() -> str:
    path = shutil.which("bwrap") or ("/usr/bin/bwrap" if os.path.exists("/usr/bin/bwrap") else None)
    if not path:
        raise SandboxError(
            "bubblewrap is not installed (apt-get install bubblewrap; see scripts/install-system.sh)",
            "sandbox_unavailable",
        )
    return path


def _pool_key(spec: SandboxSpec) -> tuple:
    """Everything a started sandbox has baked in (mounts, limits, pid 1's env)."""
    return (spec.workdir, tuple(sorted(spec.env.items())), spec.network, spec.memory_mb, spec.pids, spec.disk_mb)


class _WarmPool:
    """Keeps `size` started, never-used sandboxes per recently asked-for spec.

    A pooled sandbox is exactly what a cold `create` would return — started, handshake
    done, nothing run in it — only started earlier by a background thread; each is handed
    out once. The pool refills for the `MAX_SPECS` specs asked for most recently.
    """

    MAX_SPECS = 4
    RETRY_AFTER_FAILURE_S = 2.0

    def __init__(self, provider: BwrapProvider, size: int):
        self.provider, self.size = provider, size
        self.ready: dict[tuple, list[BwrapSandbox]] = {}
        self.starting: dict[tuple, int] = {}
        self.wanted: dict[tuple, SandboxSpec] = {}  # insertion order = least recently asked first
        self.cond = threading.Condition()
        self.closed = False
        self.last_error: str | None = None
        self.thread = threading.Thread(target=self._fill, name="tinkrl-bwrap-pool", daemon=True)
        self.thread.start()

    def take(self, spec: SandboxSpec) -> BwrapSandbox | None:
        """A ready sandbox for `spec`, or None (the caller starts one); marks `spec` as wanted."""
        key = _pool_key(spec)
        evicted: list[BwrapSandbox] = []
        with self.cond:
            self.wanted.pop(key, None)
            self.wanted[key] = SandboxSpec(
                workdir=spec.workdir,
                env=dict(spec.env),
                network=spec.network,
                memory_mb=spec.memory_mb,
                pids=spec.pids,
                disk_mb=spec.disk_mb,
            )
            while len(self.wanted) > self.MAX_SPECS:
                old = next(iter(self.wanted))
                del self.wanted[old]
                evicted += self.ready.pop(old, [])
            ready = self.ready.get(key)
            sb = ready.pop(0) if ready else None
            self.cond.notify_all()
        for old_sb in evicted:
            old_sb.close()
        if sb is not None and not sb.alive:  # died while waiting (e.g. killed from outside)
            sb.close()
            return None
        if sb is not None:
            sb.spec = spec
        return sb

    def _next_wanted(self) -> tuple[tuple, SandboxSpec] | None:
        for key, spec in reversed(self.wanted.items()):  # most recently asked first
            if len(self.ready.get(key, ())) + self.starting.get(key, 0) < self.size:
                return key, spec
        return None

    def _fill(self) -> None:
        while True:
            with self.cond:
                while not self.closed and (job := self._next_wanted()) is None:
                    self.cond.wait()
                if self.closed:
                    return
                key, spec = job
                self.starting[key] = self.starting.get(key, 0) + 1
            sb, failed = None, False
            try:
                sb = self.provider._start_sandbox(spec)
            except Exception as e:  # recorded; callers fall back to a cold start
                self.last_error, failed = f"{type(e).__name__}: {e}", True
            with self.cond:
                self.starting[key] -= 1
                keep = sb is not None and not self.closed and key in self.wanted
                if keep:
                    self.ready.setdefault(key, []).append(sb)
            if sb is not None and not keep:
                sb.close()
            if failed:
                time.sleep(self.RETRY_AFTER_FAILURE_S)

    def close(self) -> None:
        """Stop refilling and close every sandbox still waiting in the pool."""
        with self.cond:
            self.closed = True
            idle = [sb for sbs in self.ready.values() for sb in sbs]
            self.ready.clear()
            self.cond.notify_all()
        for sb in idle:
            sb.close()
        self.thread.join(timeout=STARTUP_TIMEOUT_S)


class BwrapProvider(SandboxProvider):
    """Creates bwrap sandboxes on this machine.

    Options: `uid_base`/`uid_count` (the reserved host uid range, root only), `state_dir`
    (uid locks and the generated /etc), `max_output_bytes` (kept per stream and command),
    `cgroups` (False = rlimits only), `server` ("native": the compiled bwrap_init.c as pid 1;
    "python": bwrap_server.py as pid 1; "auto": native when a C compiler is there), `pool`
    (0 = start every sandbox on demand; N = keep N fresh, never-used sandboxes started
    ahead for each recently asked-for spec, so `create` hands one out).
    """

    name = "bwrap"
    runs_images = False  # a workspace built on the host's system, read-only

    def __init__(
        self,
        *,
        uid_base: int = DEFAULT_UID_BASE,
        uid_count: int = DEFAULT_UID_COUNT,
        state_dir: str | Path | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT,
        cgroups: bool = True,
        server: str = "auto",
        pool: int = 0,
    ):
        if server not in SERVERS:
            raise ConfigError(f"bwrap server {server!r} is not one of {', '.join(SERVERS)}")
        self.bwrap = _bwrap_path()
        if not os.access(SANDBOX_PYTHON, os.X_OK):
            raise SandboxError(
                f"{SANDBOX_PYTHON} is missing: the sandbox runs Debian's python3 (apt-get install python3)",
                "sandbox_unavailable",
            )
        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o755)
        self.etc_dir = generated_etc(self.state_dir)
        self.server_pyc = compiled_server(self.state_dir)
        self.init_bin, why = compiled_init(self.state_dir) if server != "python" else (None, "")
        if server == "native" and self.init_bin is None:
            raise SandboxError(f"the native bwrap sandbox server is unavailable: {why}", "sandbox_unavailable")
        self.server = "native" if self.init_bin is not None else "python"
        self.max_output_bytes = max_output_bytes
        self._uids = UidPool(self.state_dir / "uids", uid_base, uid_count) if os.geteuid() == 0 else None
        self.cgroups = Cgroups(enabled=cgroups)
        self._live: set[BwrapSandbox] = set()
        self._live_lock = threading.Lock()
        if pool < 0:
            raise ConfigError(f"bwrap pool must be >= 0, got {pool}")
        self.pool = _WarmPool(self, pool) if pool else None

    def create(self, spec: SandboxSpec | None = None) -> BwrapSandbox:
        spec = spec or SandboxSpec()
        if spec.image:
            raise ConfigError(
                f"this task needs the container image {spec.image!r}, which the bwrap sandbox cannot "
                "run: set sandbox.provider to docker or kubernetes"
            )
        if self.pool is not None:
            check_workdir(spec.workdir)
            sb = self.pool.take(spec)
            if sb is not None:
                return sb
        return self._start_sandbox(spec)

    def _start_sandbox(self, spec: SandboxSpec) -> BwrapSandbox:
        sb = BwrapSandbox(self, spec)
        with self._live_lock:
            self._live.add(sb)
        return sb

    def _forget(self, sb: BwrapSandbox) -> None:
        with self._live_lock:
            self._live.discard(sb)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        with self._live_lock:
            live = list(self._live)
        for sb in live:
            sb.close()
