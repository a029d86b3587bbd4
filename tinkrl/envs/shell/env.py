"""The `shell` environment: generated shell tasks as multi-turn agent episodes in sandboxes.

Training draws a seeded stream of instances (a template, then its names and contents; with
`downweight_constant`, the templates whose groups no longer split less often) and rolls each
out as a GRPO group with the agent-task episode (`SessionEnv` over `TaskSession`), in the shell
action format by default. The test set is held-out instances of the trained templates
(`heldout_instances`), instances of templates never trained on (`heldout_templates`) and, with
`eval_tasks`, tasks written by hand (`handwritten`), reported separately. `demonstrations(n)`
runs the templates' reference solutions through the same episode and keeps the ones that score
1: the transcripts a warm start trains on (some of them, `recovery_demonstrations`, first make
the template's typical mistake and then fix it from the error they see).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tinkrl.agents.episode import Message, shell_reply
from tinkrl.agents.session import TaskSession
from tinkrl.agents.shell_actions import reference_reply
from tinkrl.envs.agent_tasks.env import TaskGroupBuilder, renderer_for
from tinkrl.envs.shell.config import ShellEnvConfig
from tinkrl.envs.shell.focus import GroupTally
from tinkrl.envs.shell.tasks import held_out, to_task, train_instance
from tinkrl.envs.shell.templates import Instance
from tinkrl.errors import ConfigError, InfraFailure
from tinkrl.rl.types import EnvDatasets, EnvGroupBuilder, Metrics, RLDataset, TrajectoryGroup
from tinkrl.taskdirs import Task, TaskLoadError, iter_tasks

if TYPE_CHECKING:
    from tinkrl.envs import EnvContext

STREAM_LENGTH = 1_000_000  # batches the train stream offers (the run's max_steps stops first)


class ShellStream(RLDataset):
    """Batch `index` holds the stream's instances at positions index*G .. index*G+G-1. With
    `downweight_constant`, each batch draws its templates by the outcomes of the steps before it
    (`GroupTally`, fed by `on_step` and, for a resumed run, read back from `episodes_dir`); a
    resumed run sees the same batches either way."""

    def __init__(
        self,
        cfg: ShellEnvConfig,
        groups_per_batch: int,
        seed: int,
        exclude: set[str],
        make_builder,
        key: str = "shell",
        episodes_dir: Path | None = None,
    ):
        self.cfg, self.groups_per_batch, self.seed, self.exclude = cfg, groups_per_batch, seed, exclude
        self.make_builder, self.key = make_builder, key
        self.tally = GroupTally()
        if cfg.downweight_constant and episodes_dir is not None:
            self.tally.load(episodes_dir)

    def instance_at(self, position: int, weights: list[float] | None = None) -> Instance:
        """The stream's instance at `position` (templates drawn by `weights`, else uniformly)."""
        return train_instance(self.cfg.templates, position, self.seed, self.exclude, self.cfg.paraphrase, weights)

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        weights = None
        if self.cfg.downweight_constant:
            weights = self.tally.weights(self.cfg.templates, index, self.cfg.downweight_constant)
        start = index * self.groups_per_batch
        return [self.make_builder(self.instance_at(p, weights)) for p in range(start, start + self.groups_per_batch)]

    def on_step(self, step: int, groups: list[TrajectoryGroup]) -> Metrics:
        """Record the step's outcomes; reports how many templates had only constant groups lately."""
        self.tally.record(step, groups)
        shares = self.tally.constant_shares(self.cfg.templates, step + 1).values()
        return {f"env/{self.key}/constant_templates": sum(1 for s in shares if s == 1.0)}

    def __len__(self) -> int:
        return STREAM_LENGTH


class FixedSet(RLDataset):
    """One batch: a builder per held-out instance."""

    def __init__(self, builders: list[EnvGroupBuilder]):
        self.builders = builders

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return list(self.builders)

    def __len__(self) -> int:
        return 1


async def reference_transcript(
    inst: Instance, cfg: ShellEnvConfig, provider, recover: bool = False
) -> list[Message] | None:
    """The episode of `inst`'s reference solution (each command a turn, then DONE), as chat messages with
    the real observations; with `recover`, its mistake runs first and the solution follows its error.
    None when it does not score 1 or the sandbox failed."""
    session = TaskSession(to_task(inst), cfg, provider)
    wrong = inst.wrong_command
    commands = [wrong] if recover and wrong else []
    try:
        await session.start()
        for command in [*commands, *inst.commands, None]:
            _, done = await session.act(shell_reply(reference_reply(command)))
            if done:
                break
        if not session.done:
            return None
        reward = await session.finish()
    except InfraFailure:
        return None
    finally:
        await session.close()
    return session.messages if reward >= 1.0 else None


def load_eval_tasks(paths: list[str], key: str) -> list[Task]:
    """The hand-written tasks of `eval_tasks`, in the order given; a task that does not load is a ConfigError."""
    tasks: list[Task] = []
    for item in iter_tasks(paths):
        if isinstance(item, TaskLoadError):
            raise ConfigError(f"environments.{key}.env.eval_tasks: {item}")
        tasks.append(item)
    if paths and not tasks:
        raise ConfigError(f"environments.{key}.env.eval_tasks: no tasks in {', '.join(paths)}")
    return tasks


def build_datasets(cfg: ShellEnvConfig, ctx: EnvContext) -> EnvDatasets:
    """The train stream, the held-out set (one tag per kind) and the reference demonstrations of the shell family."""
    renderer = renderer_for(ctx.renderer, cfg.tool_format, ctx.key)
    provider = ctx.sandbox
    tests = held_out(cfg.templates, cfg.test_per_template, ctx.seed, cfg.paraphrase)
    per_new = cfg.test_per_template if cfg.test_per_held_out_template is None else cfg.test_per_held_out_template
    new_templates = held_out(cfg.held_out_templates, per_new, ctx.seed)
    exclude = {i.key for i in tests}

    def builder(inst: Instance, group_size: int, tag: str) -> TaskGroupBuilder:
        return TaskGroupBuilder(to_task(inst), cfg, renderer, provider, group_size, tag)

    train = ShellStream(
        cfg,
        ctx.groups_per_batch,
        ctx.seed,
        exclude,
        lambda i: builder(i, ctx.group_size, ctx.key),
        ctx.key,
        ctx.run_dir / "episodes",
    )
    test_builders = [builder(i, 1, "heldout_instances") for i in tests]
    test_builders += [builder(i, 1, "heldout_templates") for i in new_templates]
    test_builders += [
        TaskGroupBuilder(t, cfg, renderer, provider, 1, "handwritten") for t in load_eval_tasks(cfg.eval_tasks, ctx.key)
    ]

    async def demonstrations(n: int, concurrency: int = 4) -> list[list[Message]]:
        """`n` reference transcripts from a stream of their own (a seed apart from the train stream's),
        held-out instances excluded; failed ones are left out."""
        sem = asyncio.Semaphore(concurrency)
        draw = np.random.default_rng(ctx.seed + 2_000_003).random(n)

        def recovers(position: int) -> bool:
            return bool(draw[position] < cfg.recovery_demonstrations)

        async def one(position: int) -> list[Message] | None:
            inst = train_instance(cfg.templates, position, ctx.seed + 1_000_003, exclude, cfg.paraphrase)
            async with sem:
                return await reference_transcript(inst, cfg, provider, recover=recovers(position))

        found = await asyncio.gather(*(one(p) for p in range(n)))
        return [m for m in found if m is not None]

    return EnvDatasets(
        train=train,
        test=FixedSet(test_builders) if test_builders else None,
        demonstrations=demonstrations,
        on_step=train.on_step if cfg.downweight_constant else None,
    )
