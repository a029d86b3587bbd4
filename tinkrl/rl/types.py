"""The RL contracts every environment implements: token-in/token-out envs and groups.

An `Env` is single-use. It gives an initial observation (tokens + stop condition); each
`step` receives the sampled action tokens exactly as sampled (never re-tokenised) and
returns a reward, whether the episode is done, and the next observation, which should
extend the previous observation + action so the whole trajectory becomes one Datum.

An `EnvGroupBuilder` makes the `group_size` envs of one task (a GRPO group) and may score
the group as a whole. A builder whose rollouts are driven by someone else (an external agent
program, a third-party environment library talking to the model over the OpenAI API) runs
them itself in `run_group` and hands back finished trajectories. An `RLDataset` hands out builders batch by batch. `EnvDatasets` is what
an environment gives a run: its training and held-out datasets and optional hooks.

Infrastructure failures inside an env raise `tinkrl.errors.InfraFailure`: the rollout
records the failure mode and leaves the episode out of its group, never scoring it 0.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import tinker

Action = list[int]
StopCondition = list[str] | list[int]
Metrics = dict[str, float]


@dataclass
class StepResult:
    """What `Env.step` returns: the reward, whether the episode is done, the next observation and stop condition."""

    reward: float
    episode_done: bool
    next_observation: tinker.ModelInput
    next_stop_condition: StopCondition
    metrics: Metrics = field(default_factory=dict)
    logs: dict[str, Any] = field(default_factory=dict)  # JSON values, written to the run's episode log
    # Optional per-token mask for the action just taken (1 = trained on, 0 = forced text
    # the policy did not choose). None means every action token is trained on.
    action_mask: list[float] | None = None


class Env(abc.ABC):
    """One episode of an environment, driven token-in/token-out."""

    @abc.abstractmethod
    async def initial_observation(self) -> tuple[tinker.ModelInput, StopCondition]: ...

    @abc.abstractmethod
    async def step(self, action: Action, *, stop_reason: str = "stop") -> StepResult:
        """`stop_reason` is the sampler's: "stop" (a stop sequence) or "length" (max_tokens)."""

    def max_tokens(self, default: int) -> int:
        """Tokens the policy may sample for the next action (envs with a context budget override)."""
        return default

    async def close(self) -> None:
        """Release what the episode holds (sandbox, remote session). Called exactly once."""


@dataclass
class Transition:
    """One turn: the observation, the sampled action with its logprobs and mask, its reward, metrics and logs."""

    ob: tinker.ModelInput
    ac_tokens: list[int]
    ac_logprobs: list[float]
    reward: float
    episode_done: bool
    stop_reason: str = "stop"
    ac_mask: list[float] | None = None  # None = all ones
    metrics: Metrics = field(default_factory=dict)
    logs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    """One episode's transitions and final observation; `failure_mode` is set when infrastructure failed."""

    transitions: list[Transition]
    final_ob: tinker.ModelInput | None = None
    failure_mode: str | None = None  # set when infrastructure failed: excluded from the group
    failure_detail: str = ""

    @property
    def total_reward(self) -> float:
        return sum(t.reward for t in self.transitions)

    @property
    def logs(self) -> dict[str, Any]:
        """What the environment logged over the episode: its transitions' logs merged (a later turn's
        value replaces an earlier one's)."""
        return {k: v for t in self.transitions for k, v in t.logs.items()}


@dataclass
class TrajectoryGroup:
    """The rollouts of one task. Only trajectories without a failure_mode are kept in `trajectories_G`."""

    trajectories_G: list[Trajectory]
    final_rewards_G: list[float]  # group-level reward added to each trajectory's step rewards
    metrics_G: list[Metrics]
    tags: list[str]
    failures: list[Trajectory] = field(default_factory=list)

    def total_rewards(self) -> list[float]:
        return [t.total_reward + r for t, r in zip(self.trajectories_G, self.final_rewards_G)]


@dataclass(frozen=True)
class SamplingSettings:
    """How a group samples: the run's max_tokens and top_p, the environment's temperature, and the
    run's cap on rollouts at once (`slots`, max_concurrent_rollouts; None: no cap)."""

    max_tokens: int
    temperature: float
    top_p: float = 1.0
    slots: asyncio.Semaphore | None = None


class EnvGroupBuilder(abc.ABC):
    """Makes the envs of one GRPO group (same task, `group_size` rollouts)."""

    @abc.abstractmethod
    async def make_envs(self) -> Sequence[Env]: ...

    async def run_group(self, sampling_client: Any, settings: SamplingSettings) -> list[Trajectory] | None:
        """The group's finished trajectories when this builder runs its rollouts itself (their
        failures marked by `failure_mode`); None, the default, when the trainer drives `make_envs`'
        envs token by token. Group rewards then come from `compute_group_rewards(trajectories, [])`."""
        return None

    async def compute_group_rewards(
        self, trajectories_G: list[Trajectory], envs_G: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        """Group-level rewards (e.g. pairwise preference); default none."""
        return [(0.0, {}) for _ in trajectories_G]

    async def cleanup(self) -> None: ...

    def logging_tags(self) -> list[str]:
        """Metric namespaces for this group, e.g. ["arithmetic"] → env/arithmetic/..."""
        return []

    def eval_key(self) -> str | None:
        """A digest of everything that decides this builder's held-out episode (the problem and the
        episode's settings), so that an eval of a model that never changes can be kept and read back;
        None, the default, when the builder cannot say (its evals are never reused)."""
        return None


class RLDataset(abc.ABC):
    """Hands out a run's group builders, batch by batch."""

    @abc.abstractmethod
    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]: ...

    @abc.abstractmethod
    def __len__(self) -> int: ...


@dataclass
class EnvDatasets:
    """What an environment gives a run: its training and held-out datasets, and optional hooks."""

    train: RLDataset
    test: RLDataset | None = None
    """Held-out problems: one batch, one builder per problem (None: no held-out eval)."""
    on_step: Callable[[int, list[TrajectoryGroup]], Metrics] | None = None
    """Called after each training step with this environment's groups of the step; returns extra metrics."""
    close: Callable[[], None] | None = None
    """Called once when the run ends (e.g. to wait for uploads)."""
    demonstrations: Callable[[int], Awaitable[list[list[dict]]]] | None = None
    """Up to n reference transcripts (chat messages) of training tasks solved, for a warm start."""
    sandboxes: Callable[[], dict[str, Any]] | None = None
    """What the run's sandbox provider did (its name, sandboxes started and failed), for the run's summary."""
