"""Starting a sandbox from its definition: the spec, then the build steps, in the sandbox layer.

A sandbox definition is a `SandboxSpec` (workdir, env, limits, labels, an image where the provider
runs one) and, for a workspace built in place, the steps a Dockerfile or a task generator gives:
files copied in (`FileCopy`) and commands run (`BuildStep`). `start_sandbox` creates the sandbox
and builds it, closing it again when a step fails; a failed step is a `BuildError` naming where the
step came from. Task directories (`tinkrl.taskdirs`) describe their sandboxes in these terms and
add what grading needs on top.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tinkrl.errors import TinkrlError
from tinkrl.sandbox.base import Sandbox, SandboxProvider, SandboxSpec


@dataclass
class FileCopy:
    """One file or directory put into the sandbox: from the host (`src`) or literal `data`."""

    dest: str
    src: Path | None = None
    data: bytes | None = None
    mode: int = 0o644


@dataclass
class BuildStep:
    """One step of preparing the workspace, in order: copy files in, or run a command."""

    kind: str  # "copy" | "run"
    origin: str  # "environment/Dockerfile:7" — named in errors
    copy: FileCopy | None = None
    command: str = ""
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 300.0


class BuildError(TinkrlError):
    """A build step failed or timed out in the sandbox: `origin` says which step, `message` why."""

    def __init__(self, origin: str, message: str):
        self.origin, self.message = origin, message
        super().__init__(f"{origin}: {message}")


def put_files(sandbox: Sandbox, files: list[FileCopy]) -> None:
    """Put files into the sandbox: literal data, a host directory (copied in) or a host file."""
    for f in files:
        if f.data is not None:
            sandbox.write_file(f.dest, f.data, f.mode)
        elif f.src is not None and f.src.is_dir():
            sandbox.copy_in(f.src, f.dest)
        elif f.src is not None:
            sandbox.write_file(f.dest, f.src.read_bytes(), f.mode)


def run_build(sandbox: Sandbox, steps: Sequence[BuildStep], env: dict[str, str] | None = None) -> None:
    """Run build steps in order in the sandbox, each command with `env` and its own; a command that fails
    or times out raises BuildError with the tail of its output."""
    for step in steps:
        if step.kind == "copy" and step.copy is not None:
            put_files(sandbox, [step.copy])
        elif step.kind == "run":
            r = sandbox.exec(
                step.command, timeout=step.timeout_s, env={**(env or {}), **step.env}, workdir=step.workdir
            )
            if r.exit_code != 0 or r.timed_out:
                why = "timed out" if r.timed_out else f"exited {r.exit_code}"
                raise BuildError(step.origin, f"build step {why}: {r.output.strip()[-600:]}")


def start_sandbox(provider: SandboxProvider, spec: SandboxSpec, steps: Sequence[BuildStep] = ()) -> Sandbox:
    """A new sandbox of `spec` with `steps` run in it; closed again, and the error raised, when a step fails."""
    sandbox = provider.create(spec)
    try:
        run_build(sandbox, steps, spec.env)
    except BaseException:
        sandbox.close()
        raise
    return sandbox
