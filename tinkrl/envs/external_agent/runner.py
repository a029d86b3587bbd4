"""Run black-box agents per rollout through the OpenAI-compatible server and get Trajectories back.

An external agent knows only an OpenAI base URL. Each rollout gets its own,
`<server>/rollouts/<rollout_id>/v1`, so everything the agent samples is captured under that
rollout without the agent's cooperation. When the agent is done, a grader gives the reward,
and the captured calls become a `Trajectory` (see `capture.captured_to_trajectory`) that the
trainer turns into datums like any other.

Agents:
- a Python callable `agent(session: AgentSession)` (sync callables run on a worker thread,
  so a blocking `openai.OpenAI` client is fine), or
- a `CommandAgent`: a process started with `OPENAI_BASE_URL`, `OPENAI_API_KEY`,
  `OPENAI_MODEL`, `TINKRL_ROLLOUT_ID`, `TINKRL_INSTRUCTION`, `TINKRL_SANDBOX_URL`,
  `TINKRL_WORKDIR` and `TINKRL_LOG_DIR` in its environment, and the same values as
  `{base_url}`, `{api_key}`, `{model}`, `{rollout_id}`, `{instruction}`, `{sandbox_url}`,
  `{workdir}`, `{log_dir}` substituted in argv. Its stdout and stderr go to
  `<log_dir>/agent.log` when the rollout has a log directory.

A rollout on a task has a sandbox; a process agent acts on it (not on the host) through
`POST <sandbox_url>/exec` `{"command", "timeout", "workdir"}` with the API key as a bearer
token (see `ProxyServer.sandbox_exec`); the sandbox is reachable only while the rollout runs.

What counts as whose fault: the agent running past its time limit is the policy's doing
(the episode is graded as it stands); a sandbox dying is infrastructure
(`InfraFailure`, recorded as the trajectory's `failure_mode`); an agent that crashes or
exits non-zero is recorded as `failure_mode="agent_error"` (excluded from its group, never
scored 0), as is an agent that never called the model (`"no_model_calls"`: no tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinkrl.errors import InfraFailure
from tinkrl.proxy.capture import MergeStats, captured_to_trajectory
from tinkrl.proxy.server import ProxyServer
from tinkrl.rl.types import Trajectory, TrajectoryGroup

log = logging.getLogger("tinkrl.envs.external_agent.runner")


@dataclass
class AgentSession:
    """What an external agent gets for one rollout."""

    base_url: str  # OpenAI base URL (ends in /v1) that captures into this rollout
    api_key: str
    model: str
    rollout_id: str
    instruction: str = ""
    sandbox: Any = None  # the task's sandbox, for in-process agents that act on it
    context: dict[str, Any] = field(default_factory=dict)
    sandbox_url: str = ""  # POST <sandbox_url>/exec runs a command in `sandbox` (process agents)
    workdir: str = ""  # the task's working directory inside the sandbox
    log_dir: Path | None = None  # where the agent's own logs of this rollout are kept

    def values(self) -> dict[str, str]:
        """What a command template may name: {base_url} {api_key} {model} {rollout_id} {instruction}
        {sandbox_url} {workdir} {log_dir}."""
        return {
            "base_url": self.base_url,
            "api_key": self.api_key,
            "model": self.model,
            "rollout_id": self.rollout_id,
            "instruction": self.instruction,
            "sandbox_url": self.sandbox_url,
            "workdir": self.workdir,
            "log_dir": str(self.log_dir or ""),
        }


@dataclass
class CommandAgent:
    """An agent run as a process; argv entries and `env` values may contain the placeholders of
    `AgentSession.values` ({base_url} {api_key} {model} {rollout_id} {instruction} {sandbox_url}
    {workdir} {log_dir})."""

    argv: Sequence[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None

    @staticmethod
    def _substitute(arg: str, values: dict[str, str]) -> str:
        # Plain replacement, not str.format: argv may hold code or JSON with braces of its own.
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        return arg

    def environment(self, session: AgentSession) -> dict[str, str]:
        """The process's environment: ours, `env` (placeholders filled), and the rollout's variables."""
        values = session.values()
        return {
            **os.environ,
            **{k: self._substitute(v, values) for k, v in self.env.items()},
            "OPENAI_BASE_URL": session.base_url,
            "OPENAI_API_BASE": session.base_url,
            "OPENAI_API_KEY": session.api_key,
            "OPENAI_MODEL": session.model,
            "TINKRL_ROLLOUT_ID": session.rollout_id,
            "TINKRL_INSTRUCTION": session.instruction,
            "TINKRL_SANDBOX_URL": session.sandbox_url,
            "TINKRL_WORKDIR": session.workdir,
            "TINKRL_LOG_DIR": values["log_dir"],
        }

    async def __call__(self, session: AgentSession) -> None:
        values = session.values()
        argv = [self._substitute(a, values) for a in self.argv]
        log_path = session.log_dir / "agent.log" if session.log_dir is not None else None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") if log_path is not None else contextlib.nullcontext() as log_file:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    env=self.environment(session),
                    cwd=self.cwd,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_file or asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,  # its own process group: a time limit stops its children too
                )
            except OSError as e:
                raise AgentError(f"cannot start agent command {argv[0]!r}: {e}") from None
            try:
                out, _ = await proc.communicate()
            except asyncio.CancelledError:  # the time limit: stop the process, then let the caller grade
                _kill_group(proc.pid)
                await proc.wait()
                raise
            finally:  # what it left running in the background must not outlive the rollout
                _kill_group(proc.pid)
        if proc.returncode != 0:
            text = log_path.read_bytes()[-4000:] if log_path is not None else out or b""
            tail = text.decode(errors="replace").strip()[-500:]
            raise AgentError(f"agent command {argv[0]} exited {proc.returncode}: {tail}")


def _kill_group(pid: int) -> None:
    """SIGKILL a process group started with start_new_session (gone already: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class AgentError(Exception):
    """The agent program itself failed (not the policy, not the infrastructure)."""


Agent = CommandAgent | Callable[[AgentSession], None | Awaitable[None]]


@dataclass
class ExternalRollout:
    """One external agent's rollout: the trajectory from its captured calls, merge statistics and reward."""

    trajectory: Trajectory
    stats: MergeStats
    reward: float
    rollout_id: str
    timed_out: bool = False
    grade_detail: str = ""


class ExternalAgentRunner:
    """Runs agents against `server` (reachable at `base_url`, without /v1) and collects their tokens."""

    def __init__(self, server: ProxyServer, base_url: str, api_key: str | None = None):
        self.server = server
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key or server.api_key or "EMPTY"

    def session(self, rollout_id: str | None = None, **kwargs: Any) -> AgentSession:
        rid = rollout_id or uuid.uuid4().hex
        if kwargs.get("sandbox") is not None:
            kwargs.setdefault("sandbox_url", f"{self.base_url}/rollouts/{rid}/sandbox")
        return AgentSession(
            f"{self.base_url}/rollouts/{rid}/v1", self.api_key, self.server.served_model_name, rid, **kwargs
        )

    async def _run_agent(self, agent: Agent, session: AgentSession, timeout_s: float | None) -> bool:
        """Run the agent to completion or its time limit; True when it was stopped at the limit."""
        if inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(getattr(agent, "__call__", None)):  # noqa: B004 - an async __call__
            work = agent(session)
        else:
            work = asyncio.to_thread(agent, session)
        try:
            await asyncio.wait_for(work, timeout_s)
            return False
        except TimeoutError:
            # A thread cannot be stopped: calls it still makes land in a rollout nobody reads any more.
            return True

    async def run(
        self,
        agent: Agent,
        grader: Callable[[], float | Awaitable[float]],
        *,
        timeout_s: float | None = None,
        rollout_id: str | None = None,
        instruction: str = "",
        sandbox: Any = None,
        context: dict[str, Any] | None = None,
        workdir: str = "",
        log_dir: Path | None = None,
    ) -> ExternalRollout:
        """One rollout: run the agent, grade, and build its trajectory from the captured calls.
        With a `sandbox`, the agent may act on it through the server while it runs (`sandbox_url`);
        `log_dir` keeps the agent's own logs."""
        session = self.session(
            rollout_id,
            instruction=instruction,
            sandbox=sandbox,
            context=context or {},
            workdir=workdir,
            log_dir=log_dir,
        )
        failure: tuple[str, str] | None = None
        timed_out = False
        if sandbox is not None:
            self.server.sandboxes[session.rollout_id] = sandbox
        try:
            timed_out = await self._run_agent(agent, session, timeout_s)
        except InfraFailure as e:
            failure = (e.failure_mode, str(e))
        except Exception as e:
            failure = ("agent_error", f"{type(e).__name__}: {e}")
        finally:
            self.server.sandboxes.pop(session.rollout_id, None)
        broken = self.server.sandbox_failures.pop(session.rollout_id, None)
        if broken is not None:  # the sandbox died under the agent: infrastructure, whatever the agent did
            failure = (broken.failure_mode, str(broken))
        reward, detail = 0.0, ""
        if failure is None:
            try:
                value = grader()
                reward = float(await value if inspect.isawaitable(value) else value)
            except InfraFailure as e:
                failure = (e.failure_mode, str(e))
        calls = self.server.capture.pop(session.rollout_id)
        trajectory, stats = captured_to_trajectory(calls, reward)
        if failure is None and not calls:
            failure = ("no_model_calls", "the agent finished without calling the model")
        if failure is not None:
            trajectory.failure_mode, trajectory.failure_detail = failure
            log.warning("rollout %s failed (%s): %s", session.rollout_id, *failure)
        return ExternalRollout(trajectory, stats, reward, session.rollout_id, timed_out, detail)

    async def run_task(
        self,
        agent: Agent,
        task: Any,
        provider: Any,
        *,
        timeout_s: float | None = None,
        log_root: Path | None = None,
    ) -> ExternalRollout:
        """One rollout on a tinkrl task: fresh sandbox, the agent acts on it, the task's grader scores it.
        The agent's logs go to `<log_root>/<rollout_id>/` when `log_root` is given."""
        from tinkrl.taskdirs.verifier import grade, start_sandbox

        try:
            sandbox = await asyncio.to_thread(start_sandbox, task, provider)
        except InfraFailure as e:
            traj = Trajectory(transitions=[], failure_mode=e.failure_mode, failure_detail=str(e))
            return ExternalRollout(traj, MergeStats(), 0.0, "")
        rid = uuid.uuid4().hex
        details: list[str] = []

        async def grader() -> float:
            result = await asyncio.to_thread(grade, task, sandbox)
            details.append(result.detail)
            return result.reward

        try:
            rollout = await self.run(
                agent,
                grader,
                timeout_s=timeout_s or task.agent_timeout_s,
                instruction=task.instruction,
                sandbox=sandbox,
                context={"task": task},
                rollout_id=rid,
                workdir=task.workdir,
                log_dir=log_root / rid if log_root is not None else None,
            )
        finally:
            await asyncio.to_thread(sandbox.close)
        rollout.grade_detail = details[0] if details else ""
        return rollout

    async def run_task_group(
        self,
        agent: Agent,
        task: Any,
        provider: Any,
        group_size: int,
        *,
        timeout_s: float | None = None,
        log_root: Path | None = None,
    ) -> tuple[TrajectoryGroup, MergeStats]:
        """`group_size` concurrent rollouts of one task: a GRPO group, failures kept apart."""
        rollouts = await asyncio.gather(
            *(self.run_task(agent, task, provider, timeout_s=timeout_s, log_root=log_root) for _ in range(group_size))
        )
        kept = [r for r in rollouts if r.trajectory.failure_mode is None]
        stats = sum((r.stats for r in rollouts), MergeStats())
        group = TrajectoryGroup(
            trajectories_G=[r.trajectory for r in kept],
            final_rewards_G=[0.0] * len(kept),
            metrics_G=[{**r.stats.to_metrics(), "timed_out": float(r.timed_out)} for r in kept],
            tags=[getattr(task, "id", "task")],
            failures=[r.trajectory for r in rollouts if r.trajectory.failure_mode is not None],
        )
        return group, stats
