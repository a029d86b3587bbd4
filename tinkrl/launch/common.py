"""What every launch target shares: the `KEY=VALUE ... [--dry-run] -- COMMAND ...` line read into a
typed options dataclass, the checkout's git commit and its uncommitted changes, the API keys a run
gets as secrets, and the result directory.

Every mistake here is a `ConfigError`: one line, exit code 2, before anything is contacted.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import time
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tinkrl.errors import ConfigError

# The API keys a launched run gets, by reference (a Beaker secret, the chart's Secret), never as values.
SECRET_ENV = ("TINKER_API_KEY", "WANDB_API_KEY", "OPENREWARD_API_KEY")
# Where a launched run writes what should outlive it (the seed's `log_path=/results`).
RESULTS_DIR = "/results"
# The image's build recipe, relative to the checkout (`make -C deploy build` uses the same one).
DOCKERFILE = "deploy/Dockerfile"
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def option(default: Any, doc: str) -> Any:
    """A field of an options dataclass: its default and the one line `tinkrl launch ... --help` shows."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class LaunchLine:
    """A parsed launch command line: raw KEY=VALUE options, the command after `--`, and --dry-run."""

    options: dict[str, str]
    command: list[str]
    dry_run: bool


def split_line(argv: list[str], keys: list[str], usage: str) -> LaunchLine:
    """`KEY=VALUE ... [--dry-run] -- COMMAND ...` -> LaunchLine; a missing `--`, an empty command or an
    unknown key is a ConfigError naming what to write instead."""
    if "--" not in argv:
        raise ConfigError(f"missing `--` before the command to run: {usage}")
    cut = argv.index("--")
    head, command = argv[:cut], argv[cut + 1 :]
    if not command:
        raise ConfigError(f"no command after `--`: {usage}")
    return LaunchLine(parse_pairs(head, keys, usage), command, "--dry-run" in head)


def parse_pairs(head: list[str], keys: list[str], usage: str) -> dict[str, str]:
    """KEY=VALUE words (and --dry-run) -> {key: text}; anything else, or a key not in `keys`, is an error."""
    options: dict[str, str] = {}
    for word in head:
        if word == "--dry-run":
            continue
        key, eq, value = word.partition("=")
        if not eq or word.startswith("-"):
            raise ConfigError(f"{word!r} is not KEY=VALUE: {usage}")
        if key not in keys:
            raise ConfigError(f"unknown key {key!r}; keys: {', '.join(keys)}")
        options[key] = value
    return options


def option_keys(cls: type) -> list[str]:
    """The KEY names an options dataclass takes."""
    return [f.name for f in dataclasses.fields(cls)]


def option_help(cls: type) -> str:
    """One line per key of an options dataclass: name, default, doc."""
    lines = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        shown = ",".join(default) if isinstance(default, list) else default
        doc = f.metadata["doc"]
        lines.append(f"  {f.name:<14}{doc}" + ("" if "default" in doc else f" (default: {shown})"))
    return "\n".join(lines)


def build_options(cls: type, raw: dict[str, str]) -> Any:
    """An options dataclass from KEY=VALUE texts, each converted to its field's type (bool, int, text,
    comma-separated list); a value of the wrong kind is a ConfigError naming the key."""
    hints = typing.get_type_hints(cls)
    return cls(**{key: _convert(key, text, hints[key]) for key, text in raw.items()})


def _convert(key: str, text: str, kind: Any) -> Any:
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if isinstance(kind, types.UnionType) and len(args) == 1:
        kind = args[0]
    if kind is bool:
        if text.lower() in TRUE:
            return True
        if text.lower() in FALSE:
            return False
        raise ConfigError(f"{key}={text}: expected true or false")
    if kind is int:
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{key}={text}: expected a whole number") from None
        if value < 0:
            raise ConfigError(f"{key}={text}: must be >= 0")
        return value
    if typing.get_origin(kind) is list:
        return [part.strip() for part in text.split(",") if part.strip()]
    return text


@dataclass(frozen=True)
class GitState:
    """The checkout a launch runs: its root, commit (full and short, as `git rev-parse --short`), and
    the files `git status` reports changed or untracked."""

    root: Path
    commit: str
    short: str
    changed: list[str]

    @property
    def dirty(self) -> bool:
        """Whether the working tree differs from the commit."""
        return bool(self.changed)


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError:
        raise ConfigError("git is not installed: tinkrl launch runs the current checkout's commit") from None


def git_state(cwd: Path | None = None) -> GitState:
    """The git checkout around `cwd` (default: the working directory); not being in one, or a repository
    without a commit, is a ConfigError."""
    cwd = Path(cwd or Path.cwd())
    top = _git(cwd, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        raise ConfigError(f"{cwd} is not in a git repository: tinkrl launch runs the current checkout's commit")
    root = Path(top.stdout.strip())
    head = _git(root, "rev-parse", "HEAD")
    if head.returncode != 0:
        raise ConfigError(f"the git repository at {root} has no commit yet: commit first")
    short = _git(root, "rev-parse", "--short", "HEAD").stdout.strip()
    status = _git(root, "status", "--porcelain", "--untracked-files=normal").stdout.splitlines()
    changed = [line[3:].strip('"') for line in status if line.strip()]
    return GitState(root=root, commit=head.stdout.strip(), short=short, changed=changed)


def require_clean(git: GitState, allow_dirty: bool) -> None:
    """Refuse a dirty checkout (one line naming the changed files) unless allow_dirty."""
    if not git.dirty or allow_dirty:
        return
    shown = ", ".join(git.changed[:8]) + (f" and {len(git.changed) - 8} more" if len(git.changed) > 8 else "")
    raise ConfigError(
        f"uncommitted changes in {git.root} ({shown}): commit them so the run matches commit {git.short}, "
        "or pass allow_dirty=true"
    )


def default_name(git: GitState) -> str:
    """A run name from the commit and the UTC time: tinkrl-<short commit>-<YYYYmmdd-HHMMSS>."""
    return f"tinkrl-{git.short}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


class _PlainDumper(yaml.SafeDumper):
    """Writes a value shared by two places twice, never as a YAML anchor and alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(data: Any) -> str:
    """YAML as the cluster tools read it: keys in the order given, no anchors, long lines kept whole."""
    return yaml.dump(data, Dumper=_PlainDumper, sort_keys=False, width=1000)


def describe(git: GitState, command: list[str]) -> str:
    """One line saying what a launched run is: commit (and whether dirty) and the command."""
    return f"tinkrl {git.short}{' (dirty)' if git.dirty else ''}: {shlex.join(command)}"
