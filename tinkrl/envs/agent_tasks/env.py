"""The agent-task environment: a multi-turn tool-using agent in a sandbox, graded by the task's tests.

`env=tasks env.path=tasks` trains on task directories (Harbor, terminal-bench) and row files
(R2E-Gym, SWE-bench) loaded by `tinkrl.taskdirs`. One episode: a fresh sandbox with the task's
workspace; a system prompt listing the tools (`tinkrl.agents.tools`) and the instruction as
the user turn; each turn the policy's action is parsed for tool calls, which run in the
sandbox, and their results are appended as the next turn. The task's tests grade the
sandbox at the end.

Two layers, so the loop exists once:
- `TaskSession` (`tinkrl.agents.session`) works on chat messages: sandbox, tool calls, limits,
  grading, metrics. The OpenAI-endpoint evaluator (`tinkrl eval --base-url`) and the ORS task
  server drive it directly.
- `TaskEnv` is the token-in/token-out `Env` over a session: it parses sampled tokens with the
  renderer (each family's own tool-call format; a malformed call comes back as an error
  observation) and gets the next prompt from `renderer.next_prompt`: the previous prompt + action,
  token for token, with the rendered results, where the family keeps its past turns as sampled;
  the family's own rendering of the conversation where it rewrites them (past thinking dropped),
  so the episode trains as several datums, each on tokens the sampler saw.

What the policy causes shapes or ends the episode and is trained on (see the session); only
infrastructure failures raise `InfraFailure`, so the rollout leaves the episode out of its group.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import tinker

from tinkrl.agents.session import MIN_ACTION_TOKENS, TaskSession
from tinkrl.envs.agent_tasks.config import TasksEnvConfig, select_tasks
from tinkrl.errors import ConfigError, InfraFailure
from tinkrl.progress import progress_bar
from tinkrl.rl.types import Action, Env, EnvDatasets, EnvGroupBuilder, RLDataset, StepResult, StopCondition
from tinkrl.sandbox import LazyProvider
from tinkrl.sandbox.base import SandboxProvider
from tinkrl.taskdirs import Task, run_gate

if TYPE_CHECKING:
    from tinkrl.envs import EnvContext

log = logging.getLogger(__name__)


def gated(tasks: list[Task], provider: SandboxProvider) -> list[Task]:
    """The tasks that pass the gate (`run_gate`); the others are logged and left out."""
    keep = []
    with progress_bar(len(tasks), "gate", unit="task") as bar:
        for task in tasks:
            res = run_gate(task, provider)
            if res.ok:
                keep.append(task)
            else:
                log.warning("task %s failed the gate and is not trained on: %s", task.id, res.detail)
            bar.update(1)
    return keep


def renderer_for(renderer, tool_format: str, key: str):
    """The run's renderer, or a copy of it speaking `tool_format`; a ConfigError in one line when it cannot
    (a tml-renderers family speaks only its own format), raised before any task loads or sandbox starts."""
    if renderer.tool_format == tool_format:
        return renderer
    try:
        return renderer.with_tool_format(tool_format)
    except ValueError as e:
        raise ConfigError(f"environments.{key}: {e}") from None


# ---------------------------------------------------------------------------------------------
# The token-in/token-out Env


class TaskEnv(Env):
    """A `TaskSession` driven by sampled tokens; each observation is the renderer's `next_prompt`."""

    def __init__(self, session: TaskSession, renderer, max_tokens_per_turn: int | None = None):
        self.session = session
        self.renderer = renderer
        self.max_tokens_per_turn = max_tokens_per_turn
        self.tokens: list[int] = []  # the current prompt
        self.history: list[dict] = []  # the conversation it renders: replies as parsed, observations
        self._stop: StopCondition = renderer.stop_sequences()

    @property
    def max_context_tokens(self) -> int:
        return self.session.cfg.max_context_tokens

    async def initial_observation(self) -> tuple[tinker.ModelInput, StopCondition]:
        messages = await self.session.start()
        self.history = list(messages)
        self.tokens = self.renderer.build_generation_prompt(messages, self.session.tools).to_ints()
        if len(self.tokens) + MIN_ACTION_TOKENS > self.max_context_tokens:
            raise InfraFailure(
                f"task {self.session.task.id}: the first prompt ({len(self.tokens)} tokens) does not "
                f"fit max_context_tokens={self.max_context_tokens}",
                "context_too_small",
            )
        return tinker.ModelInput.from_ints(self.tokens), self._stop

    def max_tokens(self, default: int) -> int:
        room = self.max_context_tokens - len(self.tokens)
        return max(1, min(self.max_tokens_per_turn or default, room))

    async def step(self, action: Action, *, stop_reason: str = "stop") -> StepResult:
        action = list(action)
        parsed = self.renderer.parse_response(action, self.session.tools)
        ended = parsed.ended_cleanly
        if self.session.shell:
            text, _ = self.renderer.reply_text(action)
            _, visible = self.renderer.split_reasoning(text)
            reply = {k: v for k, v in parsed.message.items() if k != "tool_calls"}
            observations, done = await self.session.act_text(text, not ended, len(action), visible)
        else:
            reply = parsed.message
            raw = self.renderer.tokenizer.decode(action[:-1] if ended else action, skip_special_tokens=False)
            calls = parsed.message.get("tool_calls", [])
            observations, done = await self.session.act(
                {"role": "assistant", "content": raw}, calls, parsed.tool_call_errors, not ended, len(action)
            )
        if not done:
            self.history += [reply]
            nxt = self.renderer.next_prompt(self.tokens, action, self.history, observations, self.session.tools, ended)
            self.history += observations
            if len(nxt) + MIN_ACTION_TOKENS <= self.max_context_tokens:
                self.tokens = nxt
                return StepResult(0.0, False, tinker.ModelInput.from_ints(nxt), self._stop, metrics={}, logs={})
            self.session.overflow()
        reward = await self.session.finish()
        s = self.session
        logs = {
            "tasks/task": s.task.id,
            "tasks/end": s.end_reason or "",
            "tasks/grade": s.grade_detail[:500],
            "tasks/transcript": s.messages,
        }
        return StepResult(reward, True, tinker.ModelInput.empty(), self._stop, metrics=s.metrics(), logs=logs)

    async def close(self) -> None:
        await self.session.close()


# ---------------------------------------------------------------------------------------------
# Groups and datasets


class TaskGroupBuilder(EnvGroupBuilder):
    """`group_size` attempts at one task (a GRPO group), each in its own sandbox."""

    def __init__(
        self,
        task: Task,
        cfg: TasksEnvConfig,
        renderer,
        provider: LazyProvider,
        group_size: int,
        tag: str = "tasks",
        capture_patch: bool = False,
    ):
        self.task, self.cfg, self.renderer, self.provider = task, cfg, renderer, provider
        self.group_size, self.tag, self.capture_patch = group_size, tag, capture_patch

    async def make_envs(self) -> Sequence[Env]:
        return [
            TaskEnv(
                TaskSession(self.task, self.cfg, self.provider, self.capture_patch),
                self.renderer,
                self.cfg.max_tokens_per_turn,
            )
            for _ in range(self.group_size)
        ]

    def logging_tags(self) -> list[str]:
        return [self.tag]

    def eval_key(self) -> str | None:
        """The task's content, the episode's settings, the chat format and the tag, as one digest."""
        task = self.task
        content = task.content_hash or repr((task.id, task.instruction, task.build, task.tests, task.test_command))
        fmt = (self.renderer.name or type(self.renderer).__name__, self.renderer.tool_format)
        blob = json.dumps([content, self.cfg.model_dump(mode="json"), fmt, self.tag, self.group_size])
        return hashlib.sha256(blob.encode()).hexdigest()


class TasksDataset(RLDataset):
    """Batches of `groups_per_batch` groups, cycling through the tasks in an order fixed by the seed
    (a fresh permutation each pass), so a resumed run sees the same batches."""

    def __init__(
        self,
        tasks: list[Task],
        groups_per_batch: int,
        n_batches: int,
        seed: int,
        make_builder: Callable[[Task], EnvGroupBuilder],
        shuffle: bool = True,
    ):
        self.tasks, self.groups_per_batch, self.n_batches = tasks, groups_per_batch, n_batches
        self.seed, self.make_builder, self.shuffle = seed, make_builder, shuffle
        self._orders: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            n = len(self.tasks)
            self._orders[epoch] = (
                np.random.default_rng([self.seed, epoch, 0x7A5]).permutation(n) if self.shuffle else np.arange(n)
            )
        return self._orders[epoch]

    def task_at(self, position: int) -> Task:
        epoch, i = divmod(position, len(self.tasks))
        return self.tasks[int(self._order(epoch)[i])]

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        start = index * self.groups_per_batch
        return [self.make_builder(self.task_at(p)) for p in range(start, start + self.groups_per_batch)]

    def __len__(self) -> int:
        return self.n_batches


def build_datasets(cfg: TasksEnvConfig, ctx: EnvContext) -> EnvDatasets:
    """The training tasks that pass the gate, and the held-out tasks, as datasets of groups."""
    renderer = renderer_for(ctx.renderer, cfg.tool_format, ctx.key)
    tasks = cfg.load_tasks()
    test = select_tasks(tasks, cfg.test_task_ids) if cfg.test_task_ids else []
    held_out = {t.id for t in test}
    train = [t for t in tasks if t.id not in held_out]
    provider = ctx.sandbox
    if cfg.gate:
        train = gated(train, provider.get())
    if not train:
        raise ConfigError(f"environments.{ctx.key}: no training tasks left (all held out or failed the gate)")

    def builder(task: Task, group_size: int) -> TaskGroupBuilder:
        return TaskGroupBuilder(task, cfg, renderer, provider, group_size, ctx.key)

    n_batches = math.ceil(cfg.epochs * len(train) / ctx.groups_per_batch)
    train_ds = TasksDataset(train, ctx.groups_per_batch, n_batches, ctx.seed, lambda t: builder(t, ctx.group_size))
    test_ds = TasksDataset(test, len(test), 1, ctx.seed, lambda t: builder(t, 1), shuffle=False) if test else None
    return EnvDatasets(train=train_ds, test=test_ds)
