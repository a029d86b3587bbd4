"""The gate (solution -> 1, no-op -> 0), its cache, and `tinkrl tasks check`."""

import shutil
from pathlib import Path

import pytest
from helpers.requirements import needs_bwrap

from tinkrl.commands.tasks import cli_main
from tinkrl.sandbox import get_provider
from tinkrl.taskdirs import load_task, run_gate

pytestmark = needs_bwrap
TASKS = Path(__file__).resolve().parents[1] / "tasks"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TINKRL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def provider():
    p = get_provider("bwrap")
    yield p
    p.close()


def test_gate_passes_and_is_cached_by_content(home, provider, tmp_path):
    d = tmp_path / "fix-permissions"
    shutil.copytree(TASKS / "fix-permissions", d)
    first = run_gate(load_task(d), provider)
    assert first.ok and first.solution_reward == 1.0 and first.noop_reward == 0.0 and not first.cached
    assert run_gate(load_task(d), provider).cached
    (d / "instruction.md").write_text("Changed wording.\n")  # new content hash: not cached
    assert not run_gate(load_task(d), provider).cached


def test_gate_fails_with_reasons(home, provider, tmp_path):
    d = tmp_path / "hello-file"
    shutil.copytree(TASKS / "hello-file", d)
    (d / "solution" / "solve.sh").write_text("echo 'Hello' > /app/hello.txt\n")
    res = run_gate(load_task(d), provider)
    assert not res.ok and res.solution_reward == 0.0 and "solution scored 0" in res.detail
    (d / "solution" / "solve.sh").write_text("echo 'Hello, world!' > /app/hello.txt\n")
    (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")  # rewards doing nothing
    res = run_gate(load_task(d), provider)
    assert not res.ok and "doing nothing scored 1" in res.detail
    assert not list(home.glob("cache/gate/*.json"))  # failures are never cached


def test_tasks_check_cli_reports_each_task_and_exits_nonzero(home, tmp_path, capsys):
    root = tmp_path / "tasks"
    shutil.copytree(TASKS / "tb-hello", root / "tb-hello")
    shutil.copytree(TASKS / "hello-file", root / "broken")
    (root / "broken" / "task.toml").write_text("[agent]\ntimeout_sec = [1]\n")
    assert cli_main(["check", str(root)]) == 1
    out = capsys.readouterr().out
    assert "tb-hello" in out and "ok" in out
    assert "LOAD ERROR" in out and "[agent] timeout_sec" in out and "broken/task.toml" in out
    assert "1/2 tasks passed" in out
    assert cli_main(["check", str(root / "tb-hello")]) == 0
    assert "ok (cached)" in capsys.readouterr().out
