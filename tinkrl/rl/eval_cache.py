"""Evals of a model that never changes, kept on disk: the untrained model's held-out eval.

What it scores depends only on the model, the held-out set (each test builder's `eval_key`) and
the eval settings, so the result is kept under `$TINKRL_HOME/cache/evals/<digest>.json` and a
later run with the same ones reads it instead of evaluating again. A held-out set whose builders
cannot name themselves is never cached.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tinkrl.local.model_files import tinkrl_home
from tinkrl.rl.types import EnvDatasets, Metrics

CACHE_VERSION = 1  # raised when what an eval reports changes, so older entries are not read


def cache_dir() -> Path:
    """Where kept evals live."""
    return tinkrl_home() / "cache" / "evals"


def held_out_identity(envs: dict[str, EnvDatasets]) -> list[list[Any]] | None:
    """Each environment's key and its test builders' `eval_key`s; None when a builder has none."""
    out: list[list[Any]] = []
    for key, env in envs.items():
        if env.test is None:
            continue
        keys = [b.eval_key() for b in env.test.get_batch(0)]
        if any(k is None for k in keys):
            return None
        out.append([key, keys])
    return out


def eval_digest(model_name: str, settings: dict[str, Any], envs: dict[str, EnvDatasets]) -> str | None:
    """The cache key of an eval of `model_name` with `settings` on `envs`' held-out sets (None: not cacheable)."""
    identity = held_out_identity(envs)
    if identity is None:
        return None
    blob = json.dumps([CACHE_VERSION, model_name, settings, identity], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def read_eval(digest: str) -> Metrics | None:
    """The kept metrics of `digest`, or None when there are none (or the file cannot be read)."""
    path = cache_dir() / f"{digest}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    metrics = data.get("metrics") if isinstance(data, dict) else None
    return {k: float("nan") if v is None else v for k, v in metrics.items()} if isinstance(metrics, dict) else None


def write_eval(digest: str, metrics: Metrics, about: dict[str, Any]) -> None:
    """Keep `metrics` under `digest` (written whole, or not at all); `about` says what was evaluated."""
    path = cache_dir() / f"{digest}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    clean = {k: None if isinstance(v, float) and v != v else v for k, v in metrics.items()}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"about": about, "metrics": clean}, indent=1) + "\n")
    os.replace(tmp, path)
