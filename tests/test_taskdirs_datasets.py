"""Terminal-bench registry datasets: resolved in a registry, fetched with git at the row's commit, pruned to
its task subset, cached, loaded as tasks; one clear line when the registry or the repo cannot be reached.

The registry is a JSON file in terminal-bench's format served over HTTP on 127.0.0.1 (or read as a
file), and the dataset repo is a local git repository made here with two commits of terminal-bench
task dirs (copies of tasks/tb-hello and tasks/tb-csv-total).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import struct
import threading
import zlib
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers.git_repo import git
from helpers.ors import free_port
from helpers.requirements import needs

from tinkrl.config import EnvEntry
from tinkrl.envs import make_env_config
from tinkrl.errors import ConfigError
from tinkrl.taskdirs.datasets import (
    ZIP_PASSWORD,
    cached_dataset,
    describe_dataset,
    fetch_dataset,
    newest_version,
    parse_spec,
)

TASKS = Path(__file__).resolve().parents[1] / "tasks"
pytestmark = needs("git", "registry datasets are fetched with git")


@pytest.fixture
def tb_repo(tmp_path) -> tuple[Path, str, str]:
    """A git repo with terminal-bench tasks under original-tasks/: commit 1 has hello-world and csv-total;
    commit 2 adds a file to hello-world and a third task."""
    repo = tmp_path / "terminal-bench"
    tasks = repo / "original-tasks"
    tasks.mkdir(parents=True)
    shutil.copytree(TASKS / "tb-hello", tasks / "hello-world")
    shutil.copytree(TASKS / "tb-csv-total", tasks / "csv-total")
    (repo / "README.md").write_text("not part of the dataset\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    first = git(repo, "rev-parse", "HEAD")
    (tasks / "hello-world" / "NOTES.md").write_text("added in commit two\n")
    shutil.copytree(TASKS / "tb-hello", tasks / "late-task")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "two")
    return repo, first, git(repo, "rev-parse", "HEAD")


def row(version: str, url: str, commit: str, subset=None, path="original-tasks") -> dict:
    return {
        "name": "tb-core",
        "version": version,
        "description": "test copy",
        "terminal_bench_version": ">=0.1.0",
        "github_url": url,
        "dataset_path": path,
        "branch": "main",
        "commit_hash": commit,
        "task_id_subset": subset,
    }


class RegistryServer:
    """The registry JSON served over HTTP from a temp folder, on 127.0.0.1."""

    def __init__(self, folder: Path):
        handler = functools.partial(SimpleHTTPRequestHandler, directory=str(folder))
        handler.log_message = lambda *a: None  # type: ignore[method-assign]
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/registry.json"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TINKRL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_spec_and_versions():
    assert parse_spec("terminal-bench-core==0.1.1") == ("terminal-bench-core", "0.1.1")
    assert parse_spec("terminal-bench-core") == ("terminal-bench-core", None)
    with pytest.raises(ConfigError, match="NAME==VERSION"):
        parse_spec("terminal bench")
    assert newest_version(["head", "0.1.1", "0.1.10", "0.1.9"]) == "0.1.10"  # numbers, not strings; head moves
    assert newest_version(["head"]) == "head" and newest_version([]) is None


def test_dataset_is_fetched_at_its_commit_pruned_cached_and_loaded(tb_repo, home, tmp_path, monkeypatch):
    repo, first, second = tb_repo
    folder = tmp_path / "registry"
    folder.mkdir()
    rows = [
        row("0.1.0", str(repo), first, subset=["hello-world"]),
        row("0.1.1", f"file://{repo}", second),
        row("head", f"file://{repo}", "head"),
    ]
    (folder / "registry.json").write_text(json.dumps(rows))
    server = RegistryServer(folder)
    try:
        monkeypatch.setenv("TINKRL_TB_REGISTRY", server.url)
        assert "not cached" in describe_dataset("tb-core==0.1.0") and server.url in describe_dataset("tb-core")
        old = fetch_dataset("tb-core==0.1.0")
        assert old == home / "datasets" / "terminal-bench" / "tb-core" / "0.1.0" / "tasks"
        assert sorted(p.name for p in old.iterdir()) == ["hello-world"]  # the row's task_id_subset
        assert not (old / "hello-world" / "NOTES.md").exists()  # the pinned commit, not the branch tip
        source = json.loads((old.parent / "source.json").read_text())
        assert source["resolved_commit"] == first and source["registry"] == server.url
        newest = fetch_dataset("tb-core")  # NAME alone: the newest numbered version, not head
        assert newest.parent.name == "0.1.1"
        assert sorted(p.name for p in newest.iterdir()) == ["csv-total", "hello-world", "late-task"]
        assert (newest / "hello-world" / "NOTES.md").is_file() and not (newest.parent / "README.md").exists()
        assert describe_dataset("tb-core==0.1.0") == f"tb-core==0.1.0: cached at {old}"
    finally:
        server.close()
    # cached: neither the registry nor the repo is needed again
    shutil.rmtree(repo)
    assert fetch_dataset("tb-core==0.1.0") == old
    assert fetch_dataset("tb-core") == newest  # registry down: the newest cached version
    assert cached_dataset("tb-core==head") is None
    cfg = make_env_config("tasks", EnvEntry(env={"dataset": "tb-core==0.1.1", "task_ids": ["hello-*"]}))
    tasks = cfg.load_tasks()
    assert [(t.id, t.format) for t in tasks] == [("hello-world", "terminal-bench")]
    assert tasks[0].source == newest / "hello-world"


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = _crc_table()


def _update_keys(keys: list[int], b: int) -> None:
    keys[0] = (keys[0] >> 8) ^ CRC_TABLE[(keys[0] ^ b) & 0xFF]
    keys[1] = ((keys[1] + (keys[0] & 0xFF)) * 134775813 + 1) & 0xFFFFFFFF
    keys[2] = (keys[2] >> 8) ^ CRC_TABLE[(keys[2] ^ (keys[1] >> 24)) & 0xFF]


def zipcrypto(entries: dict[str, bytes], password: bytes) -> bytes:
    """A zip archive of stored files encrypted with PKWARE's traditional cipher, as `zip -P` writes it."""
    out, central = bytearray(), bytearray()
    for name, data in entries.items():
        keys = [0x12345678, 0x23456789, 0x34567890]
        for b in password:
            _update_keys(keys, b)
        crc = zlib.crc32(data)
        enc = bytearray()
        for p in os.urandom(11) + bytes([crc >> 24]) + data:
            t = (keys[2] | 2) & 0xFFFF
            enc.append(p ^ (((t * (t ^ 1)) >> 8) & 0xFF))
            _update_keys(keys, p)
        n, offset = name.encode(), len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 1, 0, 0, 0, crc, len(enc), len(data), len(n), 0) + n + enc
        fields = (0x02014B50, 20, 20, 1, 0, 0, 0, crc, len(enc), len(data), len(n), 0, 0, 0, 0, 0, offset)
        central += struct.pack("<IHHHHHHIIIHHHHHII", *fields) + n
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central), len(out), 0)
    return bytes(out + central + end)


def test_password_zipped_tasks_are_unpacked(tmp_path, home, monkeypatch):
    repo = tmp_path / "adapted"
    (repo / "tasks").mkdir(parents=True)
    src = TASKS / "tb-hello"
    files = {f"secret-task/{p.relative_to(src)}": p.read_bytes() for p in sorted(src.rglob("*")) if p.is_file()}
    (repo / "tasks" / "secret-task.zip").write_bytes(zipcrypto(files, ZIP_PASSWORD))
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "zipped")
    registry = tmp_path / "registry.json"
    registry.write_text(json.dumps([row("1.0", str(repo), git(repo, "rev-parse", "HEAD"), path="tasks")]))
    monkeypatch.setenv("TINKRL_TB_REGISTRY", str(registry))
    out = fetch_dataset("tb-core==1.0")
    assert sorted(p.name for p in out.iterdir()) == ["secret-task"]
    assert (out / "secret-task" / "task.yaml").read_bytes() == (src / "task.yaml").read_bytes()
    (task,) = make_env_config("tasks", EnvEntry(env={"dataset": "tb-core==1.0"})).load_tasks()
    assert task.id == "secret-task" and task.instruction.startswith("Create a file called /app/hello.txt")


def test_unreachable_registry_or_repo_is_one_line_that_says_how_to_supply_the_tasks(
    tb_repo, tmp_path, home, monkeypatch
):
    repo, first, _ = tb_repo
    url = f"http://127.0.0.1:{free_port()}/registry.json"
    monkeypatch.setenv("TINKRL_TB_REGISTRY", url)
    with pytest.raises(ConfigError) as err:
        make_env_config("tasks", EnvEntry(env={"dataset": "terminal-bench-core==0.1.1"})).load_tasks()
    msg = str(err.value)
    assert "\n" not in msg and "terminal-bench dataset terminal-bench-core==0.1.1 is not cached" in msg
    assert f"the terminal-bench registry {url} cannot be read (URLError" in msg
    assert "set env.path=DIR instead of env.dataset=terminal-bench-core==0.1.1" in msg

    registry = tmp_path / "registry.json"
    registry.write_text(json.dumps([row("0.1.0", str(tmp_path / "gone"), first), row("head", str(repo), "head")]))
    monkeypatch.setenv("TINKRL_TB_REGISTRY", f"file://{registry}")
    with pytest.raises(ConfigError) as err:
        fetch_dataset("tb-core==0.1.0")
    msg = str(err.value)
    assert "\n" not in msg and f"cannot be fetched from {tmp_path / 'gone'} at {first}" in msg and "env.path=DIR" in msg
    assert not (home / "datasets" / "terminal-bench" / "tb-core" / "0.1.0").exists()  # nothing half-made
    with pytest.raises(ConfigError, match=r"dataset 'nope' is not in the terminal-bench registry; it has: tb-core"):
        fetch_dataset("nope==1")
    with pytest.raises(ConfigError, match=r"tb-core==9.9 is not in the terminal-bench registry; versions: 0.1.0, head"):
        fetch_dataset("tb-core==9.9")


def test_dataset_config_checks(home, monkeypatch):
    monkeypatch.delenv("TINKRL_TB_REGISTRY", raising=False)
    with pytest.raises(ConfigError, match=r"environments.tasks.env.dataset: .*NAME==VERSION"):
        make_env_config("tasks", EnvEntry(env={"dataset": "terminal bench core"}))
    with pytest.raises(ConfigError, match="env.dataset or env.path, not both"):
        make_env_config("tasks", EnvEntry(env={"dataset": "terminal-bench-core", "path": "tasks"}))
    cfg = make_env_config("tasks", EnvEntry(env={"dataset": "terminal-bench-core==0.1.1"}))
    assert cfg.dataset == "terminal-bench-core==0.1.1"
    target = home / "datasets" / "terminal-bench" / "terminal-bench-core" / "0.1.1"
    assert cfg.describe_source() == (
        "terminal-bench-core==0.1.1: not cached; resolved in the registry "
        f"https://raw.githubusercontent.com/laude-institute/terminal-bench/main/registry.json and fetched with git into {target}"
    )
    assert not (home / "datasets").exists()  # describing fetches nothing


def test_tinkrl_eval_takes_a_registry_dataset(tb_repo, tmp_path, home, monkeypatch, capsys):
    from tinkrl.commands.eval import cli_main

    repo, _, second = tb_repo
    registry = tmp_path / "registry.json"
    registry.write_text(json.dumps([row("0.1.1", str(repo), second)]))
    monkeypatch.setenv("TINKRL_TB_REGISTRY", str(registry))
    # the dataset is fetched and its tasks loaded (the id check answers before any model is loaded)
    assert cli_main(["--dataset", "tb-core==0.1.1", "--task-id", "no-such-task", "--model", "tinkrl/tiny-llama"]) == 2
    err = capsys.readouterr().err
    assert "no task matches 'no-such-task'; known: csv-total, hello-world, late-task" in err
    assert cached_dataset("tb-core==0.1.1") is not None
    with pytest.raises(SystemExit):
        cli_main(["--dataset", "tb-core", "--tasks", "tasks"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["--dataset", "tb core"])
    assert "--dataset: dataset 'tb core': expected NAME==VERSION" in capsys.readouterr().err
