"""The `verifiers` environment's config: which verifiers taskset (and env, harness) to train on.

Light on purpose: nothing here imports verifiers, so a config error answers at once and a run
without verifiers installed can still validate other environments.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# The harness verifiers runs each rollout's agent with unless the config names another:
# tinkrl's in-process chat loop (tinkrl.envs.verifiers.harness), which needs no sandbox or `uv`.
DEFAULT_HARNESS = "tinkrl"


class VerifiersEnvConfig(BaseModel):
    """A verifiers taskset trained as one environment; rewards are its tasks' rubric (`@vf.reward`s, judges)."""

    model_config = ConfigDict(extra="forbid")

    taskset: str = Field(min_length=1)
    """An installed verifiers taskset id (`vf-eval`'s positional id, e.g. `gsm8k-v1`), or a Python
    module path (`mypkg.tasks`) whose `__all__` exports a `vf.Taskset` subclass."""
    taskset_args: dict[str, Any] = Field(default_factory=dict)
    """The taskset's config fields (verifiers' `--env.taskset.*`)."""
    env_id: str = ""
    """A verifiers `Env` to pair with the taskset (one agent run per episode); empty: the taskset's own, else
    single-agent."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """Further fields of the verifiers env config (verifiers' `--env.*`), e.g. `{timeout: {episode: 300}}`."""
    harness: str = DEFAULT_HARNESS
    """The verifiers harness that plays each rollout (`tinkrl`: the in-process chat loop; or a verifiers
    harness id such as `bash`, which then runs in `runtime`)."""
    harness_args: dict[str, Any] = Field(default_factory=dict)
    """The harness's config fields (verifiers' `--env.agent.harness.*`)."""
    runtime: dict[str, Any] = Field(default_factory=lambda: {"type": "subprocess"})
    """Where the agent runs (verifiers' `--env.agent.runtime.*`): subprocess (default), docker, prime, ..."""
    max_turns: int | None = Field(None, ge=1)
    """Cap on model calls per rollout (verifiers' agent `max_turns`); None: the harness's own."""
    eval_tasks: int = Field(0, ge=0)
    """Tasks held out from the end of the taskset for the run's held-out eval (0: no held-out eval)."""
    max_tasks: int | None = Field(None, ge=1)
    """Train on at most this many tasks (from the start of the taskset); None: all but the held-out ones."""
    shuffle: bool = True
    """Shuffle the training tasks (with the run's seed)."""
    timeout_s: float | None = Field(600.0, gt=0)
    """Wall-clock limit on one rollout's agent (verifiers' `--env.agent.timeout.rollout`)."""
