"""tinkrl's agent in terminal-bench 1.x: `tb run --agent-import-path tinkrl.harness.terminal_bench:TinkrlTbAgent`.

    tb run --agent-import-path tinkrl.harness.terminal_bench:TinkrlTbAgent \\
      --agent-kwarg checkpoint_path=tinker://RUN/sampler_weights/000061 --agent-kwarg model_name=Qwen/Qwen3-8B \\
      --dataset terminal-bench-core==0.1.1 --task-id hello-world

The kwargs are the Harbor agent's (`tinkrl.harness.harbor_agent`). terminal-bench hands the agent
a tmux session in the task's docker-compose container; the agent runs each action in that container
(`docker exec` through the session's container, with its exit code and output) and writes
`tinkrl_trajectory.json` (tokens and logprobs per turn) into the trial's logging directory.
"""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path
from typing import Any

from terminal_bench.agents.base_agent import AgentResult, BaseAgent
from terminal_bench.agents.failure_mode import FailureMode
from terminal_bench.terminal.tmux_session import TmuxSession

from tinkrl.harness.harbor_agent import TRAJECTORY_FILE
from tinkrl.harness.policy import harness_task, policy_from_kwargs, run_episode, split_agent_kwargs, write_episode
from tinkrl.sandbox.base import ExecResult, Sandbox, SandboxError
from tinkrl.sandbox.files import first_file_in_tar, safe_extract, tar_file_bytes, tar_host_path


class ContainerSandbox(Sandbox):
    """The container behind a terminal-bench tmux session (a docker SDK `Container`) as a tinkrl `Sandbox`."""

    def __init__(self, container: Any, workdir: str, user: str = ""):
        self.container, self.workdir, self.user = container, workdir, user

    def exec(
        self,
        command: str,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """`timeout T bash -lc COMMAND` in the container; exit code 124 means it timed out."""
        argv = ["timeout", "-k", "5", str(max(1, int(timeout))), "bash", "-lc", command]
        try:
            r = self.container.exec_run(
                argv, workdir=workdir or self.workdir, environment=env or None, user=user or self.user, demux=True
            )
        except Exception as e:  # the docker daemon or container went away
            raise SandboxError(f"the terminal-bench container failed: {type(e).__name__}: {e}") from None
        out, err = r.output if isinstance(r.output, tuple) else (r.output, b"")
        timed_out = r.exit_code == 124
        return ExecResult(
            exit_code=-1 if timed_out else int(r.exit_code),
            stdout=(out or b"").decode("utf-8", "replace"),
            stderr=(err or b"").decode("utf-8", "replace"),
            timed_out=timed_out,
        )

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Write `data` at `path` (through `put_archive`)."""
        raw = data.encode() if isinstance(data, str) else data
        self.exec(f"mkdir -p {shlex.quote(str(Path(path).parent))}")
        self.container.put_archive(str(Path(path).parent), tar_file_bytes(Path(path).name, raw, mode))

    def read_file(self, path: str) -> bytes:
        """The file at `path` (FileNotFoundError when absent)."""
        if self.exec(f"test -f {shlex.quote(path)}").exit_code != 0:
            raise FileNotFoundError(2, "No such file", path)
        stream, _ = self.container.get_archive(path)
        return first_file_in_tar(b"".join(stream), path)

    def copy_in(self, src: Path, dest: str) -> None:
        """Copy a host directory's contents into `dest`."""
        self.exec(f"mkdir -p {shlex.quote(dest)}")
        self.container.put_archive(dest, tar_host_path(Path(src), "."))

    def copy_out(self, src: str, dest: Path) -> None:
        """Copy a container directory to the host (regular files and directories only)."""
        stream, _ = self.container.get_archive(src)
        safe_extract(b"".join(stream), Path(dest))

    def kill_all(self) -> None:
        """Nothing: terminal-bench stops the container's processes itself."""

    def close(self) -> None:
        """Nothing: terminal-bench owns the container."""


class TinkrlTbAgent(BaseAgent):
    """A Tinker checkpoint (or base model) as a terminal-bench agent, through tinkrl's renderers and action formats."""

    def __init__(self, model_name: str | None = None, **kwargs: Any):
        ours, tbs = split_agent_kwargs(kwargs)
        super().__init__(**tbs)
        if not model_name:
            raise ValueError("TinkrlTbAgent needs --agent-kwarg model_name=... (the checkpoint's base model)")
        self.policy, self.limits = policy_from_kwargs(model_name, **ours)

    @staticmethod
    def name() -> str:
        """The agent's name in terminal-bench's records."""
        return "tinkrl"

    def perform_task(self, instruction: str, session: TmuxSession, logging_dir: Path | None = None) -> AgentResult:
        """Play the task in the session's container; the token trajectory goes to `logging_dir`."""
        sandbox = ContainerSandbox(session.container, "/", getattr(session, "_user", ""))
        pwd = sandbox.exec("pwd")
        sandbox.workdir = pwd.stdout.strip() or "/app"
        task = harness_task("terminal-bench", self._render_instruction(instruction), sandbox.workdir)
        try:
            with self.policy:  # the episode's outcome ends the Tinker session
                traj = asyncio.run(run_episode(self.policy, sandbox, task, self.limits))
        except SandboxError:
            return AgentResult(failure_mode=FailureMode.UNKNOWN_AGENT_ERROR)
        if logging_dir is not None:
            write_episode(Path(logging_dir) / TRAJECTORY_FILE, self.policy, traj)
        return AgentResult(
            total_input_tokens=sum(t.ob.length for t in traj.transitions),
            total_output_tokens=sum(len(t.ac_tokens) for t in traj.transitions),
            failure_mode=FailureMode.NONE,
        )
