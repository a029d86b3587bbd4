"""The teacher of on-policy distillation: which weights score the student's samples, and whether it may.

`teacher.model` names a model (`Qwen/Qwen3-8B`), a checkpoint (`tinker://...` or a checkpoint
directory) or a tinkrl run directory (its last sampler checkpoint: `teacher=runs/arithmetic`
distils from what `make train` left). `resolve_teacher` turns it into a `Teacher` before any work,
reading files only. The teacher's logprobs are compared with the student's token by token, so the
two must mean the same text by the same token ids: `token_problem` says in one line when they do
not (or when it cannot tell), and the plan stops the run on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinkrl.config import TeacherConfig
from tinkrl.errors import ConfigError
from tinkrl.local.checkpoint_paths import META, SCHEME, checkpoint_dir, is_local_checkpoint
from tinkrl.local.model_files import stored_vocabulary
from tinkrl.renderers import tokenizer_family
from tinkrl.rl.run_dir import holds_run, trained_model
from tinkrl.tracking import read_jsonl


@dataclass(frozen=True)
class Teacher:
    """A resolved teacher: its base model (None when nothing says), the checkpoint it samples from (None: the
    base model itself), what `teacher.model` named, and whether its weights are on this machine."""

    base_model: str | None
    model_path: str | None
    source: str
    local: bool

    def line(self) -> str:
        """The teacher in a few words, for the plan line."""
        if self.model_path is None:
            return f"teacher {self.base_model}"
        return f"teacher {self.source} ({self.base_model or 'base model unknown'})"


def resolve_teacher(cfg: TeacherConfig) -> Teacher | None:
    """The teacher `cfg` names, or None without one. A run directory without a sampler checkpoint, an
    incomplete checkpoint directory, or a path (absolute, `./`, `~`) with nothing there is a ConfigError naming it."""
    name = cfg.model
    if not name:
        return None
    path = Path(name).expanduser()
    if holds_run(path):
        rows = [r for r in read_jsonl(path / "checkpoints.jsonl") if r.get("sampler_path")]
        if not rows:
            raise ConfigError(f"teacher: run directory {path} has no checkpoint yet (checkpoints.jsonl lists none)")
        sampler = rows[-1]["sampler_path"]
        base = cfg.base_model or trained_model(path) or _checkpoint_base(sampler)
        return Teacher(base, sampler, name, is_local_checkpoint(sampler))
    if not path.exists() and (path.is_absolute() or name.startswith((".", "~"))):
        raise ConfigError(f"teacher: no run directory or checkpoint at {path}")
    if name.startswith(SCHEME) or path.is_dir():
        local = is_local_checkpoint(name)
        if local and not (checkpoint_dir(name) / META).is_file():
            raise ConfigError(f"teacher: {name} is not a complete checkpoint (no {META} in {checkpoint_dir(name)})")
        return Teacher(cfg.base_model or (_checkpoint_base(name) if local else None), name, name, local)
    return Teacher(name, None, name, False)


def _checkpoint_base(path: str) -> str | None:
    """The base model a checkpoint on this machine names in its metadata, or None."""
    meta = checkpoint_dir(path) / META
    if not meta.is_file():
        return None
    return json.loads(meta.read_text()).get("base_model")


def token_problem(student: str, teacher: Teacher) -> str | None:
    """Why the teacher's logprobs cannot be read against the student's tokens, in one line, or None: the two
    tokenizers' vocabularies as stored on this machine when both are, else their families by name."""
    other = teacher.base_model
    if other is None:
        return (
            f"teacher: cannot tell which model {teacher.source} was trained from; set teacher.base_model so the "
            "plan can check that it tokenizes as the student does"
        )
    if other == student:
        return None
    mine, theirs = stored_vocabulary(student), stored_vocabulary(other)
    if mine is not None and theirs is not None:
        if mine == theirs:
            return None
        return f"teacher: {other} and the student {student} tokenize differently (their vocabularies differ)"
    fs, ft = tokenizer_family(student), tokenizer_family(other)
    if fs is None or ft is None:
        return (
            f"teacher: cannot tell whether {other} tokenizes as the student {student} does (neither its name nor "
            "files on this machine say, and no run or checkpoint directory has that name); distil from a teacher "
            "of the student's family"
        )
    if fs != ft:
        return (
            f"teacher: {other} ({ft} tokenizer) and the student {student} ({fs} tokenizer) tokenize differently; "
            "distillation compares logprobs token by token, so choose a teacher of the student's family"
        )
    return None


def sampling_client(service: Any, teacher: Teacher) -> Any:
    """The sampling client that scores the student's samples with the teacher's weights."""
    if teacher.model_path is not None:
        return service.create_sampling_client(model_path=teacher.model_path)
    return service.create_sampling_client(base_model=teacher.base_model)
