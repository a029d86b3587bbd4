"""The agent-task episode on chat messages: sandbox, tool calls, limits, grading, metrics.

`TaskSession` is one attempt at one task, a `MessageSession` (`tinkrl.agents.episode`). It exists
once and has three drivers: the token-level bridge (`SessionEnv`, in training, in `tinkrl eval`
with a sampling client and in the Harbor / terminal-bench agent), the OpenAI-endpoint evaluator
(`tinkrl eval --base-url`, fed chat messages) and the ORS task server (`tinkrl serve env tasks`,
one session per ORS session).

What the policy causes shapes or ends the episode and is trained on: a malformed tool call
becomes an error observation, a command that hangs a timeout observation; `submit`, the turn,
token or time limit end the episode and it is graded, and so does a command that fails the same
way twice (the same command, the same output: `end_on_repeated_failure`), since repeating it
only repeats the error; overflowing the context ends it with reward 0. Only infrastructure
failures (the sandbox died, a task cannot be built or graded) raise `InfraFailure`, so the
rollout leaves the episode out of its group.

The session reads its limits from `EpisodeLimits` (the tasks and shell envs' configs are ones)
and its sandbox provider from any object with `get()`.
"""

from __future__ import annotations

import asyncio
import json
import math
import shlex
import time
from typing import Any, Protocol

from tinkrl.agents.episode import Message, Reply
from tinkrl.agents.limits import EpisodeLimits
from tinkrl.agents.shell_actions import NO_COMMAND, SHELL_SYSTEM_PROMPT, observation_message
from tinkrl.agents.tools import TOOL_NAMES, TOOL_SCHEMAS, clip, run_tool
from tinkrl.errors import InfraFailure
from tinkrl.rl.types import Metrics
from tinkrl.sandbox.base import Sandbox, SandboxError, SandboxProvider
from tinkrl.taskdirs import Task, TaskLoadError, grade, start_sandbox

DEFAULT_SYSTEM_PROMPT = (
    "You are an autonomous agent in a Linux sandbox (bash, python3 and git; no network). Your working "
    "directory is {workdir}. Solve the user's task by calling the tools: one or a few calls per turn, then "
    "read their results before you continue. When the task is done, call submit. You have at most "
    "{max_turns} turns."
)
NO_TOOL_CALL = (
    "You did not call a tool. Call one of the tools ({tools}) in the format given in the system "
    "prompt, or call submit when the task is done."
)
TRUNCATED = (
    "Your response was cut off at the token limit before it finished a tool call. Write shorter "
    "responses and put the tool call first."
)
TIMEOUT_MARKER = "[the command timed out after"  # execute_bash's timeout observation
REPO_FORMATS = ("swebench", "r2e")  # tasks whose workspace diff is a SWE-bench `model_patch`
END_REASONS = ("submit", "max_turns", "max_tokens", "time_limit", "repeated_failure", "context_overflow")
EXIT_OK = "[exit code: 0]"  # how execute_bash's observation of a command that succeeded ends


class SandboxSource(Protocol):
    """Where a session gets its sandbox provider (shared by all episodes, made on first use)."""

    def get(self) -> SandboxProvider: ...


def call_arguments(call: dict) -> tuple[str, Any]:
    """A tool call's name and arguments: a dict where they are one or JSON text of one, else as given (so
    that `run_tool` answers bad arguments with its own error)."""
    fn = call.get("function", {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            parsed = None
        args = parsed if isinstance(parsed, dict) else args
    return fn.get("name", ""), args


def bash_command(call: dict) -> str | None:
    """The command of an execute_bash call, else None."""
    name, args = call_arguments(call)
    command = args.get("command") if name == "execute_bash" and isinstance(args, dict) else None
    return command if isinstance(command, str) else None


class TaskSession:
    """One attempt at one task: its sandbox, the transcript, the limits, and the grade.

    `start()` builds the sandbox and returns the first messages; `act(reply)` runs one assistant
    turn's tool calls and returns the observation messages and whether the episode ended;
    `finish()` grades (or scores 0 after a context overflow); `close()` destroys the sandbox.
    """

    def __init__(self, task: Task, cfg: EpisodeLimits, provider: SandboxSource, capture_patch: bool = False):
        self.task, self.cfg, self.provider = task, cfg, provider
        self.capture_patch = capture_patch and task.format in REPO_FORMATS
        self.sandbox: Sandbox | None = None
        self.messages: list[Message] = []  # the transcript (OpenAI-style messages)
        self.turns = self.tool_calls = self.malformed_calls = self.no_tool_calls = 0
        self.truncated_turns = self.command_timeouts = self.sampled_tokens = 0
        self.end_reason: str | None = None
        self.reward: float | None = None
        self.grade_detail = ""
        self.patch: str | None = None  # git diff of the workspace (repo tasks, when captured)
        self._base_commit = ""
        self._started = math.inf
        self._sandbox_s = 0.0  # time spent running tool calls
        self._failures: set[tuple[str, str]] = set()  # (command, observation) of each failed command
        self._repeated = False  # a command failed as it had failed before
        self._closed = False

    @property
    def timeout_s(self) -> float:
        return self.cfg.episode_timeout_s or self.task.agent_timeout_s

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    @property
    def label(self) -> str:
        return f"task {self.task.id}"

    @property
    def action_format(self) -> str:
        return self.cfg.action_format

    @property
    def max_context_tokens(self) -> int:
        return self.cfg.max_context_tokens

    @property
    def shell(self) -> bool:
        """Whether the episode speaks the shell action format (bash blocks) rather than tool calls."""
        return self.cfg.action_format == "shell"

    @property
    def tools(self) -> list[dict] | None:
        """The tool schemas the prompt lists (None in the shell format, which has no tool list)."""
        return None if self.shell else TOOL_SCHEMAS

    def first_messages(self) -> list[Message]:
        default = SHELL_SYSTEM_PROMPT if self.shell else DEFAULT_SYSTEM_PROMPT
        template = self.cfg.system_prompt if self.cfg.system_prompt is not None else default
        system = template.replace("{workdir}", self.task.workdir).replace("{max_turns}", str(self.cfg.max_turns))
        return [{"role": "system", "content": system}, {"role": "user", "content": self.task.instruction}]

    async def start(self) -> list[Message]:
        try:
            provider = await asyncio.to_thread(self.provider.get)
            self.sandbox = await asyncio.to_thread(start_sandbox, self.task, provider)
        except SandboxError:
            raise
        except (TaskLoadError, OSError) as e:
            raise InfraFailure(
                f"task {self.task.id}: the workspace could not be built: {e}", "task_build_error"
            ) from None
        if self.capture_patch:
            r = await asyncio.to_thread(self.sandbox.exec, "git rev-parse HEAD", timeout=30, workdir=self.task.workdir)
            self._base_commit = r.stdout.strip() if r.exit_code == 0 else ""
        self._started = time.monotonic()
        self.messages = self.first_messages()
        return list(self.messages)

    def elapsed_s(self) -> float:
        """Time counted against the episode's limit."""
        if self.cfg.timeout_includes_sampling:
            return max(0.0, time.monotonic() - self._started)
        return self._sandbox_s

    def _command_timeout(self, requested: Any) -> float:
        ceiling = self.cfg.command_timeout_s
        if isinstance(requested, (int, float)) and not isinstance(requested, bool) and requested > 0:
            ceiling = min(ceiling, float(requested))
        left = self.timeout_s - self.elapsed_s()
        return max(1.0, min(ceiling, left))

    async def _run_call(self, call: dict) -> tuple[str, bool]:
        name, arguments = call_arguments(call)
        if name == "execute_bash" and isinstance(arguments, dict):  # the episode's ceiling, whatever was asked
            arguments = {**arguments, "timeout": self._command_timeout(arguments.get("timeout"))}
        assert self.sandbox is not None
        t0 = time.monotonic()
        try:
            obs, done = await asyncio.to_thread(run_tool, self.sandbox, name, arguments)
        finally:
            self._sandbox_s += time.monotonic() - t0
        if name == "execute_bash" and TIMEOUT_MARKER in obs:
            self.command_timeouts += 1
        return clip(obs, self.cfg.max_observation_chars), done

    async def act(self, reply: Reply) -> tuple[list[Message], bool]:
        """Run one assistant turn: its transcript message goes into the transcript as given, its calls run.
        Returns the observation messages (tool results, then errors and notes as user turns; in the shell
        format the command's output is a user turn) and whether the episode ended."""
        if self.sandbox is None or self.done:
            raise RuntimeError("TaskSession.act before start() or after the episode ended")
        calls, errors, truncated = reply.calls, reply.errors, reply.truncated
        self.turns += 1
        self.sampled_tokens += reply.sampled_tokens
        self.truncated_turns += int(truncated)
        self.messages.append(reply.transcript)
        observations: list[Message] = []
        submitted = False
        for call in calls:
            self.tool_calls += 1
            obs, submitted = await self._run_call(call)
            self._note_failure(bash_command(call), obs)
            if self.shell:
                if not submitted:
                    observations.append(observation_message(obs))
            else:
                observations.append(
                    {"role": "tool", "tool_call_id": call.get("id"), "name": call["function"]["name"], "content": obs}
                )
            if submitted:  # nothing after submit is run
                break
        no_call = not calls and (not errors or errors == [NO_COMMAND])
        self.malformed_calls += 0 if no_call else len(errors)
        lines = [f"Error: {e}" for e in errors] + list(reply.notes)
        if no_call:
            self.no_tool_calls += 1
            if not self.shell:
                lines.append(TRUNCATED if truncated else NO_TOOL_CALL.format(tools=", ".join(TOOL_NAMES)))
        if lines and self.shell and observations:  # one user turn: the output, then the notes
            observations[-1]["content"] += "\n" + "\n".join(lines)
        elif lines:
            observations.append({"role": "user", "content": "\n".join(lines)})
        self.messages.extend(observations)
        if submitted:
            self.end_reason = "submit"
        elif self._repeated:
            self.end_reason = "repeated_failure"
        elif self.turns >= self.cfg.max_turns:
            self.end_reason = "max_turns"
        elif self.cfg.max_total_tokens is not None and self.sampled_tokens >= self.cfg.max_total_tokens:
            self.end_reason = "max_tokens"
        elif self.elapsed_s() >= self.timeout_s:
            self.end_reason = "time_limit"
        return observations, self.done

    def _note_failure(self, command: str | None, observation: str) -> None:
        """Remember a command that failed; the second time one fails with the same output, the episode is
        to end (with `end_on_repeated_failure`)."""
        if command is None or observation.rstrip().endswith(EXIT_OK):
            return
        failure = (command.strip(), observation)
        if failure in self._failures and self.cfg.end_on_repeated_failure:
            self._repeated = True
        self._failures.add(failure)

    def overflow(self) -> None:
        """The next observation does not fit the context: the episode ends, scored 0."""
        self.end_reason = "context_overflow"

    async def _git_patch(self) -> str:
        assert self.sandbox is not None
        base = shlex.quote(self._base_commit or "HEAD")
        script = (
            'idx=$(mktemp) && trap \'rm -f "$idx"\' EXIT && { cp .git/index "$idx" 2>/dev/null || true; } && '
            f'GIT_INDEX_FILE="$idx" git add -A && GIT_INDEX_FILE="$idx" git diff --cached {base}'
        )
        r = await asyncio.to_thread(self.sandbox.exec, script, timeout=60, workdir=self.task.workdir)
        return r.stdout if r.exit_code == 0 else ""

    async def finish(self) -> float:
        """Grade the sandbox (reward 0 after a context overflow, without running the tests)."""
        if self.end_reason is None:
            raise RuntimeError("TaskSession.finish before the episode ended")
        if self.reward is not None:
            return self.reward
        assert self.sandbox is not None
        if self.capture_patch:
            self.patch = await self._git_patch()
        if self.end_reason == "context_overflow":
            self.reward, self.grade_detail = 0.0, "context overflow: not graded, scored 0"
            return self.reward
        try:
            result = await asyncio.to_thread(grade, self.task, self.sandbox)
        except SandboxError:
            raise
        except (TaskLoadError, OSError) as e:
            raise InfraFailure(f"task {self.task.id}: grading failed: {e}", "grade_error") from None
        self.reward, self.grade_detail = float(result.reward), result.detail
        return self.reward

    def metrics(self) -> Metrics:
        m: Metrics = {
            "tasks/turns": float(self.turns),
            "tasks/tool_calls": float(self.tool_calls),
            "tasks/malformed_calls": float(self.malformed_calls),
            "tasks/no_tool_call_turns": float(self.no_tool_calls),
            "tasks/truncated_turns": float(self.truncated_turns),
            "tasks/command_timeouts": float(self.command_timeouts),
            "tasks/sampled_tokens": float(self.sampled_tokens),
        }
        if self.reward is not None:
            m["tasks/reward"] = self.reward
            m["tasks/resolved"] = float(self.reward >= 1.0)
        for reason in END_REASONS:
            m[f"tasks/end/{reason}"] = float(self.end_reason == reason)
        return m

    def logs(self) -> dict[str, Any]:
        """What the run's episode log keeps of the ended episode: the task, how it ended, the grade, the transcript."""
        return {
            "tasks/task": self.task.id,
            "tasks/end": self.end_reason or "",
            "tasks/grade": self.grade_detail[:500],
            "tasks/transcript": self.messages,
        }

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.sandbox is not None:
            await asyncio.to_thread(self.sandbox.close)
