"""Reading what runs leave behind, for the viewer and trace exports.

A training run directory holds `run.json`, `config.yaml`, `metrics.jsonl`, `warm_start.jsonl` and
`episodes/step_NNNNNN.jsonl` (every episode of a step); a `tinkrl eval` output directory holds
`results.json` (per-task table) and `results.jsonl` (one trial per line). Both kinds of episode are
read into one shape, `Episode`: where it came from, its numbers, and its transcript as chat messages.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinkrl.tracking import read_jsonl

STEP_FILE = re.compile(r"step_(\d+)\.jsonl$")
ORS_LOG_KEY = "openreward.rollout"  # the log key an ORS episode's record (messages, rewards) is under
# log keys shown as the episode's fields rather than among its other logs
_FIELD_KEYS = {"tasks/task", "tasks/end", "tasks/grade", "tasks/transcript", "transcript", ORS_LOG_KEY}
_ROW_KEYS = {
    "step",
    "env",
    "group",
    "episode",
    "reward",
    "advantage",
    "trained",
    "turns",
    "ac_tokens",
    "ob_tokens",
    "truncated",
    "tags",
    "failure_mode",
    "failure_detail",
}


@dataclass
class Episode:
    """One episode of a training step or one trial of an evaluation, as the viewer and exports show it."""

    id: str  # unique within its run: "s<step>/<env>/g<group>/e<episode>" or "<task>/a<attempt>"
    source: str  # "train" or "eval"
    step: int | None
    env: str
    group: int | None
    episode: int | None
    task: str
    reward: float | None
    advantage: float | None = None
    trained: bool = False
    turns: int = 0
    ac_tokens: int = 0
    ob_tokens: int = 0
    truncated: bool = False
    failure_mode: str | None = None
    failure_detail: str = ""
    end: str = ""
    grade: str = ""
    messages: list[dict] = field(default_factory=list)
    logs: dict[str, Any] = field(default_factory=dict)


def _task_of(row: dict) -> str:
    for key in ("tasks/task", "problem_id", "erdos/parent"):
        if row.get(key):
            return str(row[key])
    return ""


def episode_from_row(row: dict, index: int | None = None) -> Episode:
    """An `episodes/step_*.jsonl` row as an Episode; `index` numbers it within its group when the row
    carries no `episode` (runs written before rows had one)."""
    messages = row.get("tasks/transcript") or row.get("transcript") or []
    ors = row.get(ORS_LOG_KEY)
    if ors:  # an ORS env's record carries the chat messages it exchanged
        record = json.loads(ors) if isinstance(ors, str) else ors
        messages = record.get("messages") or messages
    step, env, group = row.get("step"), str(row.get("env", "")), row.get("group")
    ep = row.get("episode", index)
    failed = row.get("failure_mode") is not None
    return Episode(
        id=f"s{step}/{env}/g{group}/" + ("failed" if failed else f"e{ep}"),
        source="train",
        step=step,
        env=env,
        group=group,
        episode=ep,
        task=_task_of(row),
        reward=row.get("reward"),
        advantage=row.get("advantage"),
        trained=bool(row.get("trained", False)),
        turns=int(row.get("turns") or 0),
        ac_tokens=int(row.get("ac_tokens") or 0),
        ob_tokens=int(row.get("ob_tokens") or 0),
        truncated=bool(row.get("truncated", False)),
        failure_mode=row.get("failure_mode"),
        failure_detail=str(row.get("failure_detail") or ""),
        end=str(row.get("tasks/end") or ""),
        grade=str(row.get("tasks/grade") or row.get("grade") or ""),
        messages=list(messages),
        logs={k: v for k, v in row.items() if k not in _FIELD_KEYS and k not in _ROW_KEYS},
    )


def episode_from_trial(trial: dict, env: str = "eval") -> Episode:
    """A `tinkrl eval` trial (a `results.jsonl` line) as an Episode."""
    return Episode(
        id=f"{trial.get('task_id')}/a{trial.get('attempt', 1)}",
        source="eval",
        step=None,
        env=env,
        group=None,
        episode=trial.get("attempt"),
        task=str(trial.get("task_id", "")),
        reward=trial.get("reward"),
        turns=int(trial.get("turns") or 0),
        ac_tokens=int(trial.get("sampled_tokens") or 0),
        truncated=trial.get("end_reason") in ("max_tokens", "context_overflow"),
        failure_mode=trial.get("failure_mode"),
        failure_detail=str(trial.get("failure_detail") or ""),
        end=str(trial.get("end_reason") or ""),
        grade=str(trial.get("grade_detail") or ""),
        messages=list(trial.get("transcript") or []),
        logs={
            k: trial[k]
            for k in ("format", "resolved", "tool_calls", "malformed_calls", "command_timeouts", "seconds", "patch")
            if trial.get(k) is not None
        },
    )


def is_run_dir(path: Path) -> bool:
    """Whether `path` is a training run directory (it has `metrics.jsonl` or `run.json`)."""
    return (path / "metrics.jsonl").is_file() or (path / "run.json").is_file()


def is_eval_dir(path: Path) -> bool:
    """Whether `path` is a `tinkrl eval` output directory."""
    return (path / "results.json").is_file() or (path / "results.jsonl").is_file()


def find_dirs(paths: list[Path]) -> list[Path]:
    """The run and eval directories among `paths` and their direct subdirectories (so `runs/` lists
    every run in it), in the order given, each once."""
    found: list[Path] = []
    seen: set[Path] = set()
    for p in paths:
        candidates = [p] if is_run_dir(p) or is_eval_dir(p) else sorted(c for c in p.iterdir() if c.is_dir())
        for c in candidates:
            if (is_run_dir(c) or is_eval_dir(c)) and c.resolve() not in seen:
                seen.add(c.resolve())
                found.append(c)
    return found


def episode_steps(run_dir: Path) -> list[int]:
    """The steps whose episodes the run has written, ascending."""
    folder = run_dir / "episodes"
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for f in folder.iterdir() if (m := STEP_FILE.search(f.name)))


def step_episodes(run_dir: Path, step: int) -> list[Episode]:
    """Every episode of one step of a run."""
    seen: dict[tuple, int] = {}
    out = []
    for row in read_jsonl(run_dir / "episodes" / f"step_{step:06d}.jsonl"):
        key = (row.get("env"), row.get("group"))
        out.append(episode_from_row(row, seen.get(key, 0)))
        seen[key] = seen.get(key, 0) + 1
    return out


def run_episodes(run_dir: Path, steps: list[int] | None = None) -> list[Episode]:
    """The episodes of the given steps (all of them when None)."""
    return [e for s in (episode_steps(run_dir) if steps is None else steps) for e in step_episodes(run_dir, s)]


def eval_results(eval_dir: Path) -> dict:
    """A `tinkrl eval` output directory's `results.json` (model, per-task rows, overall row), {} if absent."""
    path = eval_dir / "results.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def eval_episodes(eval_dir: Path) -> list[Episode]:
    """Every trial of a `tinkrl eval` output directory."""
    return [episode_from_trial(t) for t in read_jsonl(eval_dir / "results.jsonl")]


def run_info(run_dir: Path) -> dict:
    """A run's name, id, model and backend (from `run.json`; the directory name alone when it is absent)."""
    path = run_dir / "run.json"
    info = json.loads(path.read_text()) if path.is_file() else {}
    identity = info.get("identity", {})
    return {
        "name": run_dir.name,
        "run_id": info.get("run_id"),
        "created": info.get("created"),
        "model": identity.get("model_name"),
        "backend": identity.get("backend"),
        "environments": sorted(identity.get("environments", {})),
    }


def checkpoints_by_step(run_dir: Path) -> dict[int, str]:
    """The sampler checkpoint saved after each optimizer step that has one (`checkpoints.jsonl`): the
    weights that sampled that step's episodes."""
    return {int(r["batch"]): r["sampler_path"] for r in read_jsonl(run_dir / "checkpoints.jsonl") if "batch" in r}
