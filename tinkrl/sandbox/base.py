"""The sandbox provider interface every backend (bwrap, docker, kubernetes) implements.

A `Sandbox` lives for one episode: the working directory, environment, `/tmp` and
background processes persist between `exec` calls, as in a container. Providers are
selected by `sandbox.provider` in the run config.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path

from tinkrl.errors import InfraFailure


class SandboxError(InfraFailure):
    """An infrastructure failure of the sandbox itself (not of the command run in it).

    Rollouts record these as a `failure_mode` and exclude the episode from its group.
    """

    def __init__(self, message: str, failure_mode: str = "sandbox_error"):
        super().__init__(message, failure_mode)


@dataclass
class ExecResult:
    """What one `exec` returned: exit code, stdout and stderr, and whether it timed out or its output was capped."""

    exit_code: int  # -1 when the command was killed by the timeout
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False  # output was capped (head and tail kept)
    duration_s: float = 0.0

    @property
    def output(self) -> str:
        """stdout and stderr together, as a tool observation shows them."""
        if self.stderr and self.stdout:
            return self.stdout + ("" if self.stdout.endswith("\n") else "\n") + self.stderr
        return self.stdout or self.stderr


@dataclass
class SandboxSpec:
    """What a sandbox needs: where the workspace lives inside it and its limits."""

    workdir: str = "/app"  # the task's workdir as tasks hard-code it (/app, /testbed)
    env: dict[str, str] = field(default_factory=dict)
    image: str | None = None  # container image (docker/kubernetes); bwrap cannot honour one
    network: bool = False
    memory_mb: int = 2048
    pids: int = 256
    disk_mb: int = 1024  # workspace + /tmp size caps
    cpu: float = 1.0
    labels: dict[str, str] = field(default_factory=dict)  # run id, task id, owner (scale-out providers)
    definition: str | None = None  # a directory with the Dockerfile the provider builds (`builds_definitions`)


class Sandbox(abc.ABC):
    """One isolated machine-like environment for one episode."""

    spec: SandboxSpec

    @abc.abstractmethod
    def exec(
        self,
        command: str,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run a shell command (`bash -lc`-like) in the sandbox; never raises for command failure."""

    @abc.abstractmethod
    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Write a file at an absolute path inside the sandbox."""

    @abc.abstractmethod
    def read_file(self, path: str) -> bytes:
        """Read a file at an absolute path inside the sandbox (FileNotFoundError if absent)."""

    @abc.abstractmethod
    def copy_in(self, src: Path, dest: str) -> None:
        """Copy a host file or directory to `dest` inside the sandbox."""

    @abc.abstractmethod
    def copy_out(self, src: str, dest: Path) -> None:
        """Copy a file or directory from inside the sandbox to the host."""

    @abc.abstractmethod
    def kill_all(self) -> None:
        """Kill every process started in the sandbox (before grading)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Destroy the sandbox and everything in it. Idempotent."""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SandboxProvider(abc.ABC):
    """Creates sandboxes; one per run, configured from `sandbox.*` config fields. `runs_images`: whether
    it can start a sandbox from a container image (`SandboxSpec.image`); `builds_definitions`: whether it
    builds a sandbox from a task's own Dockerfile (`SandboxSpec.definition`) in place of the build steps."""

    name: str
    runs_images: bool = True
    builds_definitions: bool = False

    @abc.abstractmethod
    def create(self, spec: SandboxSpec) -> Sandbox:
        """Start a sandbox; raises SandboxError when the provider cannot."""

    def close(self) -> None:
        """Release provider resources and clean up leaked sandboxes of this run."""

    def summary(self) -> dict[str, int]:
        """Counts of what this provider did, for the run's summary (e.g. sandboxes started and failed to start);
        empty for providers that keep none."""
        return {}
