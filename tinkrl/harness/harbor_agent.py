"""tinkrl's agent in Harbor: a Tinker checkpoint acting in tinkrl's action formats, its tokens recorded.

    harbor run -p tasks/hello-file --agent-import-path tinkrl.harness.harbor_agent:TinkrlAgent \\
      --ak checkpoint_path=tinker://RUN/sampler_weights/000061 --ak model_name=Qwen/Qwen3-8B

Agent kwargs (`--ak KEY=VALUE`): `model_name` (required: the checkpoint's base model; it picks the
renderer), `checkpoint_path` (a `tinker://` path; without it the base model is sampled),
`tinker_url` (default `$TINKER_BASE_URL`, else the hosted service; the key is `$TINKER_API_KEY`),
`action_format` (`shell`: one ```bash block per turn and `DONE`; or `tools`), `renderer`,
`tokenizer` (a directory, when the model's files are elsewhere), `temperature` (1.0), `max_turns`,
`max_tokens_per_turn` (512), `max_context_tokens` (8192), `command_timeout_s` (60). The action
format and turn cap default to those the checkpoint's training run recorded (else `shell`, 10).

Each action runs through Harbor's environment (`environment.exec`, one command per call from the
task's workdir; file tools read and write through Harbor's upload/download). Written to the trial's
agent directory: `tinkrl_trajectory.json` (every turn's prompt tokens, sampled tokens and logprobs,
the messages, how the episode ended); the same tokens go into Harbor's own
`AgentContext.rollout_details`, so they are in the trial's `result.json` too.
"""

from __future__ import annotations

import asyncio
import math
import shlex
import tempfile
from pathlib import Path
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

import tinkrl
from tinkrl.harness.policy import (
    harness_task,
    policy_from_kwargs,
    rollout_detail,
    run_episode,
    split_agent_kwargs,
    write_episode,
)
from tinkrl.rl.types import Trajectory
from tinkrl.sandbox.base import ExecResult, Sandbox, SandboxError

TRAJECTORY_FILE = "tinkrl_trajectory.json"


class HarborSandbox(Sandbox):
    """A Harbor environment seen as a tinkrl `Sandbox`, for tinkrl's tools (called from worker threads)."""

    def __init__(self, environment: BaseEnvironment, loop: asyncio.AbstractEventLoop, workdir: str):
        self.environment, self.loop, self.workdir = environment, loop, workdir

    def _wait(self, coro) -> Any:
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result()
        except (OSError, RuntimeError) as e:
            raise SandboxError(f"the Harbor environment failed: {type(e).__name__}: {e}") from None

    def exec(
        self,
        command: str,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run `command` through `environment.exec` from `workdir` (default: the task's)."""
        r = self._wait(
            self.environment.exec(
                command, cwd=workdir or self.workdir, env=env, timeout_sec=max(1, math.ceil(timeout)), user=user
            )
        )
        timed_out = r.return_code == 124
        return ExecResult(
            exit_code=-1 if timed_out else r.return_code,
            stdout=r.stdout or "",
            stderr=r.stderr or "",
            timed_out=timed_out,
        )

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Upload `data` to `path`."""
        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / "f"
            src.write_bytes(data.encode() if isinstance(data, str) else data)
            src.chmod(mode)
            self._wait(self.environment.upload_file(src, path))

    def read_file(self, path: str) -> bytes:
        """Download `path` (FileNotFoundError when it is not a file)."""
        if self._wait(self.environment.exec(f"test -f {shlex.quote(path)}", timeout_sec=30)).return_code != 0:
            raise FileNotFoundError(2, "No such file", path)
        with tempfile.TemporaryDirectory() as d:
            dst = Path(d) / "f"
            self._wait(self.environment.download_file(path, dst))
            return dst.read_bytes()

    def copy_in(self, src: Path, dest: str) -> None:
        """Upload a host file or directory."""
        src = Path(src)
        self._wait(self.environment.upload_dir(src, dest) if src.is_dir() else self.environment.upload_file(src, dest))

    def copy_out(self, src: str, dest: Path) -> None:
        """Download a directory's contents into `dest`."""
        self._wait(self.environment.download_dir(src, dest))

    def kill_all(self) -> None:
        """Nothing: Harbor stops the environment's processes itself before verifying."""

    def close(self) -> None:
        """Nothing: Harbor owns the environment and stops it."""


class TinkrlAgent(BaseAgent):
    """A Tinker checkpoint (or base model) as a Harbor agent, through tinkrl's renderers and action formats."""

    def __init__(self, logs_dir: Path, model_name: str | None = None, *args: Any, **kwargs: Any):
        ours, harbors = split_agent_kwargs(kwargs)
        super().__init__(logs_dir, model_name, *args, **harbors)
        if not model_name:
            raise ValueError("TinkrlAgent needs model_name (--ak model_name=... or -m): the checkpoint's base model")
        self.policy, self.limits = policy_from_kwargs(model_name, **ours)

    @staticmethod
    def name() -> str:
        """The agent's name in Harbor's records."""
        return "tinkrl"

    def version(self) -> str:
        """tinkrl's version."""
        return tinkrl.__version__

    async def setup(self, environment: BaseEnvironment) -> None:
        """Connect to the Tinker service (nothing is installed in the environment: the policy runs here)."""
        await asyncio.to_thread(self.policy.client)

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        """Play the task; write the token trajectory and fill Harbor's context (tokens, rollout details)."""
        workdir = (await environment.exec("pwd")).stdout or "/app"
        workdir = workdir.strip().splitlines()[-1] if workdir.strip() else "/app"
        task = harness_task(environment.environment_name, instruction, workdir)
        sandbox = HarborSandbox(environment, asyncio.get_running_loop(), workdir)
        traj = Trajectory([])
        try:
            async with self.policy:  # the episode's outcome ends the Tinker session (a timeout: interrupted)
                await run_episode(self.policy, sandbox, task, self.limits, traj)
        finally:  # also when Harbor stops the agent at its time limit: the turns so far are kept
            self._record(traj, context)

    def _record(self, traj: Trajectory, context: AgentContext) -> None:
        """Write the trajectory to the agent dir and fill Harbor's context from it."""
        record = write_episode(self.logs_dir / TRAJECTORY_FILE, self.policy, traj)
        context.n_input_tokens = sum(len(t["prompt_tokens"]) for t in record["turns"])
        context.n_output_tokens = sum(len(t["sampled_tokens"]) for t in record["turns"])
        context.rollout_details = [rollout_detail(record)]
        context.metadata = {
            "end_reason": record["end_reason"] or "stopped by the harness",
            "turns": len(record["turns"]),
            "renderer": record["renderer"],
            "action_format": record["action_format"],
            "checkpoint_path": record["checkpoint_path"],
            "trajectory_file": TRAJECTORY_FILE,
            **record["metrics"],
        }
