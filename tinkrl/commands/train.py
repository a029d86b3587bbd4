"""`tinkrl train [CONFIG.yaml] [key=value ...]`: a training run from a config.

Reads the config (YAML plus dotted overrides, `--config_path X --overrides a=b ...` too, in
any dialect), resolves its environments, prints the run's plan (`tinkrl.commands.plan`; with
`--dry-run` as JSON, and stops there), and runs the RL loop (`tinkrl.rl.train`). `--prepare` pays
the job's one-time costs on this machine instead (`make install` runs it for the default job), so a
timed run does not. `--help` prints every config key with its default and documentation. Neither
`--help` nor a config error imports torch, so both answer at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sys
import tempfile
import time
import typing
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from tinkrl.config import TrainConfig, load_config, load_dotenv_file
from tinkrl.errors import ConfigError, TinkrlError

if typing.TYPE_CHECKING:
    from tinkrl.rl.run_plan import RunPlan

USAGE = """usage: tinkrl train [CONFIG.yaml] [key=value ...] [--dry-run | --prepare]
       tinkrl train --config_path CONFIG.yaml --overrides key=value ... [--dry-run | --prepare]

Dotted keys reach nested fields (wandb.project=x); env=NAME env.field=value picks one
environment (e.g. env=arithmetic env.max_value=999). The tinking trainer's keys (optim.lr,
num_batches, env=MathConfig, minitb.*) and the OpenReward trainer's tinker-config.yaml are read
as their sources meant (dialect=auto). --dry-run prints the resolved plan as JSON and exits.
--prepare pays what the job costs once per machine on the embedded engine (the model's files, the
kernels, the compiled training step) by one step in a scratch directory, then exits."""

# One step of the job, nothing else: no evals, checkpoints, warm start or logging beyond the scratch run.
PREPARE = ("max_steps=1", "eval_every=0", "eval_problems=0", "save_every=0", "time_budget_s=null",
           "warm_start.steps=0", "wandb.enabled=false", "docent.export_every=0")  # fmt: skip


def parse_cli(argv: list[str]) -> tuple[str | None, list[str], str | None]:
    """(config path or None, key=value overrides, "dry-run" / "prepare" / None) from the command line;
    `-h` prints the help and exits."""
    config_path, overrides, mode, i = None, [], None, 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            raise SystemExit(print(help_text()) or 0)
        if a in ("--dry-run", "--dry_run", "--prepare"):
            if mode is not None and mode != a.lstrip("-").replace("_", "-"):
                raise ConfigError("--dry-run and --prepare exclude each other")
            mode, i = a.lstrip("-").replace("_", "-"), i + 1
            continue
        if a in ("--config_path", "--config-path", "--config"):
            if i + 1 >= len(argv):
                raise ConfigError(f"{a} needs a file name")
            config_path, i = argv[i + 1], i + 2
            continue
        if a == "--overrides":
            i += 1
            while i < len(argv) and not argv[i].startswith("--"):
                overrides.append(argv[i])
                i += 1
            continue
        if "=" not in a and (a.endswith((".yaml", ".yml")) or Path(a).is_file()) and config_path is None:
            config_path = a
        else:
            overrides.append(a)
        i += 1
    return config_path, overrides, mode


def help_text() -> str:
    """The usage line and every config key: type, default and documentation."""
    return USAGE + "\n\nkeys:\n" + "\n".join(_field_lines(TrainConfig, ""))


def _field_lines(model: type[BaseModel], prefix: str) -> list[str]:
    lines = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        nested = _section_model(field.annotation)
        default = "" if nested or field.default_factory else f" = {field.default!r}"
        doc = " ".join((field.description or "").split())
        lines.append(f"  {key}{default}\n      {doc}" if doc else f"  {key}{default}")
        if nested is not None:
            lines += _field_lines(nested, key + ".")
    return lines


def _section_model(annotation) -> type[BaseModel] | None:
    """The config section class of a field (`SandboxConfig`, `AsyncConfig | None`), else None (also for a
    map of sections such as `environments`, whose keys are the user's)."""
    if typing.get_origin(annotation) is dict:
        return None
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def load(config_path: str | None, overrides: list[str]) -> TrainConfig:
    """The run config with its environments checked and their defaults applied (ConfigError if bad)."""
    config = load_config(config_path, overrides)
    from tinkrl.envs import resolve_config  # after the config loads: a bad key never waits for imports

    return resolve_config(config)


def run(plan: RunPlan) -> dict[str, float]:
    """Train the planned run to the end; returns the last step's metrics."""
    from tinkrl.envs import build_environments, checkpoint_metadata
    from tinkrl.rl.train import main

    config = plan.config
    factory = lambda renderer, run_dir: build_environments(config, renderer, run_dir)  # noqa: E731
    return asyncio.run(main(plan, factory, checkpoint_metadata(config)))


def prepare(plan: RunPlan) -> None:
    """One step of the planned job on the embedded engine in a scratch run directory, removed after with
    the checkpoint it saved: what stays is what every later run of the job reuses (the model's files under
    $TINKRL_HOME/models, the kernels and the compiled training layers under ~/.cache/tinkrl)."""
    from tinkrl.local.checkpoint_paths import checkpoint_dir
    from tinkrl.tracking import read_jsonl

    config, t0 = plan.config, time.time()
    try:
        run(plan)
    finally:
        for row in read_jsonl(config.run_dir / "checkpoints.jsonl"):
            for key in ("state_path", "sampler_path"):
                if row.get(key):
                    shutil.rmtree(checkpoint_dir(row[key]).parents[1], ignore_errors=True)  # <run_id>/
    print(f"prepared {config.model_name} for this job in {time.time() - t0:.0f}s: later runs start warm")


def cli_main(argv: list[str]) -> int:
    """`tinkrl train`: exit 0 when the run finishes (or the dry run's plan is printed, or the job is
    prepared), 2 on a config error, 1 on another error."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    load_dotenv_file()
    try:
        config_path, overrides, mode = parse_cli(argv)
    except ConfigError as e:
        print(f"tinkrl train: error: {e}", file=sys.stderr)
        return 2
    if mode != "prepare":
        return _train(config_path, overrides, mode)
    with tempfile.TemporaryDirectory(prefix="tinkrl-prepare-") as scratch:
        return _train(config_path, [*overrides, *PREPARE, f"log_path={scratch}/run"], mode)


def _train(config_path: str | None, overrides: list[str], mode: str | None) -> int:
    """Load, plan and run (or only print the plan, or prepare): `cli_main`'s work and exit code."""
    try:
        config = load(config_path, overrides)
        if config.dpo.pairs:
            raise ConfigError("dpo.pairs are preference pairs for tinkrl dpo; tinkrl train trains with rewards")
        from tinkrl.commands.plan import make_plan

        plan = make_plan(config)
    except ConfigError as e:
        print(f"tinkrl train: error: {e}", file=sys.stderr)
        return 2
    if mode == "dry-run":
        print(json.dumps(plan.as_dict(), indent=2))
        return 0
    if mode == "prepare" and plan.backend != "local":
        print(f"tinkrl train --prepare: nothing to prepare on backend {plan.backend} (the service holds the model)")
        return 0
    return carry_out("tinkrl train", plan, lambda: prepare(plan) if mode == "prepare" else run(plan))


def carry_out(program: str, plan: RunPlan, work: Callable[[], object]) -> int:
    """Print the plan's line, then stop on its first problem (exit 2) or on a run already finished (0), else
    do `work`: 0 when it finishes, 2 on a config error, 1 on another tinkrl or service error, each one line
    on stderr named by `program` (`tinkrl train`, `tinkrl dpo`)."""
    print(plan.line(), flush=True)
    if plan.problems:
        print(f"{program}: error: {plan.problems[0]}", file=sys.stderr)
        return 2
    if plan.finished:
        print(f"{plan.config.run_dir}: {plan.start} (raise max_steps to train it further)")
        return 0
    try:
        work()
    except ConfigError as e:
        print(f"{program}: error: {e}", file=sys.stderr)
        return 2
    except TinkrlError as e:
        print(f"{program}: {e}", file=sys.stderr)
        return 1
    except Exception as e:
        from tinkrl.backends import service_failure

        if (line := service_failure(e)) is None:
            raise
        print(f"{program}: {line}", file=sys.stderr)
        return 1
    return 0
