"""Git repositories made in tests: `git(repo, ...)` with a fixed identity and branch name, and
`checkout(path, files)`, a repository with one commit of the given files."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    """Run git in `repo` (as user t, default branch main); its stdout, stripped. Fails the test on error."""
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main", *args]
    return subprocess.run(cmd, cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def checkout(path: Path, files: dict[str, str]) -> Path:
    """A fresh repository at `path` whose one commit holds `files` (relative path -> text)."""
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "one")
    return path
