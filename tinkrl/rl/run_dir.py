"""A run directory belongs to one run.

`run.json` in the run directory names its run: a unique id (also the W&B run id) and what
makes checkpoints interchangeable: model, backend, LoRA rank and environments. A run starts
in an empty (or new) directory, or resumes its own checkpoints there; a directory that holds
another run (or a run directory from before `run.json`, judged by its `config.yaml`) stops the
run before any work with one line naming the directory and the ways on.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from tinkrl.config import TrainConfig
from tinkrl.errors import ConfigError
from tinkrl.tracking import writing

RUN_FILE = "run.json"


@dataclass(frozen=True)
class RunRecord:
    """Who a run directory belongs to."""

    run_id: str
    created: str
    identity: dict[str, Any]


def identity_of(dump: dict[str, Any]) -> dict[str, Any]:
    """What a resumed run must share with the run that saved the checkpoints, from a config dump."""
    envs = dump.get("environments") or {}
    return {
        "model_name": dump.get("model_name"),
        "backend": dump.get("backend"),
        "lora_rank": dump.get("lora_rank"),
        "environments": {
            key: {"type": e.get("type") or key, "name": e.get("name"), "env": e.get("env") or {}}
            for key, e in envs.items()
        },
    }


def _differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    diffs = []
    for key in ("model_name", "backend", "lora_rank"):
        if old.get(key) != new.get(key):
            diffs.append(f"{key} {old.get(key)!r} there, {new.get(key)!r} here")
    if old.get("environments") != new.get("environments"):
        diffs.append(
            f"environments {json.dumps(old.get('environments'))} there, {json.dumps(new.get('environments'))} here"
        )
    return "; ".join(diffs)


def read_record(run_dir: Path) -> RunRecord | None:
    """The run that owns `run_dir`: its run.json, else one made from a run directory's config.yaml when it
    has checkpoints (directories from before run.json), else None."""
    path = run_dir / RUN_FILE
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            return RunRecord(str(data["run_id"]), str(data.get("created", "")), dict(data["identity"]))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ConfigError(
                f"{path} is not a tinkrl run record ({e}); move it away or choose another log_path"
            ) from None
    config_yaml, checkpoints = run_dir / "config.yaml", run_dir / "checkpoints.jsonl"
    if checkpoints.is_file() and config_yaml.is_file():
        try:
            dump = yaml.safe_load(config_yaml.read_text()) or {}
        except yaml.YAMLError:
            dump = {}
        return RunRecord(str(dump.get("run_name") or run_dir.name), "", identity_of(dump))
    return None


def holds_run(path: Path) -> bool:
    """Whether `path` is a tinkrl training run's directory (it has the run's config.yaml or checkpoints.jsonl),
    as a teacher or a source of preference pairs may name one."""
    return path.is_dir() and ((path / "config.yaml").is_file() or (path / "checkpoints.jsonl").is_file())


def trained_model(run_dir: Path) -> str | None:
    """The model a run directory's run trained (`model_name` of its config.yaml), or None."""
    config = run_dir / "config.yaml"
    if not config.is_file():
        return None
    data = yaml.safe_load(config.read_text()) or {}
    return data.get("model_name") if isinstance(data, dict) else None


def new_run_hint(config: TrainConfig) -> str:
    """How to start a new run instead of this directory's: a new run_name, or a new log_path when one is set."""
    return "log_path=NEW_DIR" if config.log_path else "run_name=NEW (or log_path=NEW_DIR)"


def _has_work(run_dir: Path) -> bool:
    """The directory holds a logged step or a checkpoint (a run that failed before its first step holds neither)."""
    return any(
        (run_dir / name).is_file() and (run_dir / name).stat().st_size
        for name in ("metrics.jsonl", "checkpoints.jsonl")
    )


def check_run_dir(config: TrainConfig) -> RunRecord | None:
    """The record of the run `config` would resume in its directory (None: it starts a new one, also over a
    run that stopped before its first step); a directory that holds another run's work is a ConfigError.
    Reads files only."""
    record = read_record(config.run_dir)
    if record is None or not _has_work(config.run_dir):
        return None
    here = identity_of(config.model_dump(mode="json", by_alias=True))
    diffs = _differences(record.identity, here)
    if diffs:
        raise ConfigError(
            f"{config.run_dir} holds another run ({diffs}); resume it with its own config, or start a new run "
            f"with {new_run_hint(config)}"
        )
    return record


def record_compute(run_dir: Path, compute: dict[str, Any]) -> None:
    """Keep in run.json how the embedded engine computed this run (its compute plan; the latest start's)."""
    path = run_dir / RUN_FILE
    with writing(path):
        data = json.loads(path.read_text())
        data["compute"] = compute
        path.write_text(json.dumps(data, indent=2) + "\n")


def claim_run_dir(config: TrainConfig) -> RunRecord:
    """The run directory's record, made (with a fresh run id) when the run is new; see `check_run_dir`."""
    record = check_run_dir(config)
    run_dir = config.run_dir
    with writing(run_dir / RUN_FILE):
        run_dir.mkdir(parents=True, exist_ok=True)
        if record is None:
            record = RunRecord(
                run_id=uuid.uuid4().hex[:12],
                created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                identity=identity_of(config.model_dump(mode="json", by_alias=True)),
            )
            (run_dir / RUN_FILE).write_text(json.dumps(asdict(record), indent=2) + "\n")
    return record
