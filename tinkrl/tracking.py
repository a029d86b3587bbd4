"""Run logging: `metrics.jsonl` (one line per step), `checkpoints.jsonl`, rollouts, episodes, the warm
start's `warm_start.jsonl`, and W&B.

`metrics.jsonl` never holds a step twice: on resume, lines at or after the resumed step are
dropped before new ones are appended. A line is appended whole or not at all: a write that
fails (a full disk) is cut back to where the line began, and the run stops with one line
saying which file could not be written (`RunDirWriteError`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tinkrl.errors import TinkrlError


class RunDirWriteError(TinkrlError):
    """A file of the run directory could not be written (a full disk, a file size limit); nothing partial was kept
    in its JSONL files."""


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn an OSError while writing `path` into a one-line `RunDirWriteError` that says how to go on."""
    try:
        yield
    except OSError as e:
        raise RunDirWriteError(
            f"cannot write {path}: {e.strerror or e}; the run stopped after its last complete line. "
            "Free space and run the same command again to resume"
        ) from e


def _clean(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSONL file ([] when it is absent); a line cut short by a kill is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill mid-write
            continue
    return rows


def append_jsonl(path: Path, row: dict) -> None:
    """Append one row to a JSONL file, NaN and infinities as null: the whole line or, when the write fails
    (`RunDirWriteError`), nothing (the file is cut back to where the line began)."""
    data = (json.dumps({k: _clean(v) for k, v in row.items()}) + "\n").encode()
    with writing(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            start = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:  # a nearly full disk takes part of a write, then refuses the rest
                    view = view[os.write(fd, view) :]
            except OSError:
                os.ftruncate(fd, start)
                raise
        finally:
            os.close(fd)


class RunLogger:
    """Writes a run's metrics.jsonl and per-step rollout files, and logs to W&B when enabled."""

    def __init__(self, run_dir: Path, config_dump: dict, wandb_cfg, *, run_name: str, run_id: str, resume_step: int):
        """`run_id` is the run's own (the W&B run id: a resumed run continues its W&B run, a new one starts
        another even under the same name)."""
        self.run_dir = run_dir
        self.metrics_path = run_dir / "metrics.jsonl"
        rows = [r for r in read_jsonl(self.metrics_path) if r.get("step", -1) < resume_step]
        with writing(self.metrics_path):
            self.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            (run_dir / "rollouts").mkdir(parents=True, exist_ok=True)
        self.wandb = None
        if wandb_cfg.enabled:
            import wandb

            self.wandb = wandb.init(
                entity=wandb_cfg.entity,
                project=wandb_cfg.project or "tinkrl",
                name=wandb_cfg.run_name or run_name,
                config=config_dump,
                id=run_id,
                resume="allow",
                dir=str(run_dir),
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        append_jsonl(self.metrics_path, {"step": step, **metrics})
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

    def write_rollouts(self, step: int, rows: list[dict], kind: str = "rollouts") -> None:
        """A step's rows in `<kind>/step_NNNNNN.jsonl`: `rollouts` (trained sequences), `episodes` (every
        episode with what its environment logged) or `evals` (the held-out episodes of the eval of the
        weights after that many steps)."""
        path = self.run_dir / kind / f"step_{step:06d}.jsonl"
        with writing(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

    def write_phase(self, row: dict) -> None:
        """A line of `warm_start.jsonl`: the evaluation before the warm start and each supervised step."""
        append_jsonl(self.run_dir / "warm_start.jsonl", row)

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()
