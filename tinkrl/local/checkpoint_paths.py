"""Where checkpoints live: the `tinker://` path map, without torch.

A checkpoint path is `tinker://<run_id>/{weights,sampler_weights}/<name>`, the directory of that
name under `$TINKRL_HOME/checkpoints`, or a directory path. `checkpoints.py` reads and writes what
is there; this module only says where, so that a backend choice (`tinkrl.backends.choose_backend`)
can ask whether a checkpoint is on this machine without loading the engine.
"""

from __future__ import annotations

from pathlib import Path

from tinkrl.local.model_files import tinkrl_home

SCHEME = "tinker://"
META = "tinkrl_meta.json"  # written last into a checkpoint's directory: present means complete


def checkpoints_root() -> Path:
    """`$TINKRL_HOME/checkpoints`: where the embedded engine keeps the checkpoints it writes."""
    return tinkrl_home() / "checkpoints"


def checkpoint_dir(path: str) -> Path:
    """The directory checkpoint `path` names on this machine: a `tinker://` path under
    `checkpoints_root()`, any other path as given (`~` expanded). Whether it exists is not checked."""
    return checkpoints_root() / path[len(SCHEME) :] if path.startswith(SCHEME) else Path(path).expanduser()


def is_local_checkpoint(path: str) -> bool:
    """Whether checkpoint `path` is the embedded engine's to read, not the Tinker service's: a directory
    path (the service reads only `tinker://` paths), or a `tinker://` path whose directory is on this
    machine (complete or not: a partly written one is this machine's error to report)."""
    return not path.startswith(SCHEME) or checkpoint_dir(path).is_dir()
