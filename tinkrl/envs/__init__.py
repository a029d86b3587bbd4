"""The environment registry: names in the `environments:` map -> environment config classes.

Each environment type is a pydantic model (its own fields, `extra="forbid"`) with
`build(ctx: EnvContext) -> EnvDatasets`. A map key that is not a registered type (and has
no `type:`), e.g. `Owner/EnvName`, is a remote environment served over ORS (`openreward`).
Classes are imported lazily so `tinkrl train --help` and config errors stay instant.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from tinkrl.errors import ConfigError

if TYPE_CHECKING:
    from tinkrl.config import EnvEntry, TrainConfig
    from tinkrl.rl.types import RLDataset

# type name -> "module:ConfigClass"; presets add fixed field values.
ENV_TYPES: dict[str, str] = {
    "math": "tinkrl.envs.math.env:MathEnvConfig",
    "erdos": "tinkrl.envs.erdos.env:ErdosEnvConfig",
    "tasks": "tinkrl.envs.agent_tasks:TasksEnvConfig",
    "openreward": "tinkrl.envs.ors.env:OpenRewardEnvConfig",
}
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "arithmetic": ("math", {"dataset": "arithmetic"}),
    "gsm8k": ("math", {"dataset": "gsm8k"}),
    "math500": ("math", {"dataset": "math500"}),
    "hendrycks": ("math", {"dataset": "hendrycks"}),
    "polaris": ("math", {"dataset": "polaris"}),
}
ALIASES = {"MathConfig": "math", "ErdosConfig": "erdos", "TasksConfig": "tasks", "ArithmeticConfig": "arithmetic"}


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
    sandbox_provider: Callable[[], Any] = field(default=lambda: None)  # lazily made SandboxProvider
    eval_problems: int = 100


@dataclass
class EnvDatasets:
    train: RLDataset
    test: RLDataset | None = None
    # Called after each training step with the step's trajectory groups; returns extra metrics.
    on_step: Callable[[int, list], dict[str, float]] | None = None


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


def env_config_class(type_name: str):
    module, cls = ENV_TYPES[type_name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"environment type {type_name!r} is not available: {e}") from None


def make_env_config(key: str, entry: EnvEntry):
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


def validate_env_entries(config: TrainConfig) -> None:
    for key, entry in config.environments.items():
        make_env_config(key, entry)
