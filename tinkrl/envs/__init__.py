"""The environment registry: names in the `environments:` map -> environment types.

Each type is a config class (a pydantic model of its own fields, `extra="forbid"`, in a light
`config.py` that imports no SDK type) and a builder `(config, EnvContext) -> EnvDatasets`
(imported only when a run builds the environment). A config class may declare `run_defaults`:
config values the run takes when every environment asks for them and the user set none. A map
key that is not a registered type (and has no `type:`), e.g. `Owner/EnvName`, is a remote
environment served over ORS (`openreward`). Nothing here loads torch, so `tinkrl train --help`
and config errors answer at once.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from tinkrl.config import EnvEntry, TrainConfig
from tinkrl.errors import ConfigError
from tinkrl.sandbox import LazyProvider, get_provider

if TYPE_CHECKING:  # the registry itself stays light: the SDK's types import torch
    from tinkrl.rl.types import EnvDatasets

# type name -> its config class and its builder `(config, EnvContext) -> EnvDatasets`, as "module:name"
# (imported on use: config modules are light, builders load the environment's code and the SDK types).
ENV_TYPES: dict[str, tuple[str, str]] = {
    "math": ("tinkrl.envs.math.config:MathEnvConfig", "tinkrl.envs.math.env:build_datasets"),
    "erdos": ("tinkrl.envs.erdos.config:ErdosEnvConfig", "tinkrl.envs.erdos.env:build_datasets"),
    "tasks": ("tinkrl.envs.agent_tasks.config:TasksEnvConfig", "tinkrl.envs.agent_tasks.env:build_datasets"),
    "shell": ("tinkrl.envs.shell.config:ShellEnvConfig", "tinkrl.envs.shell.env:build_datasets"),
    "openreward": ("tinkrl.envs.ors.config:OpenRewardEnvConfig", "tinkrl.envs.ors.env:build_datasets"),
    "verifiers": ("tinkrl.envs.verifiers.config:VerifiersEnvConfig", "tinkrl.envs.verifiers.env:build_datasets"),
    "external_agent": (
        "tinkrl.envs.external_agent.config:ExternalAgentEnvConfig",
        "tinkrl.envs.external_agent.env:build_datasets",
    ),
}
# presets: a name for a type with some of its fields fixed
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "arithmetic": ("math", {"dataset": "arithmetic"}),
    "gsm8k": ("math", {"dataset": "gsm8k"}),
    "math500": ("math", {"dataset": "math500"}),
    "hendrycks": ("math", {"dataset": "hendrycks"}),
    "polaris": ("math", {"dataset": "polaris"}),
}
ALIASES = {
    "MathConfig": "math",
    "ErdosConfig": "erdos",
    "TasksConfig": "tasks",
    "ShellConfig": "shell",
    "ArithmeticConfig": "arithmetic",
}


@dataclass
class EnvContext:
    """What an environment needs from the run to build its datasets."""

    key: str  # the environments-map key (metrics go under env/<key>/...)
    entry: EnvEntry
    renderer: Any  # tinkrl.renderers.ChatMLRenderer
    model_name: str
    group_size: int
    groups_per_batch: int
    max_tokens: int
    run_dir: Path
    seed: int
    sandbox: LazyProvider = field(default_factory=LazyProvider)  # the run's sandboxes, made on first use
    eval_problems: int = 100
    train_config: TrainConfig | None = None  # the whole run's config (e.g. for uploads naming the run)


def resolve_type(key: str, entry: EnvEntry) -> tuple[str, dict[str, Any]]:
    """(registered type, preset fields) for a map entry."""
    name = ALIASES.get(entry.type or key, entry.type or key)
    if name in PRESETS:
        return PRESETS[name]
    if name in ENV_TYPES:
        return name, {}
    if entry.type is None and ("/" in key or entry.base_url or entry.name):
        return "openreward", {}
    known = sorted(set(ENV_TYPES) | set(PRESETS) | set(ALIASES))
    raise ConfigError(
        f"environments.{key}: unknown environment {name!r}; known: {', '.join(known)} "
        f"(remote ORS environments are named Owner/Env or given base_url)"
    )


def _load(type_name: str, which: int) -> Any:
    module, name = ENV_TYPES[type_name][which].split(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"environment type {type_name!r} is not available: {e}") from None


def env_config_class(type_name: str) -> type:
    """The config class of a registered environment type."""
    return _load(type_name, 0)


def make_env_config(key: str, entry: EnvEntry):
    """The entry's environment config (its `env:` fields and preset validated), or a one-line ConfigError."""
    type_name, preset = resolve_type(key, entry)
    cls = env_config_class(type_name)
    fields = {**preset, **entry.env}
    for k, v in preset.items():
        if entry.env.get(k, v) != v:
            raise ConfigError(f"environments.{key}.env.{k}: fixed to {v!r} by the {key!r} preset")
    try:
        return cls.model_validate(fields)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(sorted(cls.model_fields))
            raise ConfigError(f"environments.{key}.env: unknown key {loc!r}; allowed: {allowed}") from None
        raise ConfigError(f"environments.{key}.env.{loc}: {err['msg']} (got {err.get('input')!r})") from None


def resolve_config(config: TrainConfig) -> TrainConfig:
    """Check each environment's own fields, and apply the run defaults its environment type asks for
    (a config class's `run_defaults`, e.g. erdos: the entropic advantage estimator) where the user set
    none and every environment of the run agrees."""
    wanted = [getattr(type(make_env_config(k, e)), "run_defaults", {}) for k, e in config.environments.items()]
    for name in set().union(*wanted):
        agreed = all(name in d and d[name] == wanted[0][name] for d in wanted)
        if agreed and name not in config.model_fields_set:
            setattr(config, name, wanted[0][name])
    return config


# what evaluating a checkpoint needs to act as it was trained, and to get as many turns
AGENT_SETTINGS = ("action_format", "tool_format", "max_turns")


def checkpoint_metadata(config: TrainConfig) -> dict[str, str]:
    """What a run's checkpoints should carry for `tinkrl eval --checkpoint`: the agent settings
    (`action_format`, `tool_format`, `max_turns`) its environments agree on."""
    out: dict[str, str] = {}
    configs = [make_env_config(k, e) for k, e in config.environments.items()]
    for name in AGENT_SETTINGS:
        values = {str(getattr(c, name)) for c in configs if hasattr(c, name)}
        if len(values) == 1:
            out[name] = values.pop()
    return out


def build_environments(config: TrainConfig, renderer: Any, run_dir: Path) -> dict[str, EnvDatasets]:
    """Every environment of the run, by key, with datasets of its share of each step's groups."""
    sandbox = LazyProvider(lambda: get_provider(config.sandbox.provider, **config.sandbox.provider_options()))
    envs = {}
    for key, groups in config.groups_per_env().items():
        entry = config.environments[key]
        ctx = EnvContext(
            key=key,
            entry=entry,
            renderer=renderer,
            model_name=config.model_name,
            group_size=config.group_size_for(key),
            groups_per_batch=groups,
            max_tokens=config.max_tokens,
            run_dir=run_dir,
            seed=config.seed,
            sandbox=sandbox,
            eval_problems=config.eval_problems,
            train_config=config,
        )
        envs[key] = build_env(key, entry, ctx)
        envs[key].sandboxes = sandbox.summary
    return envs


def build_env(key: str, entry: EnvEntry, ctx: EnvContext) -> EnvDatasets:
    """One `environments:` entry's datasets, built by its type's builder."""
    type_name, _ = resolve_type(key, entry)
    return _load(type_name, 1)(make_env_config(key, entry), ctx)
