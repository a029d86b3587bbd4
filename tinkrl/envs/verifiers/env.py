"""Build a `verifiers` environment's datasets: each group is verifiers rollouts of one task.

verifiers (Prime Intellect's library) plays a rollout as an *episode*: its `Env` hands the task to
an agent (a harness) that reaches the model through verifiers' interception server, then scores
the trace with the task's rubric (`@vf.reward` functions with weights, judges). Here that model is
the run's policy: every rollout's interception forwards to its own rollout URL on the run's
OpenAI-compatible `RunServer`, which captures the sampled tokens. The trajectory is built from
those captured calls, its reward is the rubric's weighted total, and the rubric's per-function
scores ride along as metrics (`rubric/<name>`, with `proxy/merge_rate` and friends).

verifiers runs on an event loop of its own (a daemon thread), holding `env.serving()` (its
interception servers) from the first rollout to the end of the run; the trainer's coroutines wait
on it. A rollout that fails (its episode has errors) is recorded as a failure (`failure_mode`
`agent_error`) and left out of its group; the run goes on.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import logging
import os
import random
import re
import sys
import threading
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from tinkrl.envs.external_agent.run_server import RunServer
from tinkrl.envs.verifiers.config import DEFAULT_HARNESS, VerifiersEnvConfig
from tinkrl.errors import ConfigError
from tinkrl.rl.rollouts import gather_rollouts
from tinkrl.rl.types import EnvDatasets, EnvGroupBuilder, RLDataset, SamplingSettings, Trajectory

if TYPE_CHECKING:
    from tinkrl.envs import EnvContext
    from tinkrl.envs.external_agent.runner import AgentSession

log = logging.getLogger("tinkrl.envs.verifiers")

UNBOUNDED = 10**9  # batches cycle through the tasks; the trainer stops at max_steps
BACKSTOP_S = 60.0  # past verifiers' own rollout timeout, the run stops an episode that still hangs
INSTALL_HINT = "pip install 'tinkrl[verifiers]'"


def import_verifiers() -> Any:
    """`verifiers.v1`, or a one-line ConfigError saying how to install it."""
    try:
        return importlib.import_module("verifiers.v1")
    except ImportError as e:
        raise ConfigError(f"the verifiers environment needs the verifiers library ({e}): {INSTALL_HINT}") from None


def plugin_id(name: str, kind: str) -> str:
    """The id verifiers loads a taskset or env plugin by. verifiers imports plugins by top-level
    module name, so a dotted module path is imported here and registered under a top-level alias."""
    if "." not in name:
        return name
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        raise ConfigError(f"verifiers {kind} {name!r} cannot be imported: {e}") from None
    alias = "tinkrl_vf_" + re.sub(r"\W", "_", name).lower()
    sys.modules.setdefault(alias, module)
    return alias


def key_variable(api_key: str) -> str:
    """The environment variable verifiers reads the run server's API key from (verifiers takes a
    client's key only from a variable): one per key, set here, so two runs' servers never share one."""
    name = "TINKRL_RUN_SERVER_KEY_" + hashlib.sha256(api_key.encode()).hexdigest()[:12]
    os.environ[name] = api_key
    return name


def agent_seat(config: VerifiersEnvConfig) -> dict[str, Any]:
    """The agent config tinkrl gives the env's one seat: its harness, runtime, time limit and turn cap."""
    harness_id = config.harness
    if harness_id == DEFAULT_HARNESS:
        from tinkrl.envs.verifiers.harness import register

        harness_id = register()
    agent: dict[str, Any] = {
        "harness": {**config.harness_args, "id": harness_id},
        "runtime": config.runtime,
        "timeout": {"rollout": config.timeout_s},
    }
    if config.max_turns is not None:
        agent["max_turns"] = config.max_turns
    return agent


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def verifiers_env(config: VerifiersEnvConfig) -> Any:
    """The verifiers `Env` the config names, or a one-line ConfigError naming what is missing or unsupported."""
    vf = import_verifiers()
    name = f"{config.taskset!r}" + (f" (env {config.env_id!r})" if config.env_id else "")
    env_id = plugin_id(config.env_id, "env") if config.env_id else ""
    taskset = {**config.taskset_args, "id": plugin_id(config.taskset, "taskset")}
    try:
        config_cls = vf.env_config_type(taskset["id"], env_id)
        # the env's agent seats: its config's AgentConfig fields (verifiers' `--env.<seat>.*`)
        seats = sorted(n for n, f in config_cls.model_fields.items() if isinstance(f.default, vf.AgentConfig))
        if len(seats) != 1:
            # every call of an episode is captured into one rollout: a second seat's tokens would train as the policy's
            raise ConfigError(
                f"verifiers environment {name} has agents {', '.join(seats) or '(none)'}; "
                "tinkrl trains verifiers environments with one agent seat"
            )
        seat = {**config.env_args.get(seats[0], {}), **agent_seat(config)}
        data = {**config.env_args, "id": env_id, "taskset": taskset, seats[0]: seat}
        return vf.load_environment(vf.resolve_env_config(data))
    except ModuleNotFoundError as e:
        raise ConfigError(f"verifiers environment {name} is not installed: {_one_line(e)}") from None
    except (ValueError, TypeError, AttributeError) as e:
        raise ConfigError(f"verifiers environment {name}: {_one_line(e)}") from None


class VerifiersLoop:
    """verifiers' own event loop on a daemon thread, holding the env's serving resources while open."""

    def __init__(self, env: Any):
        self.env = env
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="verifiers", daemon=True)
        self._thread.start()
        self._serving: Any = None
        self._lock = asyncio.Lock()

    async def _ensure_serving(self) -> None:
        async with self._lock:
            if self._serving is None:
                serving = self.env.serving()
                await serving.__aenter__()
                self._serving = serving

    async def _episode(self, task: Any, ctx: Any) -> Any:
        await self._ensure_serving()
        return await self.env.run_episode(task, ctx)

    async def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Await `coro` on the verifiers loop from any other loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def episode(self, task: Any, ctx: Any) -> Any:
        """One verifiers episode of `task` under model context `ctx`."""
        return await self.run(self._episode(task, ctx))

    def close(self) -> None:
        """Leave `serving()` and stop the loop (idempotent)."""
        if self._loop.is_closed():
            return
        if self._serving is not None:
            future = asyncio.run_coroutine_threadsafe(self._serving.__aexit__(None, None, None), self._loop)
            try:
                future.result(timeout=60)
            except Exception:  # closing must never take the run down
                log.warning("verifiers env teardown failed", exc_info=True)
            self._serving = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()


def episode_scores(episode: Any) -> dict[str, float]:
    """The rubric's per-function scores (`rubric/<name>`) and metrics (`metric/<name>`) of an episode's traces."""
    out: dict[str, float] = {}
    for trace in episode.traces:
        for name, reward in trace.rewards.items():
            if reward is not None:
                out[f"rubric/{name}"] = float(reward.score)
        for name, value in trace.metrics.items():
            if value is not None:
                out[f"metric/{name}"] = float(value)
    return out


def episode_failure(episode: Any) -> str | None:
    """Why an episode is no training data (its first error, or not exactly one agent run), or None."""
    if len(episode.traces) != 1:
        return f"the episode ran {len(episode.traces)} agent runs; tinkrl trains one run per episode"
    errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
    if errors:
        return f"{errors[0].type}: {errors[0].message}".strip()[:500]
    if not episode.ok:
        return "the verifiers episode did not finish"
    return None


class VerifiersGroupBuilder(EnvGroupBuilder):
    """`group_size` verifiers rollouts of one task, sampled through the run's server and scored by the task's rubric."""

    def __init__(
        self, task: Any, group_size: int, server: RunServer, loop: VerifiersLoop, tag: str, timeout_s: float | None
    ):
        self.task = task
        self.group_size = group_size
        self.server = server
        self.loop = loop
        self.tag = tag
        # verifiers stops its own agent at timeout_s; this bounds an episode that hangs anyway
        self.timeout_s = None if timeout_s is None else timeout_s + BACKSTOP_S

    async def make_envs(self) -> Sequence[Any]:
        raise NotImplementedError("verifiers groups run their own rollouts (run_group)")

    async def run_group(self, sampling_client: Any, settings: SamplingSettings) -> list[Trajectory]:
        runner = self.server.runner(sampling_client)
        return await gather_rollouts(settings, self.group_size, lambda _: self._one(runner, settings))

    async def _one(self, runner: Any, settings: SamplingSettings) -> Trajectory:
        vf = import_verifiers()
        done: dict[str, Any] = {}

        async def agent(session: AgentSession) -> None:
            ctx = vf.ModelContext(
                model=session.model,
                client=vf.EvalClientConfig(base_url=session.base_url, api_key_var=key_variable(session.api_key)),
                sampling=vf.Sampling(
                    temperature=settings.temperature, top_p=settings.top_p, max_tokens=settings.max_tokens
                ),
            )
            episode = await self.loop.episode(self.task, ctx)
            done["episode"] = episode
            failure = episode_failure(episode)
            if failure is not None:
                raise RuntimeError(f"verifiers episode failed: {failure}")

        def grader() -> float:
            return float(done["episode"].traces[0].reward)

        rollout = await runner.run(agent, grader, timeout_s=self.timeout_s)
        trajectory = rollout.trajectory
        if trajectory.failure_mode is None and trajectory.transitions:
            extra = {**episode_scores(done["episode"]), **rollout.stats.to_metrics()}
            trajectory.transitions[-1].metrics.update(extra)
            replies = [t.last_reply for t in done["episode"].traces]
            trajectory.transitions[-1].logs.update({"verifiers/reply": replies[-1] if replies else ""})
        return trajectory

    def logging_tags(self) -> list[str]:
        return [self.tag]


class VerifiersDataset(RLDataset):
    """Batches of `groups_per_batch` tasks, cycling through the (shuffled) training tasks."""

    def __init__(self, tasks: list[Any], groups_per_batch: int, make: Any, n_batches: int):
        self.tasks = tasks
        self.groups_per_batch = groups_per_batch
        self.make = make
        self.n_batches = n_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        start = index * self.groups_per_batch
        return [self.make(self.tasks[(start + i) % len(self.tasks)]) for i in range(self.groups_per_batch)]

    def __len__(self) -> int:
        return self.n_batches


def load_tasks(env: Any, config: VerifiersEnvConfig) -> tuple[list[Any], list[Any]]:
    """(training tasks, held-out tasks): the held-out ones are the taskset's last `eval_tasks`."""
    taskset = env.taskset
    if taskset.INFINITE:
        if config.max_tasks is None:
            raise ConfigError(f"verifiers taskset {config.taskset!r} is infinite: set env.max_tasks")
        taskset = taskset.head(config.max_tasks + config.eval_tasks)
    tasks = list(taskset)
    held_out = tasks[len(tasks) - config.eval_tasks :] if config.eval_tasks else []
    train = tasks[: len(tasks) - len(held_out)]
    if config.max_tasks is not None:
        train = train[: config.max_tasks]
    if not train:
        raise ConfigError(f"verifiers taskset {config.taskset!r} has no training tasks ({len(tasks)} in all)")
    return train, held_out


def build_datasets(config: VerifiersEnvConfig, ctx: EnvContext) -> EnvDatasets:
    """The verifiers environment's training batches, held-out problems and the run-end close."""
    env = verifiers_env(config)
    train, held_out = load_tasks(env, config)
    if config.shuffle:
        random.Random(ctx.seed).shuffle(train)
    server = RunServer(ctx.model_name)
    loop = VerifiersLoop(env)

    def make(group_size: int):
        return lambda task: VerifiersGroupBuilder(task, group_size, server, loop, ctx.key, config.timeout_s)

    train_ds = VerifiersDataset(train, ctx.groups_per_batch, make(ctx.group_size), UNBOUNDED)
    test_ds = VerifiersDataset(held_out, len(held_out), make(1), 1) if held_out else None

    def close() -> None:
        loop.close()
        server.close()

    log.info("verifiers %s: %d training tasks, %d held out", config.taskset, len(train), len(held_out))
    return EnvDatasets(train=train_ds, test=test_ds, close=close)
