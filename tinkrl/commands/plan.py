"""The plan of a training run: what a config resolves to, before any work.

`tinkrl train ... --dry-run` prints it as JSON; every run prints its one-line form first. Making
the plan reads files and the environment only: it contacts no service, downloads nothing and
loads no weights. A config that cannot run fails here with one line (a run directory of another
run), or its plan lists the problem under `problems` (W&B enabled without a login, a model the
local engine cannot train, a model whose renderer nothing names, an environment's `tool_format` its
renderer cannot write, a teacher on the other backend or with another tokenizer, a DPO reference of
another model, a Harbor sandbox environment that cannot run: no harness, a type Harbor lacks, missing
credentials), which stops a real run before any work. The Harbor check runs Harbor's own preflight in
the harness interpreter; it starts nothing. The renderer is tinker-cookbook's
recommendation for the model, or `renderer=`;
`renderer_reason` says which.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tinkrl.backends import choose_backend
from tinkrl.config import TeacherConfig, TrainConfig
from tinkrl.envs import make_env_config, resolve_type
from tinkrl.errors import ConfigError
from tinkrl.local.model_files import describe_model, unsupported_reason
from tinkrl.renderers import choose_renderer, names_help, recommend, tool_format_problem
from tinkrl.rl.checkpointer import Checkpointer
from tinkrl.rl.run_dir import check_run_dir
from tinkrl.rl.run_plan import RunPlan
from tinkrl.rl.teacher import Teacher, resolve_teacher, token_problem


def make_plan(config: TrainConfig) -> RunPlan:
    """The resolved run (see the module docstring)."""
    backend, backend_reason = choose_backend(config)
    config = config.model_copy(update={"backend": backend})
    try:
        renderer = choose_renderer(config.model_name, config.renderer, config.thinking)
    except ValueError as e:
        raise ConfigError(f"renderer: {e}") from None
    groups = config.groups_per_env()
    environments = {}
    for key, entry in config.environments.items():
        type_name, _ = resolve_type(key, entry)
        env_config = make_env_config(key, entry)
        environments[key] = {
            "type": type_name,
            "groups_per_step": groups[key],
            "group_size": config.group_size_for(key),
            "temperature": entry.temperature if entry.temperature is not None else config.temperature,
            "max_failing_rollouts": entry.max_failing_rollouts,
            "config": env_config.model_dump(mode="json"),
        }
        if hasattr(env_config, "describe_source"):
            environments[key]["source"] = env_config.describe_source()
    record = check_run_dir(config)
    start = Checkpointer(config.run_dir).steps_done() if record is not None else 0
    wandb = wandb_plan(config)
    problems = [wandb["problem"]] if "problem" in wandb else []
    if backend == "local" and (reason := unsupported_reason(config.model_name)):
        problems.append(reason)
    if renderer is None:
        problems.append(
            f"no renderer for model {config.model_name!r}: no rule names its family and no ChatML tokenizer of it "
            f"is on this machine. Choose its chat format with renderer=NAME: {names_help()}"
        )
    for key, env in environments.items():
        tool_format = env["config"].get("tool_format", "hermes")
        if renderer is not None and (problem := tool_format_problem(renderer, tool_format)):
            problems.append(f"environments.{key}: {problem}")
    teacher = resolve_teacher(config.teacher)
    if teacher is not None:
        problems += _teacher_problems(config, teacher)
    if config.dpo.pairs:
        problems += _reference_problems(config)
    if config.sandbox.provider == "harbor":
        from tinkrl.sandbox.harbor import preflight

        if (problem := preflight(config.sandbox.harbor)) is not None:
            problems.append(problem)
    return RunPlan(
        config=config,
        backend_reason=backend_reason,
        model=describe_model(config.model_name) if backend == "local" else "on the Tinker service",
        renderer=renderer,
        renderer_reason=_renderer_reason(config, renderer),
        environments=environments,
        wandb=wandb,
        start=_start_text(config, record is not None, start),
        problems=problems,
        teacher=teacher,
    )


def _teacher_problems(config: TrainConfig, teacher: Teacher) -> list[str]:
    """Why the run cannot distil from `teacher`: its weights are on the other backend, the local engine cannot
    run its model, or it tokenizes differently from the student."""
    problems = []
    where = "this machine" if teacher.local else "the Tinker service"
    if teacher.model_path is not None and teacher.local != (config.backend == "local"):
        problems.append(
            f"teacher: checkpoint {teacher.model_path} is on {where}, but the run trains on backend {config.backend}"
        )
    if teacher.model_path is None and config.backend == "local" and (reason := unsupported_reason(teacher.base_model)):
        problems.append(f"teacher: {reason}")
    if problem := token_problem(config.model_name, teacher):
        problems.append(problem)
    return problems


def _reference_problems(config: TrainConfig) -> list[str]:
    """Why DPO cannot score its pairs with `dpo.reference`: a checkpoint on the other backend, or of another
    base model than the one trained (its logprobs would be of other weights' tokens)."""
    if config.dpo.reference == "base":
        return []
    try:
        ref = resolve_teacher(TeacherConfig(model=config.dpo.reference))
    except ConfigError as e:
        return [f"dpo.reference: {str(e).removeprefix('teacher: ')}"]
    assert ref is not None
    if ref.model_path is None:
        return [
            f"dpo.reference: {ref.source} is not a checkpoint or run directory (base, or a checkpoint of the model)"
        ]
    if ref.local != (config.backend == "local"):
        where = "this machine" if ref.local else "the Tinker service"
        return [f"dpo.reference: {ref.model_path} is on {where}, but the run trains on backend {config.backend}"]
    if ref.base_model is not None and ref.base_model != config.model_name:
        return [
            f"dpo.reference: {ref.source} is a checkpoint of {ref.base_model}, but the run trains {config.model_name}"
        ]
    return []


def _renderer_reason(config: TrainConfig, renderer: str | None) -> str:
    """Why the run renders with `renderer`: the config's choice or the model's recommendation, and the thinking switch."""
    found = recommend(config.model_name)
    reason = "set in the config" if config.renderer else found.reason if found else "no rule names this model"
    if renderer is not None and config.thinking is not None:
        reason += f", thinking={str(config.thinking).lower()}"
    return reason


def _start_text(config: TrainConfig, owned: bool, step: int) -> str:
    if owned and step >= config.max_steps:
        return f"finished: {step} of max_steps={config.max_steps} steps trained, nothing to do"
    if owned and step:
        return f"resumes its own checkpoint at step {step}"
    if config.resume_from:
        return f"new run from checkpoint {config.resume_from} (weights and optimizer state)"
    return "new run, fresh LoRA"


def wandb_plan(config: TrainConfig) -> dict[str, Any]:
    """Where W&B logging goes; `problem` says why it cannot log, when it cannot."""
    w = config.wandb
    if not w.enabled:
        return {"enabled": False}
    mode = os.environ.get("WANDB_MODE", "online")
    plan = {
        "enabled": True,
        "entity": w.entity,
        "project": w.project or "tinkrl",
        "run_name": w.run_name or config.run_name or config.run_dir.name,
        "mode": mode,
    }
    if mode not in ("offline", "disabled", "dryrun") and not _wandb_logged_in():
        plan["problem"] = (
            "W&B logging is on (wandb.enabled) but no W&B login was found: run `wandb login`, set WANDB_API_KEY, "
            "WANDB_MODE=offline, or wandb.enabled=False"
        )
    return plan


def _wandb_logged_in() -> bool:
    """WANDB_API_KEY is set, or `wandb login` left a key for the W&B host in the netrc file."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc")).expanduser()
    return netrc.is_file() and host in netrc.read_text(errors="replace")
