"""tinkrl's bwrap sandbox as a Harbor environment: `harbor run` executes tasks with no Docker.

    harbor run -p tasks/hello-file --environment-import-path tinkrl.harness.harbor_env:BwrapEnvironment ...

Harbor's own Docker environment needs `docker compose` and a daemon. This one starts a tinkrl bwrap
sandbox (`tinkrl.sandbox.bwrap`) per trial and builds the task's workspace the way tinkrl trains on
it (`tinkrl.taskdirs.start_sandbox`: `environment/workspace/` + `setup.sh`, or the Dockerfile's
COPY/RUN steps run on this machine's system). Harbor then runs its agent, uploads the tests to
/tests and reads /logs/verifier as it does with any environment.

What the sandbox is, and what it is not: the system directories are the host's, read-only; the
workdir, /tmp, /root, /tests, /logs, /solution and /run are size-capped tmpfs; there is one user
(root inside, an unprivileged uid outside), so Harbor's `user=` is accepted and ignored; the network
is the host's when the task's network policy is public (Harbor's default), none when it is
`no-network`, and an allowlist is refused (bwrap cannot enforce one). A task that only names a
prebuilt image (no recipe for its workspace) is refused with one line when the trial starts.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities

from tinkrl.errors import TinkrlError
from tinkrl.sandbox.base import Sandbox, SandboxError, SandboxProvider
from tinkrl.taskdirs import Task, load_task, start_sandbox
from tinkrl.taskdirs.verifier import sandbox_spec

DEFAULT_TIMEOUT_S = 24 * 3600.0  # Harbor's exec without a timeout: bounded by the trial's own timeouts

_PROVIDER: SandboxProvider | None = None
_PROVIDER_LOCK = threading.Lock()


def shared_provider() -> SandboxProvider:
    """The process's bwrap provider, made on first use (its host checks and compiled pid 1 are shared)."""
    global _PROVIDER
    with _PROVIDER_LOCK:
        if _PROVIDER is None:
            from tinkrl.sandbox.bwrap import BwrapProvider

            _PROVIDER = BwrapProvider()
        return _PROVIDER


def task_dir_of(environment_dir: Path) -> Path:
    """The task directory Harbor's `environment_dir` belongs to (its parent: `<task>/environment`)."""
    return Path(environment_dir).resolve().parent


class BwrapEnvironment(BaseEnvironment):
    """One Harbor trial's environment: a tinkrl bwrap sandbox with the task's workspace built."""

    runs_images = False  # read by tinkrl's harbor sandbox provider: a task's image is not started here ...
    builds_definitions = True  # ... and a task's own environment/ is built here, as tinkrl builds it

    @staticmethod
    def type() -> str:
        """The environment's name in Harbor's records."""
        return "tinkrl-bwrap"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        """Public network or none (as the task asks); no GPUs, mounts, compose or allowlists."""
        return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        """Load the task with tinkrl's loader now, so a bad task is one line before anything starts."""
        self.task: Task = load_task(task_dir_of(self.environment_dir))
        self.sandbox: Sandbox | None = None

    async def start(self, force_build: bool) -> None:
        """Start the sandbox and build the task's workspace in it (`force_build` changes nothing: nothing is cached)."""
        network = getattr(self._network_policy.network_mode, "value", "") == "public"

        def make() -> Sandbox:
            provider = shared_provider()
            if not network:
                return start_sandbox(self.task, provider)
            spec = sandbox_spec(self.task, provider)  # the same build, on a sandbox with the host's network
            spec.network = True
            return start_sandbox(self.task, provider, spec)

        try:
            self.sandbox = await asyncio.to_thread(make)
        except SandboxError:
            raise
        except TinkrlError as e:  # a task bwrap cannot build (a RUN step failed, only an image)
            raise RuntimeError(f"tinkrl-bwrap cannot build task {self.task.id}: {e}") from None
        await self.exec("mkdir -p /logs/agent /logs/verifier /logs/artifacts")

    async def stop(self, delete: bool) -> None:
        """Destroy the sandbox (always: a bwrap sandbox leaves nothing behind to keep)."""
        if self.sandbox is not None:
            sandbox, self.sandbox = self.sandbox, None
            await asyncio.to_thread(sandbox.close)

    def _live(self) -> Sandbox:
        if self.sandbox is None:
            raise RuntimeError("tinkrl-bwrap environment used before start() or after stop()")
        return self.sandbox

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run `command` with bash in the sandbox, from `cwd` (default: the task's workdir)."""
        sandbox = self._live()
        merged = self._merge_env(env) or {}
        timeout = float(timeout_sec) if timeout_sec else DEFAULT_TIMEOUT_S
        r = await asyncio.to_thread(
            sandbox.exec, command, timeout=timeout, env=merged, workdir=cwd or self.task.workdir
        )
        stderr = r.stderr
        if r.timed_out:
            stderr += f"\n[timed out after {timeout:g}s]"
        return ExecResult(stdout=r.stdout, stderr=stderr, return_code=r.exit_code if not r.timed_out else 124)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Copy a host file into the sandbox (its mode kept)."""
        src = Path(source_path)
        await asyncio.to_thread(self._live().write_file, target_path, src.read_bytes(), src.stat().st_mode & 0o777)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copy a host directory's contents into `target_dir` in the sandbox."""
        await asyncio.to_thread(self._live().copy_in, Path(source_dir), target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """Copy a sandbox file to the host (only regular files come out)."""
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        data = await asyncio.to_thread(self._live().read_file, source_path)
        target.write_bytes(data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy a sandbox directory's contents into `target_dir` on the host (regular files and dirs only)."""
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self._live().copy_out, source_dir, target)


__all__ = ["BwrapEnvironment", "shared_provider", "task_dir_of"]
