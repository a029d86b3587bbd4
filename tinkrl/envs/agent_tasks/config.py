"""`env=tasks env.path=tasks ...`: the agent-task environment's config and task selection (kept light:
it imports no SDK types, so a config error answers without loading torch; a registry dataset is
fetched only when `load_tasks` runs)."""

from __future__ import annotations

import fnmatch
import logging
import re
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tinkrl.agents.limits import EpisodeLimits
from tinkrl.errors import ConfigError

if TYPE_CHECKING:
    from tinkrl.agents.session import SandboxSource
    from tinkrl.sandbox.base import SandboxProvider
    from tinkrl.taskdirs import Task

log = logging.getLogger(__name__)
_DATASET_SPEC = re.compile(r"\s*[A-Za-z0-9][\w.-]*\s*(==\s*[\w.+-]+\s*)?")  # as taskdirs.datasets.parse_spec


class TaskSelection(BaseModel):
    """Which tasks an environment of task directories or rows trains and tests on (`env=tasks`,
    `env=external_agent`), and how their tool calls are written."""

    model_config = ConfigDict(extra="forbid")

    path: str | list[str] = "tasks"
    """Task directories, directories of them, or .json/.jsonl row files (R2E-Gym, SWE-bench)."""
    dataset: str | None = None
    """A terminal-bench registry dataset, NAME==VERSION (NAME alone: its newest version), e.g.
    terminal-bench-core==0.1.1; fetched once into the tinkrl cache ($TINKRL_HOME/datasets); replaces
    `path`. The registry is terminal-bench's, or $TINKRL_TB_REGISTRY (a URL or a file)."""
    task_ids: list[str] | None = None
    """Only these tasks (ids or shell globs); None = every task found."""
    test_task_ids: list[str] | None = None
    """Tasks held out of training and rolled out once each as the test set (ids or globs)."""
    tool_format: Literal["hermes", "xml"] = "hermes"
    """Tool-call syntax: Hermes `<tool_call>` JSON (Qwen2.5) or R2E-Gym's `<function=...>` XML."""
    gate: bool = True
    """Train only on tasks whose solution scores 1 and whose no-op scores 0 (cached per task)."""
    epochs: int = Field(100, ge=1)
    """Passes over the tasks the training dataset offers (the run's max_steps usually stops first)."""

    @field_validator("dataset")
    @classmethod
    def _dataset_spec(cls, v: str | None) -> str | None:
        if v is not None and not _DATASET_SPEC.fullmatch(v):
            raise ValueError("expected NAME==VERSION or NAME (e.g. terminal-bench-core==0.1.1)")
        return v

    @model_validator(mode="after")
    def _dataset_or_path(self) -> TaskSelection:
        if self.dataset is not None and "path" in self.model_fields_set:
            raise ValueError("set env.dataset or env.path, not both (a dataset replaces the path)")
        return self

    def task_paths(self) -> list[str]:
        """Where the tasks are: `path`, or the folder of the fetched `dataset` (fetched now if not cached)."""
        if self.dataset is not None:
            from tinkrl.taskdirs.datasets import fetch_dataset

            return [str(fetch_dataset(self.dataset))]
        return [self.path] if isinstance(self.path, str) else list(self.path)

    def describe_source(self) -> str:
        """One line for a plan: where the tasks come from (no network, nothing fetched)."""
        if self.dataset is not None:
            from tinkrl.taskdirs.datasets import describe_dataset

            return describe_dataset(self.dataset)
        return "task paths: " + ", ".join([self.path] if isinstance(self.path, str) else self.path)

    def load_tasks(self) -> list[Task]:
        """The selected tasks; broken ones are skipped with a warning, none at all is a ConfigError."""
        from tinkrl.taskdirs import TaskLoadError, iter_tasks

        paths = self.task_paths()
        key = "env.dataset" if self.dataset is not None else "env.path"
        tasks: list[Task] = []
        for item in iter_tasks(paths):
            if isinstance(item, TaskLoadError):
                log.warning("skipping a task that does not load: %s", item)
            else:
                tasks.append(item)
        if self.task_ids is not None:
            tasks = select_tasks(tasks, self.task_ids)
        if not tasks:
            raise ConfigError(f"{key}: no loadable tasks in {', '.join(paths)}")
        ids = [t.id for t in tasks]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ConfigError(f"{key}: task ids occur more than once: {', '.join(dupes)}")
        return tasks

    def split(self, tasks: list[Task], provider: SandboxSource) -> tuple[list[Task], list[Task]]:
        """`tasks` as (training, held-out): the held-out ones are `test_task_ids`; the rest train, those
        that fail the gate left out when `gate` is on (the gate runs in `provider`'s sandboxes)."""
        test = select_tasks(tasks, self.test_task_ids) if self.test_task_ids else []
        held_out = {t.id for t in test}
        train = [t for t in tasks if t.id not in held_out]
        return (gated(train, provider.get()) if self.gate else train), test


class TasksEnvConfig(TaskSelection, EpisodeLimits):
    """`env=tasks env.path=tasks ...`: tool-using agents on task directories, graded by their tests; the
    episode limits (`EpisodeLimits`) with their defaults for task directories."""


TasksConfig = TasksEnvConfig  # the name users type: env=TasksConfig


def select_tasks(tasks: list[Task], patterns: list[str]) -> list[Task]:
    """Tasks whose id matches one of `patterns` (exact ids or shell globs); unmatched ones are an error."""
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(t.id, p) for t in tasks)]
    if unmatched:
        raise ConfigError(
            f"task_ids: no task matches {', '.join(map(repr, unmatched))}; known: {', '.join(t.id for t in tasks)}"
        )
    return [t for t in tasks if any(fnmatch.fnmatchcase(t.id, p) for p in patterns)]


def gated(tasks: list[Task], provider: SandboxProvider) -> list[Task]:
    """The tasks that pass the gate (`run_gate`); the others are logged and left out."""
    from tinkrl.progress import progress_bar
    from tinkrl.taskdirs import run_gate

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
