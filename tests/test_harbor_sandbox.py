"""The `harbor` sandbox provider: tinkrl's sandboxes as Harbor environments, through the bridge process.

Without the harness virtualenv these check the errors a user meets first (no harness, an
interpreter without Harbor: one line each, from the plan too). With it (`make harness`; marked
`harness`, run by `make test-harness`) they drive a real Harbor environment class that runs here,
tinkrl's own `BwrapEnvironment` loaded by import path: commands, state between commands, timeouts,
files both ways, a killed bridge, 64 sandboxes at once with none left after, and a trainer killed
with SIGKILL whose bridge stops every sandbox itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from tinkrl.config import HarborSandboxConfig
from tinkrl.sandbox import get_provider
from tinkrl.sandbox import harbor as harbor_mod
from tinkrl.sandbox.base import SandboxError, SandboxSpec

ROOT = Path(__file__).resolve().parents[1]
HARNESS_PYTHON = ROOT / ".venv-harness" / "bin" / "python"
BWRAP_ENV = "tinkrl.harness.harbor_env:BwrapEnvironment"
needs_harness = pytest.mark.skipif(
    not (ROOT / ".venv-harness" / "bin" / "harbor").exists(),
    reason="the harness virtualenv is not built (.venv-harness has no harbor): run `make harness`",
)


# -- without the harness ----------------------------------------------------------------------
def test_no_harness_is_one_line_naming_make_harness(tmp_path, monkeypatch):
    monkeypatch.delenv("TINKRL_HARNESS_PYTHON", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(harbor_mod, "tinkrl", types.SimpleNamespace(__file__=str(tmp_path / "src" / "tinkrl" / "x.py")))
    with pytest.raises(SandboxError) as e:
        harbor_mod.harness_python()
    assert "make harness" in str(e.value) and e.value.failure_mode == "sandbox_unavailable"
    with pytest.raises(SandboxError, match="does not exist"):
        harbor_mod.harness_python(str(tmp_path / "nope" / "python"))


def test_an_interpreter_without_harbor_fails_the_preflight_in_one_line():
    problem = harbor_mod.preflight(HarborSandboxConfig(python=sys.executable))
    assert problem is not None and "harbor" in problem.lower() and "\n" not in problem


def test_the_plan_lists_a_missing_harness_before_any_work(tmp_path):
    env = {**os.environ, "TINKRL_HARNESS_PYTHON": str(tmp_path / "missing" / "python")}
    argv = [
        sys.executable,
        "-m",
        "tinkrl.cli",
        "train",
        "env=shell",
        "sandbox.provider=harbor",
        f"runs_dir={tmp_path / 'runs'}",
        "--dry-run",
    ]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert any("sandbox.harbor.python" in p and "does not exist" in p for p in plan["problems"]), plan["problems"]


def test_check_without_a_harness_fails_in_one_line(tmp_path):
    env = {**os.environ, "TINKRL_HARNESS_PYTHON": str(tmp_path / "missing" / "python")}
    argv = [sys.executable, "-m", "tinkrl.cli", "sandbox", "check", "--provider", "harbor"]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "does not exist" in r.stderr


def test_a_dockerfile_task_names_its_definition_and_resources(tmp_path):
    """A Harbor task built from its Dockerfile carries that directory; only a provider that builds definitions
    gets it in the spec (then without build steps), and [environment] cpus reaches the spec."""
    from tinkrl.taskdirs import load_task
    from tinkrl.taskdirs.verifier import sandbox_spec

    task = load_task(ROOT / "tasks" / "count-errors")
    assert task.definition == ROOT / "tasks" / "count-errors" / "environment" and task.build
    bwrap = types.SimpleNamespace(name="bwrap", runs_images=False, builds_definitions=False)
    remote = types.SimpleNamespace(name="harbor", runs_images=True, builds_definitions=True)
    assert sandbox_spec(task, bwrap).definition is None
    assert sandbox_spec(task, remote).definition == str(task.definition)
    d = tmp_path / "big"
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "instruction.md").write_text("Do it.\n")
    (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (d / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\nRUN echo hi > a.txt\n")
    (d / "task.toml").write_text("[environment]\ncpus = 4\nmemory_mb = 8192\n")
    big = load_task(d)
    spec = sandbox_spec(big, remote)
    assert (spec.cpu, spec.memory_mb, spec.definition) == (4.0, 8192, str(d / "environment"))
    (d / "environment" / "workspace").mkdir()  # a workspace/ recipe is tinkrl's own: no definition then
    assert load_task(d).definition is None


# -- through the bridge, on a Harbor environment that runs here ----------------------------
@pytest.fixture
def provider(tmp_path):
    p = get_provider(
        "harbor",
        python=str(HARNESS_PYTHON),
        environment=BWRAP_ENV,
        retry_backoff_s=0.1,
        ledger=str(tmp_path / "ledger"),
    )
    yield p
    p.close()


def bridge_pid(p) -> int:
    return p._bridge_now().process.pid


def live_in_bridge(p) -> list[str]:
    return p._bridge_now().call("live", 30.0)


@pytest.mark.harness
@needs_harness
def test_commands_keep_their_state_and_time_out(provider):
    with provider.create(SandboxSpec(workdir="/app")) as sb:
        r = sb.exec("pwd; echo hi >&2; exit 3")
        assert (r.exit_code, r.stdout.strip(), r.stderr.strip()) == (3, "/app", "hi")
        sb.exec("mkdir -p /app/sub && cd /app/sub && export GREETING=hello")
        r = sb.exec('pwd; echo "$GREETING"')
        assert r.stdout.split() == ["/app/sub", "hello"]
        t0 = time.monotonic()
        r = sb.exec("sleep 30", timeout=2)
        assert r.timed_out and r.exit_code == -1 and time.monotonic() - t0 < 25


@pytest.mark.harness
@needs_harness
def test_files_go_in_and_out(provider, tmp_path):
    with provider.create(SandboxSpec(workdir="/app")) as sb:
        sb.write_file("/app/deep/dir/a.sh", "echo ran\n", 0o755)
        assert sb.read_file("/app/deep/dir/a.sh") == b"echo ran\n"
        assert sb.exec("/app/deep/dir/a.sh").stdout == "ran\n"
        with pytest.raises(FileNotFoundError):
            sb.read_file("/app/absent.txt")
        src = tmp_path / "tree"
        (src / "inner").mkdir(parents=True)
        (src / "top.txt").write_text("top")
        (src / "inner" / "low.bin").write_bytes(bytes(range(256)))
        sb.copy_in(src, "/app/copied")
        assert sb.exec("cat /app/copied/top.txt").stdout == "top"
        sb.copy_out("/app/copied", tmp_path / "back")
        assert (tmp_path / "back" / "inner" / "low.bin").read_bytes() == bytes(range(256))
        sb.copy_out("/app/copied/top.txt", tmp_path / "one.txt")
        assert (tmp_path / "one.txt").read_text() == "top"


@pytest.mark.harness
@needs_harness
def test_a_killed_bridge_is_an_infrastructure_failure_and_the_next_sandbox_starts(provider):
    sb = provider.create(SandboxSpec(workdir="/app"))
    pid = bridge_pid(provider)
    threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()
    with pytest.raises(SandboxError) as e:
        sb.exec("sleep 20", timeout=30)
    assert e.value.failure_mode == "sandbox_crashed" and "bridge exited" in str(e.value)
    sb.close()  # the sandbox of a dead bridge closes without raising
    ledger = Path(provider.config.ledger)
    assert [f.stem for f in ledger.glob("*.json")] == [sb.name]  # the dead bridge could not remove its entry
    with provider.create(SandboxSpec(workdir="/app")) as again:
        assert again.exec("echo back").stdout == "back\n"
        # the new bridge's start reaped the dead one's entry; only the live sandbox is recorded
        assert [f.stem for f in ledger.glob("*.json")] == [again.name]
    assert bridge_pid(provider) != pid
    assert not list(ledger.glob("*.json"))


@pytest.mark.harness
@needs_harness
def test_a_run_closing_after_its_bridge_died_stops_what_the_ledger_holds(provider):
    sb = provider.create(SandboxSpec(workdir="/app"))
    bridge = provider._bridge
    os.kill(bridge.process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while bridge.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    ledger = Path(provider.config.ledger)
    assert [f.stem for f in ledger.glob("*.json")] == [sb.name]
    provider.close()  # no new bridge was started: the close reaps the dead one's entries
    assert not list(ledger.glob("*.json"))


@pytest.mark.harness
@needs_harness
def test_64_sandboxes_at_once_and_none_left_after():
    p = get_provider("harbor", python=str(HARNESS_PYTHON), environment=BWRAP_ENV, max_concurrent=64)
    results: list[str] = []
    errors: list[BaseException] = []

    def episode(i: int) -> None:
        try:
            with p.create(SandboxSpec(workdir="/app", labels={"task": f"t{i}"})) as sb:
                results.append(sb.exec(f"echo {i}").stdout.strip())
        except BaseException as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    holders = [p.create(SandboxSpec(workdir="/app")) for _ in range(8)]  # live across the run's close
    threads = [threading.Thread(target=episode, args=(i,)) for i in range(56)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors[:3]
    assert sorted(results, key=int) == [str(i) for i in range(56)]
    assert len(live_in_bridge(p)) == 8
    bridge = p._bridge_now()
    p.close()
    assert bridge.process.poll() is not None
    assert p.summary() == {"started": 64, "failed": 0, "retried": 0}
    assert all(h._closed for h in holders)


TRAINER = """
import sys, time
from tinkrl.sandbox import get_provider
from tinkrl.sandbox.base import SandboxSpec
p = get_provider("harbor", python=sys.argv[1], environment=sys.argv[2])
boxes = [p.create(SandboxSpec(workdir="/app")) for _ in range(3)]
for b in boxes:
    b.exec("sleep 600 >/dev/null 2>&1 &")
print(p._bridge_now().process.pid, flush=True)
time.sleep(600)
"""


def bwrap_processes() -> set[int]:
    found = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == "bwrap":
                    found.add(int(d.name))
            except OSError:
                pass
    return found


@pytest.mark.harness
@needs_harness
def test_a_trainer_killed_with_sigkill_leaves_no_sandbox(tmp_path):
    before = bwrap_processes()
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(HARNESS_PYTHON), BWRAP_ENV], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    bridge = int(trainer.stdout.readline())
    assert len(bwrap_processes() - before) >= 3
    trainer.kill()
    trainer.wait()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and Path(f"/proc/{bridge}").exists():
        time.sleep(0.2)
    assert not Path(f"/proc/{bridge}").exists(), "the bridge outlived its trainer"
    assert not (bwrap_processes() - before), "sandboxes outlived the trainer"


@pytest.mark.harness
@needs_harness
def test_preflight_names_what_is_wrong_in_one_line():
    unknown = harbor_mod.preflight(HarborSandboxConfig(python=str(HARNESS_PYTHON), environment="no-such-cloud"))
    assert unknown is not None and "no environment type 'no-such-cloud'" in unknown and "daytona" in unknown
    assert harbor_mod.preflight(HarborSandboxConfig(python=str(HARNESS_PYTHON), environment=BWRAP_ENV)) is None
    for name in ("daytona", "e2b", "modal", "runloop"):
        env = {k: v for k, v in os.environ.items() if not k.startswith(name.upper())}
        r = subprocess.run(
            [str(HARNESS_PYTHON), "-m", "tinkrl.sandbox.harbor_bridge", "--preflight", name],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert r.returncode == 2 and r.stdout.startswith("error: "), (name, r.stdout, r.stderr[-500:])
        assert r.stdout.strip().count("\n") == 0


@pytest.mark.harness
@needs_harness
def test_sandbox_check_runs_every_step(tmp_path):
    argv = [
        sys.executable,
        "-m",
        "tinkrl.cli",
        "sandbox",
        "check",
        "--provider",
        "harbor",
        "--set",
        f"sandbox.harbor.environment={BWRAP_ENV}",
        "--set",
        f"sandbox.harbor.python={HARNESS_PYTHON}",
    ]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for step in ("provider ready", "sandbox started", "command run", "file copied in", "file copied out", "stopped"):
        assert step in r.stdout


@pytest.mark.harness
@needs_harness
def test_the_project_tasks_grade_the_same_through_harbor_as_on_bwrap(provider):
    """Every shipped task's gate (its solution scores 1, doing nothing 0) through a Harbor environment gives the
    rewards the bwrap provider gives."""
    from tinkrl.taskdirs.gate import run_gate
    from tinkrl.taskdirs.loaders import iter_tasks

    tasks = [t for t in iter_tasks([ROOT / "tasks"]) if not isinstance(t, Exception)]
    assert len(tasks) >= 20
    bwrap = get_provider("bwrap")
    try:
        local = {t.id: run_gate(t, bwrap, use_cache=False) for t in tasks}
    finally:
        bwrap.close()
    remote = {t.id: run_gate(t, provider, use_cache=False) for t in tasks}
    rewards = {i: (r.solution_reward, r.noop_reward) for i, r in local.items()}
    assert {i: (r.solution_reward, r.noop_reward) for i, r in remote.items()} == rewards
    assert sum(r.ok for r in remote.values()) == sum(r.ok for r in local.values()) >= 20
    assert provider.summary()["failed"] == 0


@pytest.mark.harness
@needs_harness
def test_a_dockerfile_task_is_built_by_the_environment_from_its_own_directory(provider):
    """The environment builds the task's environment/ itself: the spec names it, the workspace is there, tinkrl
    wrote no synthetic definition, and the task grades as on bwrap."""
    from tinkrl.taskdirs import grade, load_task, start_sandbox
    from tinkrl.taskdirs.gate import run_gate

    task = load_task(ROOT / "tasks" / "count-errors")
    with start_sandbox(task, provider) as sb:
        assert sb.spec.definition == str(task.definition)
        assert "ERROR" in sb.read_file("/app/server.log").decode()
        assert grade(task, sb).reward == 0.0
    assert not (provider.scratch / "definitions").exists()
    gate = run_gate(task, provider, use_cache=False)
    assert (gate.solution_reward, gate.noop_reward) == (1.0, 0.0)


def _eval(tmp_path: Path, name: str, *sandbox: str) -> list[dict]:
    argv = [sys.executable, "-m", "tinkrl.cli", "eval", "--tasks", str(ROOT / "tasks")]
    for task in ("hello-file", "count-errors", "rename-draft", "first-line"):
        argv += ["--task-id", task]
    argv += ["--model", "HuggingFaceTB/SmolLM2-135M-Instruct", "--temperature", "0", "--n", "1", "--max-turns", "2"]
    argv += ["--max-tokens", "32", "--output-path", str(tmp_path), "--run-id", name, *sandbox]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return [json.loads(line) for line in (tmp_path / name / "results.jsonl").read_text().splitlines()]


@pytest.mark.harness
@needs_harness
def test_tinkrl_eval_through_harbor_plays_the_episodes_of_bwrap(tmp_path):
    """`tinkrl eval --sandbox harbor` on the project's tasks, greedy: the same commands, outputs and rewards."""
    local = _eval(tmp_path, "bwrap", "--sandbox", "bwrap")
    remote = _eval(
        tmp_path,
        "harbor",
        "--sandbox",
        "harbor",
        "--set",
        f"sandbox.harbor.environment={BWRAP_ENV}",
        "--set",
        f"sandbox.harbor.python={HARNESS_PYTHON}",
    )
    assert len(local) == 4 and all(t["failure_mode"] is None for t in remote)
    kept = ("task_id", "reward", "turns", "end_reason", "transcript")
    assert [{k: t[k] for k in kept} for t in remote] == [{k: t[k] for k in kept} for t in local]


def _train(tmp_path: Path, name: str, *sandbox: str) -> list[dict]:
    argv = [
        sys.executable,
        "-m",
        "tinkrl.cli",
        "train",
        "env=shell",
        "model_name=tinkrl/tiny-llama",
        "backend=local",
        "groups_per_step=2",
        "group_size=2",
        "max_steps=2",
        "max_tokens=12",
        "eval_every=0",
        "save_every=0",
        "env.test_per_template=1",
        f"run_name={name}",
        *sandbox,
    ]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return [json.loads(line) for line in (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()]


def _sandboxes(tmp_path: Path, name: str) -> dict:
    return json.loads((tmp_path / "runs" / name / "summary.json").read_text())["sandboxes"]


@pytest.mark.harness
@needs_harness
def test_a_shell_task_trains_through_harbor_with_the_rewards_of_bwrap(tmp_path):
    local = _train(tmp_path, "bwrap")
    remote = _train(
        tmp_path,
        "harbor",
        "sandbox.provider=harbor",
        f"sandbox.harbor.environment={BWRAP_ENV}",
        f"sandbox.harbor.python={HARNESS_PYTHON}",
    )
    assert [m["step"] for m in remote] == [0, 1]
    kept = ("reward/total", "failures", "total_episodes", "turns_per_episode")
    rewards = [{k: v for k, v in m.items() if k.startswith("env/") and k.endswith(kept)} for m in local]
    assert len(rewards[0]) == 2 * len(kept) and all(m["env/all/failures"] == 0 for m in remote)
    assert [{k: m[k] for k in r} for m, r in zip(remote, rewards)] == rewards
    counts = _sandboxes(tmp_path, "harbor")["harbor"]  # the run's summary says what the provider did
    assert counts["started"] >= 8 and (counts["failed"], counts["retried"]) == (0, 0)
    assert _sandboxes(tmp_path, "bwrap") == {}
