"""The task model every loader produces: what the agent is told, how its sandbox is prepared,
and how it is graded. Harbor's directory layout is the canonical source (docs/design.md, "Tasks, agents and sandboxes");
terminal-bench dirs, R2E-Gym rows and SWE-bench rows are converted into the same `Task`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from tinkrl.errors import TinkrlError
from tinkrl.sandbox.build import BuildStep, FileCopy


class TaskLoadError(TinkrlError):
    """A task that cannot be loaded or built: says which file (and line or field) and why."""

    def __init__(self, where: str | Path, message: str, field: str | None = None):
        self.where = str(where)
        self.field = field
        self.message = message
        super().__init__(f"{self.where}: {field + ': ' if field else ''}{message}")


@dataclass
class Task:
    """One task: what the agent is told, how its sandbox is prepared (local build or image), and how it is graded."""

    id: str
    source: Path  # the task directory, or the rows file a row came from
    format: str  # "harbor" | "terminal-bench" | "r2e" | "swebench"
    instruction: str
    workdir: str = "/app"
    grader: str = "reward_file"
    env: dict[str, str] = field(default_factory=dict)  # the agent's environment variables
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 600.0
    memory_mb: int = 2048
    pids: int = 256
    disk_mb: int = 1024
    cpus: float = 1.0
    build: list[BuildStep] = field(default_factory=list)
    tests: list[FileCopy] = field(default_factory=list)  # copied fresh into /tests before grading
    test_command: str = ""  # run from the workdir with a pinned environment
    verifier_env: dict[str, str] = field(default_factory=dict)
    pre_test_command: str = ""  # e.g. SWE-bench: reset test files and apply the test patch
    solution: list[FileCopy] = field(default_factory=list)  # copied into /solution for the gate only
    solution_command: str = ""
    expected: dict = field(default_factory=dict)  # r2e: {test: status}; swebench: FAIL_TO_PASS/PASS_TO_PASS
    original_files: dict[str, bytes] = field(default_factory=dict)  # absolute path -> content (from `build`)
    content_hash: str = ""
    metadata: dict = field(default_factory=dict)
    # A prebuilt container image holding the prepared environment (Harbor `docker_image`,
    # R2E-Gym/SWE-bench `docker_image`/`image`/`image_name`). Container providers (docker,
    # kubernetes) start the task from it and skip `build`; bwrap cannot run images and uses
    # `build` (the workspace/setup.sh/Dockerfile recipe) instead, or refuses a task without one.
    image: str | None = None
    # When the image runs: paths restored before grading to what they held when the sandbox
    # started (absent then -> removed), e.g. the files a SWE-bench test patch touches.
    restore_paths: list[str] = field(default_factory=list)
    # When the image runs: a path inside it holding hidden tests (R2E-Gym's r2e_tests). It is
    # read and removed before the agent starts, and copied into /tests/<name> at grading.
    image_tests: str = ""
    # The directory whose Dockerfile `build` was read from (a Harbor task's environment/): providers
    # that build sandboxes from a Dockerfile themselves (`builds_definitions`) are given it instead
    # of the build steps, so their own image build and caching serve the task.
    definition: Path | None = None

    @property
    def has_solution(self) -> bool:
        return bool(self.solution_command)


def hash_paths(paths: list[Path], extra: bytes = b"") -> str:
    """sha256 over the relative names, modes and contents of every file under `paths`."""
    h = hashlib.sha256(extra)
    for root in paths:
        root = Path(root)
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink())
        for p in files:
            rel = p.name if p == root else p.relative_to(root).as_posix()
            h.update(rel.encode() + b"\0")
            if p.is_symlink():
                h.update(b"L" + str(p.readlink()).encode())
            else:
                h.update(oct(p.stat().st_mode & 0o777).encode() + b"\0")
                h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()
