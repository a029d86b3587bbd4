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
- `SessionEnv` (`tinkrl.agents.episode`) is the token-in/token-out `Env` over a session: it parses
  sampled tokens with the renderer (each family's own tool-call format; a malformed call comes back
  as an error observation) and lays out the next prompt with `renderer.next_prompt`, so the episode
  trains on tokens the sampler saw.

What the policy causes shapes or ends the episode and is trained on (see the session); only
infrastructure failures raise `InfraFailure`, so the rollout leaves the episode out of its group.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from tinkrl.agents.episode import SessionEnv
from tinkrl.agents.session import TaskSession
from tinkrl.envs.agent_tasks.config import TasksEnvConfig
from tinkrl.errors import ConfigError
from tinkrl.rl.types import Env, EnvDatasets, EnvGroupBuilder, RLDataset
from tinkrl.sandbox import LazyProvider
from tinkrl.taskdirs import Task

if TYPE_CHECKING:
    from tinkrl.envs import EnvContext


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
            SessionEnv(
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
    provider = ctx.sandbox
    train, test = cfg.split(cfg.load_tasks(), provider)
    if not train:
        raise ConfigError(f"environments.{ctx.key}: no training tasks left (all held out or failed the gate)")

    def builder(task: Task, group_size: int) -> TaskGroupBuilder:
        return TaskGroupBuilder(task, cfg, renderer, provider, group_size, ctx.key)

    n_batches = math.ceil(cfg.epochs * len(train) / ctx.groups_per_batch)
    train_ds = TasksDataset(train, ctx.groups_per_batch, n_batches, ctx.seed, lambda t: builder(t, ctx.group_size))
    test_ds = TasksDataset(test, len(test), 1, ctx.seed, lambda t: builder(t, 1), shuffle=False) if test else None
    return EnvDatasets(train=train_ds, test=test_ds)
