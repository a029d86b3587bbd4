"""The external-agent environment: each rollout is one run of an unmodified agent program.

`env=external_agent` trains an agent the trainer never sees the inside of. Per rollout: a fresh
sandbox with the task's workspace; the agent process (mini-swe-agent's `mini` CLI, or any
`command`) started with the run server's per-rollout OpenAI base URL and the rollout's sandbox
URL; every completion it asks for is sampled from the step's policy and captured under the
rollout id; when it exits (or its time limit kills it) the task's tests grade the sandbox. The
captured calls become the rollout's trajectory (`tinkrl.proxy.capture`): calls whose prompt
extends the previous call's prompt + sampled tokens merge into one datum (`proxy/merge_rate`).

The agent's own logs stay in the run directory, one folder per rollout:
`<run_dir>/agents/step_<n>/<rollout_id>/` (`agent.log`: its stdout and stderr; for
mini-swe-agent also `trajectory.json`, its own record of the run, and its config dir `mswea/`).

An agent that crashes is `agent_error` and one that never calls the model `no_model_calls`:
recorded, left out of its group, the run goes on (`tinkrl.envs.external_agent.runner`).

Layer: this module drives the run's OpenAI server (`tinkrl.proxy`), so it sits with the servers
(tests/test_import_layers.py), above the other environments.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tinkrl
from tinkrl.envs.agent_tasks.env import TasksDataset, renderer_for
from tinkrl.envs.external_agent.config import ExternalAgentEnvConfig
from tinkrl.envs.external_agent.run_server import RunServer
from tinkrl.envs.external_agent.runner import CommandAgent, ExternalRollout
from tinkrl.errors import ConfigError
from tinkrl.rl.rollouts import gather_rollouts
from tinkrl.rl.types import Env, EnvDatasets, EnvGroupBuilder, SamplingSettings, Trajectory
from tinkrl.sandbox import LazyProvider
from tinkrl.taskdirs import Task

if TYPE_CHECKING:
    from tinkrl.envs import EnvContext

MINI_ENVIRONMENT_CLASS = "tinkrl.harness.mini_swe_agent.TinkrlSandboxEnvironment"
MINI_CONFIGS = {"text": ("mini_textbased.yaml", "litellm_textbased"), "tools": ("mini.yaml", "litellm")}
INSTALL_HINT = "pip install 'tinkrl[agents]'"


def mini_executable() -> list[str]:
    """How to start mini-swe-agent's CLI: its `mini` script beside this Python, on PATH, or `-m`."""
    if importlib.util.find_spec("minisweagent") is None:
        raise ConfigError(f"agent mini-swe-agent: the mini-swe-agent package is not installed: {INSTALL_HINT}")
    beside = Path(sys.executable).parent / "mini"
    found = str(beside) if beside.is_file() else shutil.which("mini")
    return [found] if found else [sys.executable, "-m", "minisweagent.run.mini"]


def mini_swe_agent_command(cfg: ExternalAgentEnvConfig, temperature: float, max_tokens: int) -> CommandAgent:
    """mini-swe-agent's `mini` CLI, unmodified, as a command template: the model through litellm's
    OpenAI provider at the rollout's base URL, its commands in the rollout's sandbox (tinkrl's
    environment class, picked by mini's own --environment-class), no prompts, its trajectory file
    and global config dir in the rollout's log dir."""
    config_file, model_class = MINI_CONFIGS[cfg.mini_mode]
    settings = {
        "model.model_kwargs.api_base": "{base_url}",  # the key: OPENAI_API_KEY, read by litellm
        "model.model_kwargs.temperature": repr(float(temperature)),
        "model.model_kwargs.max_tokens": str(max_tokens),
        "model.cost_tracking": "ignore_errors",  # a local model has no price: nothing to track
        "agent.step_limit": str(cfg.step_limit),
        "agent.cost_limit": "0",
        "environment.url": "{sandbox_url}",  # its key: OPENAI_API_KEY, as the model's
        "environment.cwd": "{workdir}",
        "environment.timeout": str(cfg.command_timeout_s),
    }
    argv = [
        *mini_executable(),
        "--yolo",  # run commands without asking
        "--exit-immediately",  # no confirmation prompt at the end
        "--agent-class",
        "default",  # the non-interactive agent loop
        "--model-class",
        model_class,
        "--model",
        "openai/{model}",
        "--environment-class",
        MINI_ENVIRONMENT_CLASS,
        "--task",
        "{instruction}",
        "--output",
        "{log_dir}/trajectory.json",
        "-c",
        cfg.mini_config or config_file,
        *(x for k, v in settings.items() for x in ("-c", f"{k}={v}")),
        *(x for spec in cfg.mini_overrides for x in ("-c", spec)),
    ]
    root = str(Path(tinkrl.__file__).resolve().parent.parent)  # the agent imports tinkrl's environment class
    env = {
        "MSWEA_CONFIGURED": "true",  # skip the first-run interactive setup
        "MSWEA_GLOBAL_CONFIG_DIR": "{log_dir}/mswea",  # its .env and logs per rollout, not in ~/.config
        "MSWEA_COST_TRACKING": "ignore_errors",
        "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2",  # a refused call (context full) ends the run soon
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm's price list from the package, not the network
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
        "PYTHONUNBUFFERED": "1",
    }
    return CommandAgent(argv, env)


def make_agent(cfg: ExternalAgentEnvConfig, settings: SamplingSettings) -> CommandAgent:
    """The configured agent for rollouts sampled with `settings` (temperature, tokens per call)."""
    max_tokens = cfg.max_tokens_per_call or settings.max_tokens
    fixed = {"temperature": repr(float(settings.temperature)), "max_tokens": str(max_tokens)}

    def fill(arg: str) -> str:
        return CommandAgent._substitute(arg, fixed)

    env = {k: fill(v) for k, v in cfg.agent_env.items()}
    env |= {"TINKRL_TEMPERATURE": fixed["temperature"], "TINKRL_MAX_TOKENS": fixed["max_tokens"]}
    env["TINKRL_STEP_LIMIT"] = str(cfg.step_limit)
    if cfg.agent == "mini-swe-agent":
        mini = mini_swe_agent_command(cfg, settings.temperature, max_tokens)
        return CommandAgent(mini.argv, {**mini.env, **env})
    return CommandAgent([fill(a) for a in cfg.command or []], env)


def annotate(rollout: ExternalRollout, task: Task, log_dir: Path, run_dir: Path) -> Trajectory:
    """The rollout's trajectory with its merge statistics as metrics and where its logs are, on its last turn."""
    traj = rollout.trajectory
    if traj.transitions:
        last = traj.transitions[-1]
        last.metrics.update({**rollout.stats.to_metrics(), "agent/timed_out": float(rollout.timed_out)})
        last.logs.update(
            {
                "tasks/task": task.id,
                "tasks/grade": rollout.grade_detail[:500],
                "agent/rollout_id": rollout.rollout_id,
                "agent/log_dir": str((log_dir / rollout.rollout_id).relative_to(run_dir)),
            }
        )
    return traj


class AgentGroupBuilder(EnvGroupBuilder):
    """`group_size` concurrent runs of the agent on one task; the builder runs them itself."""

    def __init__(
        self,
        task: Task,
        cfg: ExternalAgentEnvConfig,
        server: RunServer,
        provider: LazyProvider,
        group_size: int,
        log_dir: Path,
        run_dir: Path,
        tag: str,
    ):
        self.task, self.cfg, self.server, self.provider = task, cfg, server, provider
        self.group_size, self.log_dir, self.run_dir, self.tag = group_size, log_dir, run_dir, tag

    async def make_envs(self) -> Sequence[Env]:
        raise NotImplementedError("external agents are run by run_group, not stepped token by token")

    async def run_group(self, sampling_client: Any, settings: SamplingSettings) -> list[Trajectory]:
        runner = self.server.runner(sampling_client)
        agent = make_agent(self.cfg, settings)
        provider = await asyncio.to_thread(self.provider.get)
        rollouts = await gather_rollouts(
            settings,
            self.group_size,
            lambda _: runner.run_task(agent, self.task, provider, timeout_s=self.cfg.timeout_s, log_root=self.log_dir),
        )
        return [annotate(r, self.task, self.log_dir, self.run_dir) for r in rollouts]

    def logging_tags(self) -> list[str]:
        return [self.tag]


class StepTasksDataset(TasksDataset):
    """`TasksDataset` whose builders know the batch (step) they belong to, for per-step log folders."""

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        start = index * self.groups_per_batch
        return [self.make_builder((self.task_at(p), index)) for p in range(start, start + self.groups_per_batch)]


def build_datasets(cfg: ExternalAgentEnvConfig, ctx: EnvContext) -> EnvDatasets:
    """The gated training tasks and held-out tasks as groups of agent runs, one server for the run."""
    renderer_for(ctx.renderer, cfg.tool_format, ctx.key)  # a tool_format the renderer cannot write stops here
    if cfg.agent == "mini-swe-agent":
        try:
            mini_executable()
        except ConfigError as e:
            raise ConfigError(f"environments.{ctx.key}: {e}") from None
    train, test = cfg.split(cfg.load_tasks(), ctx.sandbox)
    if not train:
        raise ConfigError(f"environments.{ctx.key}: no training tasks left (all held out or failed the gate)")
    server = RunServer(ctx.model_name, tool_format=cfg.tool_format, max_context=cfg.max_context_tokens)
    agents_dir = ctx.run_dir / "agents"

    def builder(item: tuple[Task, int], group_size: int, folder: str | None = None) -> AgentGroupBuilder:
        task, index = item
        log_dir = agents_dir / (folder or f"step_{index}")
        return AgentGroupBuilder(task, cfg, server, ctx.sandbox, group_size, log_dir, ctx.run_dir, ctx.key)

    n_batches = math.ceil(cfg.epochs * len(train) / ctx.groups_per_batch)
    train_ds = StepTasksDataset(
        train, ctx.groups_per_batch, n_batches, ctx.seed, lambda item: builder(item, ctx.group_size)
    )
    test_ds = (
        StepTasksDataset(test, len(test), 1, ctx.seed, lambda item: builder(item, 1, "eval"), shuffle=False)
        if test
        else None
    )
    return EnvDatasets(train=train_ds, test=test_ds, close=server.close)
