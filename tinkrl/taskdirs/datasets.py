"""Terminal-bench registry datasets (`terminal-bench-core==0.1.1`): resolved, fetched once with git, cached.

terminal-bench publishes its datasets in a registry, a JSON list of rows
`{name, version, description, terminal_bench_version, github_url, dataset_path, branch, commit_hash,
task_id_subset}` (`commit_hash` and `version` may be `head`: the branch's tip). `fetch_dataset(spec)`
resolves `NAME==VERSION` (NAME alone: its newest version, `head` only when there is no other) in the
registry, checks the repo out at the commit with git (a sparse, blob-less fetch of `dataset_path`
only), keeps the tasks of `task_id_subset` when the row has one, unpacks password-zipped task dirs as
terminal-bench does, and caches the result:

    $TINKRL_HOME/datasets/terminal-bench/NAME/VERSION/tasks/    the task directories
    $TINKRL_HOME/datasets/terminal-bench/NAME/VERSION/source.json  the registry row and the commit

A cached dataset is used without the network (delete its folder to fetch it again). The registry is
read from `$TINKRL_TB_REGISTRY` (a URL, a `file://` URL or a path) when set, else from terminal-bench's
GitHub. When the registry or the repo cannot be read, the error is one line naming the dataset, the
registry, and how to supply the tasks instead (`env.path=DIR` with a checkout of them).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import urllib.request
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tinkrl.errors import ConfigError
from tinkrl.local.model_files import tinkrl_home

DEFAULT_REGISTRY_URL = "https://raw.githubusercontent.com/laude-institute/terminal-bench/main/registry.json"
REGISTRY_ENV = "TINKRL_TB_REGISTRY"
ZIP_PASSWORD = b"TERMINAL-BENCH-ADAPTED-DATASET"  # terminal-bench's password for its adapted datasets' zips
_SPEC = re.compile(r"\s*([A-Za-z0-9][\w.-]*)\s*(?:==\s*([\w.+-]+)\s*)?")
_TIMEOUT_S = 30.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegistryEntry:
    """One row of the terminal-bench registry: a dataset version and where its tasks are."""

    name: str
    version: str
    github_url: str
    dataset_path: str
    branch: str = "main"
    commit_hash: str = "head"
    task_id_subset: tuple[str, ...] | None = None
    description: str = ""


def parse_spec(spec: str) -> tuple[str, str | None]:
    """`NAME==VERSION` -> (NAME, VERSION); `NAME` -> (NAME, None). ConfigError for anything else."""
    m = _SPEC.fullmatch(spec)
    if not m:
        raise ConfigError(f"dataset {spec!r}: expected NAME==VERSION or NAME (e.g. terminal-bench-core==0.1.1)")
    return m.group(1), m.group(2)


def registry_url() -> str:
    """Where the registry is read from: `$TINKRL_TB_REGISTRY` (URL or path), else terminal-bench's GitHub."""
    return os.environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY_URL


def dataset_dir(name: str, version: str) -> Path:
    """The cache folder of one dataset version (`tasks/` and `source.json` inside)."""
    return tinkrl_home() / "datasets" / "terminal-bench" / name / version


def _offline_hint(spec: str) -> str:
    return (
        f"to supply the tasks without the registry, check them out on a machine with network access "
        f"(e.g. `git clone https://github.com/laude-institute/terminal-bench` for terminal-bench-core: "
        f"its original-tasks/ folder) and set env.path=DIR instead of env.dataset={spec}"
    )


def read_registry(url: str | None = None) -> list[RegistryEntry]:
    """The registry's rows (from `url`, default `registry_url()`); one-line ConfigError when unreadable."""
    url = url or registry_url()
    try:
        if re.match(r"https?://", url):
            with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as r:  # noqa: S310  (http(s) only)
                text = r.read().decode()
        else:
            text = Path(url.removeprefix("file://")).expanduser().read_text()
        rows = json.loads(text)
    except (OSError, ValueError) as e:
        raise ConfigError(f"the terminal-bench registry {url} cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(rows, list):
        raise ConfigError(f"the terminal-bench registry {url} is not a JSON list of datasets")
    entries = []
    for i, row in enumerate(rows):
        try:
            subset = row.get("task_id_subset")
            entries.append(
                RegistryEntry(
                    name=str(row["name"]),
                    version=str(row["version"]),
                    github_url=str(row["github_url"]),
                    dataset_path=str(row["dataset_path"]),
                    branch=str(row.get("branch") or "main"),
                    commit_hash=str(row.get("commit_hash") or "head"),
                    task_id_subset=tuple(map(str, subset)) if subset is not None else None,
                    description=str(row.get("description") or ""),
                )
            )
        except (KeyError, TypeError, AttributeError):
            raise ConfigError(
                f"the terminal-bench registry {url}: row {i} lacks name/version/github_url/dataset_path"
            ) from None
    return entries


def _version_key(version: str) -> tuple:
    if version == "head":  # listed after the numbered versions (newest_version leaves it out)
        return (2,)
    try:
        from packaging.version import Version

        return (1, Version(version))
    except Exception:  # noqa: BLE001  (packaging absent, or not a PEP 440 version)
        parts = re.findall(r"\d+", version)
        return (0, tuple(int(p) for p in parts), version)


def newest_version(versions: list[str]) -> str | None:
    """The newest of `versions`: `head` (a moving branch) only when there is no numbered version."""
    numbered = [v for v in versions if v != "head"]
    if numbered:
        return max(numbered, key=_version_key)
    return "head" if "head" in versions else None


def find_entry(entries: list[RegistryEntry], name: str, version: str | None) -> RegistryEntry:
    """The registry row of NAME==VERSION (VERSION None: the newest); ConfigError naming what exists."""
    rows = [e for e in entries if e.name == name]
    if not rows:
        names = sorted({e.name for e in entries})
        raise ConfigError(f"dataset {name!r} is not in the terminal-bench registry; it has: {', '.join(names)}")
    version = version or newest_version([e.version for e in rows])
    for e in rows:
        if e.version == version:
            return e
    raise ConfigError(
        f"dataset {name}=={version} is not in the terminal-bench registry; versions: "
        + ", ".join(sorted({e.version for e in rows}, key=_version_key))
    )


def _cached_versions(name: str) -> list[str]:
    root = dataset_dir(name, "x").parent
    if not root.is_dir():
        return []
    return [p.name for p in root.iterdir() if (p / "source.json").is_file() and (p / "tasks").is_dir()]


def cached_dataset(spec: str) -> Path | None:
    """The cached tasks folder of `spec` (NAME alone: its newest cached version), or None; no network."""
    name, version = parse_spec(spec)
    version = version or newest_version(_cached_versions(name))
    if version is None:
        return None
    d = dataset_dir(name, version)
    return d / "tasks" if (d / "source.json").is_file() and (d / "tasks").is_dir() else None


def describe_dataset(spec: str) -> str:
    """One line for a plan: where the tasks of `spec` are cached, or that they would be fetched (no network)."""
    name, version = parse_spec(spec)
    cached = cached_dataset(spec)
    if cached is not None and version is not None:
        return f"{spec}: cached at {cached}"
    if cached is not None:
        return f"{spec}: newest in the registry {registry_url()} (cached: {cached.parent.name} at {cached})"
    target = dataset_dir(name, version or "NEWEST")
    return f"{spec}: not cached; resolved in the registry {registry_url()} and fetched with git into {target}"


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"}
    cmd = ["git", "-c", "advice.detachedHead=false", "-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=60"]
    return subprocess.run(cmd + args, cwd=cwd, env=env, capture_output=True, text=True)


def _checkout(entry: RegistryEntry, repo: Path) -> str:
    """Fetch `entry`'s commit into the empty dir `repo`, checking out `dataset_path` only; returns the commit."""
    steps = [["init", "-q"], ["remote", "add", "origin", entry.github_url]]
    if entry.dataset_path.strip("/.") != "":
        steps.append(["sparse-checkout", "set", "--no-cone", "/" + entry.dataset_path.strip("/") + "/"])
    for args in steps:
        r = _git(args, repo)
        if r.returncode:
            raise RuntimeError(f"git {' '.join(args)}: {r.stderr.strip()}")
    pinned = entry.commit_hash != "head"
    want = entry.commit_hash if pinned else entry.branch
    # a shallow fetch of the one commit (servers that allow it: GitHub), else the branch's history
    r = _git(["fetch", "-q", "--depth", "1", "--filter=blob:none", "origin", want], repo)
    if r.returncode and pinned:
        r = _git(["fetch", "-q", "--filter=blob:none", "origin", entry.branch], repo)
        target = entry.commit_hash
    else:
        target = "FETCH_HEAD"
    if r.returncode:
        raise RuntimeError(f"git fetch {want}: {' '.join(r.stderr.split())[:300]}")
    r = _git(["checkout", "-q", "--detach", target], repo)
    if r.returncode:
        raise RuntimeError(f"git checkout {target}: {' '.join(r.stderr.split())[:300]}")
    return _git(["rev-parse", "HEAD"], repo).stdout.strip()


def _unzip_tasks(tasks: Path) -> None:
    """Unpack the password-zipped task dirs some terminal-bench datasets ship (as its own client does)."""
    for z in sorted(tasks.glob("*.zip")):
        try:
            with zipfile.ZipFile(z) as archive:
                archive.extractall(tasks, pwd=ZIP_PASSWORD)
            z.unlink()
        except (zipfile.BadZipFile, RuntimeError):
            continue


def fetch_dataset(spec: str) -> Path:
    """The folder of task directories of terminal-bench dataset `spec` (`NAME==VERSION` or `NAME`), from
    the cache or fetched once (see the module docstring); one-line ConfigError when it cannot be had."""
    name, version = parse_spec(spec)
    if version is not None and (cached := cached_dataset(spec)) is not None:
        return cached
    url = registry_url()
    try:
        entries = read_registry(url)
    except ConfigError as e:
        cached = cached_dataset(spec) if version is None else None
        if cached is not None:
            log.warning("%s; using the newest cached version of %s: %s", e, name, cached.parent.name)
            return cached
        raise ConfigError(f"terminal-bench dataset {spec} is not cached and {e}; " + _offline_hint(spec)) from None
    entry = find_entry(entries, name, version)
    out = dataset_dir(entry.name, entry.version)
    if (out / "source.json").is_file() and (out / "tasks").is_dir():
        return out / "tasks"
    out.parent.mkdir(parents=True, exist_ok=True)
    log.warning(
        "fetching terminal-bench dataset %s==%s (%s@%s, %s) into %s (once)",
        entry.name, entry.version, entry.github_url, entry.commit_hash, entry.dataset_path, out,
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix=f".fetch-{entry.version}-", dir=out.parent) as tmp:
        repo, staged = Path(tmp) / "repo", Path(tmp) / "staged"
        repo.mkdir()
        try:
            commit = _checkout(entry, repo)
        except (RuntimeError, OSError) as e:
            raise ConfigError(
                f"terminal-bench dataset {entry.name}=={entry.version} (registry {url}) cannot be fetched from "
                f"{entry.github_url} at {entry.commit_hash}: {e}; " + _offline_hint(spec)
            ) from None
        src = (repo / entry.dataset_path).resolve()
        if not src.is_dir() or not src.is_relative_to(repo.resolve()):
            raise ConfigError(
                f"terminal-bench dataset {entry.name}=={entry.version}: {entry.dataset_path!r} is not a folder of "
                f"{entry.github_url} at {commit}"
            )
        shutil.copytree(src, staged / "tasks", ignore=shutil.ignore_patterns(".git"), symlinks=True)
        _unzip_tasks(staged / "tasks")
        if entry.task_id_subset is not None:
            keep = set(entry.task_id_subset)
            for child in (staged / "tasks").iterdir():
                if child.name not in keep:
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        source = {**asdict(entry), "resolved_commit": commit, "registry": url}
        (staged / "source.json").write_text(json.dumps(source, indent=2) + "\n")
        try:
            staged.rename(out)
        except OSError:  # another process finished first: use its copy
            if not (out / "source.json").is_file():
                raise
    return out / "tasks"
