"""`env=tasks env.path=tasks ...`: the agent-task environment's config and task selection (kept light:
it imports no SDK types, so a config error answers without loading torch)."""

from __future__ import annotations

import fnmatch
import logging
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from tinkrl.errors import ConfigError

if TYPE_CHECKING:
    from tinkrl.taskdirs import Task

log = logging.getLogger(__name__)


class TasksEnvConfig(BaseModel):
    """`env=tasks env.path=tasks ...`: tool-using agents on task directories, graded by their tests."""

    model_config = ConfigDict(extra="forbid")

    path: str | list[str] = "tasks"
    """Task directories, directories of them, or .json/.jsonl row files (R2E-Gym, SWE-bench)."""
    task_ids: list[str] | None = None
    """Only these tasks (ids or shell globs); None = every task found."""
    test_task_ids: list[str] | None = None
    """Tasks held out of training and rolled out once each as the test set (ids or globs)."""
    max_turns: int = Field(10, ge=1)
    """Assistant turns per episode; the last one ends the episode and it is graded."""
    max_tokens_per_turn: int | None = Field(None, ge=1)
    """Tokens sampled per turn (None: the trainer's max_tokens)."""
    max_context_tokens: int = Field(8192, ge=64)
    """Prompt + all turns must fit; an episode that overflows ends with reward 0."""
    max_total_tokens: int | None = Field(None, ge=1)
    """Sampled tokens per episode, all turns together (None: no limit besides the context)."""
    episode_timeout_s: float | None = Field(None, gt=0)
    """Time limit of an episode (None: the task's agent timeout); see `timeout_includes_sampling`."""
    timeout_includes_sampling: bool = False
    """Count the model's sampling time against the limit (wall clock, as terminal-bench does). Off by
    default: sampling latency depends on the trainer's batch and hardware, not on the policy, so only
    the time the agent's commands take in the sandbox is counted."""
    command_timeout_s: float = Field(60.0, gt=0)
    """Ceiling on one execute_bash call (the model may ask for less); a timeout is an observation."""
    max_observation_chars: int = Field(8000, ge=200)
    """A tool result longer than this keeps its head and tail."""
    tool_format: Literal["hermes", "xml"] = "hermes"
    """Tool-call syntax: Hermes `<tool_call>` JSON (Qwen2.5) or R2E-Gym's `<function=...>` XML."""
    system_prompt: str | None = None
    """System prompt before the tool list; `{workdir}` and `{max_turns}` are filled in."""
    gate: bool = True
    """Train only on tasks whose solution scores 1 and whose no-op scores 0 (cached per task)."""
    epochs: int = Field(100, ge=1)
    """Passes over the tasks the training dataset offers (the run's max_steps usually stops first)."""

    def load_tasks(self) -> list[Task]:
        """The selected tasks; broken ones are skipped with a warning, none at all is a ConfigError."""
        from tinkrl.taskdirs import TaskLoadError, iter_tasks

        paths = [self.path] if isinstance(self.path, str) else list(self.path)
        tasks: list[Task] = []
        for item in iter_tasks(paths):
            if isinstance(item, TaskLoadError):
                log.warning("skipping a task that does not load: %s", item)
            else:
                tasks.append(item)
        if self.task_ids is not None:
            tasks = select_tasks(tasks, self.task_ids)
        if not tasks:
            raise ConfigError(f"env.path: no loadable tasks in {', '.join(paths)}")
        ids = [t.id for t in tasks]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ConfigError(f"env.path: task ids occur more than once: {', '.join(dupes)}")
        return tasks


TasksConfig = TasksEnvConfig  # the name users type: env=TasksConfig


def select_tasks(tasks: list[Task], patterns: list[str]) -> list[Task]:
    """Tasks whose id matches one of `patterns` (exact ids or shell globs); unmatched ones are an error."""
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(t.id, p) for t in tasks)]
    if unmatched:
        raise ConfigError(
            f"task_ids: no task matches {', '.join(map(repr, unmatched))}; known: {', '.join(t.id for t in tasks)}"
        )
    return [t for t in tasks if any(fnmatch.fnmatchcase(t.id, p) for p in patterns)]
