"""Config dialects: the spellings of the trainers tinkrl's users come from, mapped onto one config.

tinkrl reads three dialects into the same `TrainConfig`:

- `tinkrl`: its own keys (`tinkrl train --help`).
- `tinking` (the `tinking` trainer's key=value command line): `optim.lr`, `num_batches`,
  `env=MathConfig` / `env=ErdosConfig`, `minitb.dataset=NAME==VERSION`, `minitb.task_id`,
  `minitb.dataset_path`, `wandb.enabled/entity/project/run_name`, `log_path`. There `batch_size`
  counts rollouts per step (as in tinkrl) and W&B is on unless `wandb.enabled=False`.
- `openreward` (the OpenReward trainer's `tinker-config.yaml`): top-level `wandb_project_name`,
  `wandb_run_name`, `openreward_run_name`, `max_response_tokens`, `advantage_calculation`,
  `thinking`, and an `environments:` map whose entries set `num_rollouts` (their group size).
  There `batch_size` counts task groups per step, `log_path` is the directory each run logs
  under, and its own defaults apply (ppo, learning rate 4e-5, centered_normalized advantages,
  4096 tokens per reply, no thinking, seed 42).

The dialect is `dialect:` when the config sets it, else detected from keys only one dialect has;
the run's first line and `--dry-run` say which one was read and why, so nothing is guessed
silently. Keys of two dialects in one config are an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tinkrl.errors import ConfigError

DIALECTS = ("tinkrl", "tinking", "openreward")

# tinking's optimizer keys -> tinkrl's
_OPTIM_KEYS = {
    "lr": "learning_rate",
    "learning_rate": "learning_rate",
    "beta1": "adam_beta1",
    "beta2": "adam_beta2",
    "eps": "adam_eps",
    "weight_decay": "weight_decay",
    "grad_clip_norm": "grad_clip_norm",
}
# tinking's terminal-bench keys -> fields of the `tasks` environment
_MINITB_KEYS = {"dataset": "dataset", "dataset_path": "path", "task_id": "task_ids", "task_ids": "task_ids"}
# keys only the OpenReward trainer's config has (they identify the dialect)
_OPENREWARD_KEYS = ("wandb_project_name", "wandb_run_name", "openreward_run_name", "advantage_calculation")
# the OpenReward trainer's defaults where they differ from tinkrl's (its `Config`)
_OPENREWARD_DEFAULTS: list[tuple[str, Any]] = [
    ("loss_fn", "ppo"),
    ("learning_rate", 4e-5),
    ("adv_estimator", "centered_normalized"),
    ("max_tokens", 4096),
    ("thinking", False),
    ("seed", 42),
    ("runs_dir", "/tmp/tinker-rl"),
]
# its keys that become fields of each remote (ORS) environment
_OPENREWARD_ENV_KEYS = {"max_total_tokens": "max_total_tokens", "secrets": "secrets"}
_OPENREWARD_UNSUPPORTED = {
    "num_epochs": "tinkrl counts training steps: set max_steps",
    "system_prompt_template": "set each environment's env.system_prompt (the tool list is appended to it)",
    "tokenizer_name": "the tokenizer is the model's own",
    "max_rollout_retries": "a failed rollout is recorded and left out of its group (see max_failing_rollouts)",
    "max_active_tasks": "set max_concurrent_rollouts",
    "rollout_timeout": "set each environment's env.call_timeout_s",
}


@dataclass(frozen=True)
class Dialect:
    """The dialect a config was read in, and why (for the run's plan)."""

    name: str
    reason: str


Pair = tuple[str, Any]  # a dotted key and its value


def top_level_pairs(raw: dict) -> list[Pair]:
    """A config file's mapping as (key, value) pairs, sections whole; a seed trainer's own sections
    (tinking's `optim:` and `minitb:`) become dotted keys, as on its command line."""
    pairs: list[Pair] = []
    for key, value in raw.items():
        if key in ("optim", "minitb") and isinstance(value, dict):
            pairs += [(f"{key}.{k}", v) for k, v in value.items()]
        else:
            pairs.append((str(key), value))
    return pairs


def detect(pairs: list[Pair]) -> Dialect:
    """The dialect of a config's (dotted key, value) pairs: `dialect=` if set, else by dialect-only keys."""
    chosen = [v for k, v in pairs if k == "dialect"]
    if chosen and chosen[-1] not in (None, "auto"):  # the command line's dialect= wins over the file's
        if chosen[-1] not in DIALECTS:
            raise ConfigError(f"dialect: must be auto or one of {', '.join(DIALECTS)} (got {chosen[-1]!r})")
        return Dialect(str(chosen[-1]), "set in the config")
    tinking = [k if k != "env" else f"env={v}" for k, v in pairs if _is_tinking(k, v)]
    openreward = [k for k, _ in pairs if k in _OPENREWARD_KEYS]
    if tinking and openreward:
        raise ConfigError(
            f"the config mixes the tinking dialect ({tinking[0]}) and the openreward one ({openreward[0]}); "
            "write one of them, or set dialect=NAME"
        )
    if tinking:
        return Dialect("tinking", f"{tinking[0]} is the tinking trainer's spelling")
    if openreward:
        return Dialect("openreward", f"{openreward[0]} is an OpenReward trainer key")
    return Dialect("tinkrl", "no other dialect's keys")


def _is_tinking(key: str, value: Any) -> bool:
    if key.startswith(("optim.", "minitb.")):
        return True
    return key == "env" and isinstance(value, str) and value in ("MathConfig", "ErdosConfig")


def to_tinkrl(pairs: list[Pair], dialect: Dialect) -> list[Pair]:
    """The pairs in tinkrl's own keys: renamed, and with the dialect's own defaults first (so the
    user's keys still win)."""
    pairs = [(k, v) for k, v in pairs if k != "dialect"]
    if dialect.name == "tinking":
        return _tinking_pairs(pairs)
    if dialect.name == "openreward":
        return _OPENREWARD_DEFAULTS + _openreward_pairs(pairs)
    return pairs


def _tinking_pairs(pairs: list[Pair]) -> list[Pair]:
    out: list[Pair] = [("wandb.enabled", True)]  # tinking logs to W&B unless told not to
    for key, value in pairs:
        out += _tinking_pair(key, value)
    envs = {str(v) for k, v in out if k == "env"}
    if len(envs) > 1 and "tasks" in envs and any(k.startswith("minitb.") for k, _ in pairs):
        other = next(v for v in envs if v != "tasks")
        raise ConfigError(f"minitb.* picks the terminal-bench tasks environment; it cannot go with env={other}")
    return out


def _tinking_pair(key: str, value: Any) -> list[Pair]:
    if key.startswith("optim."):
        name = key.removeprefix("optim.")
        if name not in _OPTIM_KEYS:
            raise ConfigError(f"unknown config key {key!r}; optim keys tinkrl reads: {', '.join(_OPTIM_KEYS)}")
        return [(_OPTIM_KEYS[name], value)]
    if key.startswith("minitb."):
        name = key.removeprefix("minitb.")
        if name not in _MINITB_KEYS:
            raise ConfigError(f"unknown config key {key!r}; minitb keys tinkrl reads: {', '.join(_MINITB_KEYS)}")
        if name == "dataset_path":
            value = os.path.expanduser(str(value))
        if name in ("task_id", "task_ids") and not isinstance(value, list):
            value = [str(value)]
        return [("env", "tasks"), ("env." + _MINITB_KEYS[name], value)]
    if key == "env" and value == "MathConfig":
        return [("env", "math")]
    if key == "env" and value == "ErdosConfig":
        return [("env", "erdos")]
    return [(key, value)]


def _openreward_pairs(pairs: list[Pair]) -> list[Pair]:
    out: list[Pair] = []
    env_fields: list[Pair] = []  # top-level keys that go to every remote environment
    for key, value in pairs:
        if key in _OPENREWARD_UNSUPPORTED:
            raise ConfigError(f"{key}: not read by tinkrl ({_OPENREWARD_UNSUPPORTED[key]})")
        if key in _OPENREWARD_ENV_KEYS:
            env_fields.append((_OPENREWARD_ENV_KEYS[key], value))
        else:
            out += _openreward_pair(key, value)
    for key, entry in dict(out).get("environments", {}).items() if env_fields else ():
        if "/" in key and isinstance(entry, dict):  # a remote environment, Owner/Env
            out += [(f"environments.{key}.env.{field}", value) for field, value in env_fields]
    return out


def _openreward_pair(key: str, value: Any) -> list[Pair]:
    if key == "wandb_project_name":
        return [("wandb.project", value), ("wandb.enabled", bool(value))]
    if key == "wandb_run_name":
        return [("wandb.run_name", value)]
    if key == "openreward_run_name":
        return [("openreward.run_name", value), ("openreward.upload", bool(value))]
    if key == "batch_size":  # task groups per step there
        return [("groups_per_step", value)]
    if key == "log_path":  # where that trainer's runs log: each run gets its own directory under it
        return [("runs_dir", value)]
    if key == "max_response_tokens":
        return [("max_tokens", value)]
    if key == "advantage_calculation":
        return [("adv_estimator", value)]
    if key == "max_rollout_concurrency":
        return [("max_concurrent_rollouts", value)]
    return [(key, value)]
