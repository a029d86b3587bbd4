"""The docker provider against a real engine: podman's Docker-compatible API on this machine.

Skips only when podman cannot run at all (see podman_helper.unavailable_reason).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from helpers import podman_helper
from helpers.requirements import skip_module_unless, unless  # noqa: E402

pytest.importorskip("docker", reason="docker SDK not installed (pip install -e '.[dev]')")
skip_module_unless(podman_helper.unavailable_reason())

from tinkrl.sandbox.base import SandboxError, SandboxSpec  # noqa: E402
from tinkrl.sandbox.docker import DockerProvider  # noqa: E402
from tinkrl.sandbox.reaper import reap  # noqa: E402

IMAGE = podman_helper.TEST_IMAGE


@pytest.fixture(scope="module")
def podman(tmp_path_factory):
    pm = podman_helper.start(tmp_path_factory.mktemp("podman"))
    yield pm
    pm.stop()


@pytest.fixture(scope="module")
def provider(podman):
    p = DockerProvider(base_url=podman.base_url, run_id="testrun")
    yield p
    p.close()


@pytest.fixture()
def sandbox(provider):
    sb = provider.create(
        SandboxSpec(image=IMAGE, workdir="/app", memory_mb=256, pids=64, cpu=0.5, labels={"task_id": "hello/world"})
    )
    yield sb
    sb.close()


def test_exec_output_exit_code_and_shell_state(sandbox):
    r = sandbox.exec("echo out; echo err >&2; pwd; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n/app\n", "err\n", False)
    sandbox.exec("mkdir -p /app/sub && cd /app/sub && export GREETING='hi there'")
    r = sandbox.exec('pwd; echo "$GREETING"; echo "$ONE"', env={"ONE": "1"})
    assert r.stdout == "/app/sub\nhi there\n1\n"
    r = sandbox.exec("pwd", workdir="/tmp")  # one-off directory: saved cwd is kept
    assert r.stdout == "/tmp\n"
    assert sandbox.exec("pwd").stdout == "/app/sub\n"


def test_timeout_kills_the_command_and_the_sandbox_goes_on(sandbox):
    r = sandbox.exec("echo started; sleep 30; echo never", timeout=1)
    assert r.timed_out and r.exit_code == -1
    assert "never" not in r.stdout
    assert sandbox.exec("echo alive").stdout == "alive\n"


def test_output_is_capped_head_and_tail(podman):
    p = DockerProvider(base_url=podman.base_url, max_output_bytes=1000, reap_on_start=False)
    with p.create(SandboxSpec(image=IMAGE)) as sb:
        r = sb.exec("echo FIRST; i=0; while [ $i -lt 3000 ]; do echo xxxxxxxx; i=$((i+1)); done; echo LAST")
    p.close()
    assert r.truncated and r.stdout.startswith("FIRST") and r.stdout.rstrip().endswith("LAST")
    assert len(r.stdout) < 1200


def test_limits_network_and_labels(podman, provider, sandbox):
    # cgroup v1 memory limit as the container sees it, and only loopback exists
    r = sandbox.exec(
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max;"
        " cat /proc/net/dev | tail -n +3 | cut -d: -f1"
    )
    mem, *ifaces = r.stdout.split()
    assert int(mem) == 256 * 1024 * 1024
    assert ifaces == ["lo"]
    attrs = provider.client.api.inspect_container(sandbox.name)
    labels = attrs["Config"]["Labels"]
    assert labels["tinkrl.run-id"] == "testrun" and labels["tinkrl.task-id"] == "hello/world"
    assert labels["tinkrl.owner-pid"] == str(os.getpid()) and labels["tinkrl.managed"] == "true"
    assert attrs["HostConfig"]["PidsLimit"] == 64
    assert attrs["HostConfig"]["NanoCpus"] == 500_000_000


def test_files_round_trip(sandbox, tmp_path):
    sandbox.write_file("/app/deep/dir/f.txt", "hello\n", mode=0o755)
    assert sandbox.read_file("/app/deep/dir/f.txt") == b"hello\n"
    assert sandbox.exec("test -x /app/deep/dir/f.txt && echo exec").stdout == "exec\n"
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("/app/missing")
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("A = 1\n")
    (src / "top.txt").write_bytes(b"\x00\x01binary")
    sandbox.copy_in(src, "/tests")
    assert sandbox.exec("cat /tests/pkg/a.py").stdout == "A = 1\n"
    out = tmp_path / "out"
    sandbox.copy_out("/tests", out)
    assert (out / "pkg" / "a.py").read_text() == "A = 1\n"
    assert (out / "top.txt").read_bytes() == b"\x00\x01binary"
    sandbox.copy_out("/tests/top.txt", tmp_path / "one.bin")
    assert (tmp_path / "one.bin").read_bytes() == b"\x00\x01binary"


def test_kill_all_stops_background_processes(sandbox):
    sandbox.exec("nohup sleep 300 >/dev/null 2>&1 &")
    assert "sleep 300" in sandbox.exec("ps -o args").stdout
    sandbox.kill_all()
    assert "sleep 300" not in sandbox.exec("ps -o args").stdout


def test_close_removes_the_container(provider):
    sb = provider.create(SandboxSpec(image=IMAGE))
    name = sb.name
    sb.close()
    sb.close()  # idempotent
    assert not provider.client.containers.list(all=True, filters={"name": name})
    with pytest.raises(SandboxError):
        sb.exec("true")


def test_missing_image_and_no_image_are_clear_errors(podman):
    p = DockerProvider(base_url=podman.base_url, pull="never", reap_on_start=False)
    with pytest.raises(SandboxError, match="not present") as e:
        p.create(SandboxSpec(image="localhost/does-not-exist:1"))
    assert e.value.failure_mode == "image_pull"
    with pytest.raises(SandboxError, match="needs an image"):
        p.create(SandboxSpec())
    p.close()


def test_leaked_containers_of_a_dead_run_are_reaped_and_a_live_runs_kept(podman, provider, tmp_path):
    live = provider.create(SandboxSpec(image=IMAGE, labels={"task_id": "live"}))
    # A run that dies without cleaning up (os._exit skips close and atexit).
    child = textwrap.dedent(f"""
        import os
        from tinkrl.sandbox.docker import DockerProvider
        from tinkrl.sandbox.base import SandboxSpec
        p = DockerProvider(base_url={podman.base_url!r}, run_id="deadrun", reap_on_start=False)
        sb = p.create(SandboxSpec(image={IMAGE!r}, labels={{"task_id": "leaked"}}))
        print(sb.name, flush=True)
        os._exit(0)
    """)
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1]
    )
    assert out.returncode == 0, out.stderr
    leaked = out.stdout.split()[-1]
    assert provider.client.containers.list(all=True, filters={"name": leaked})

    would = reap("docker", dry_run=True, options={"base_url": podman.base_url})
    assert (leaked, "owner gone") in would
    assert live.name not in [n for n, _ in would]
    gone = reap("docker", options={"base_url": podman.base_url})
    assert [n for n, _ in gone] == [leaked]
    assert not provider.client.containers.list(all=True, filters={"name": leaked})
    assert live.exec("echo still here").stdout == "still here\n"
    live.close()


def test_reap_by_run_id_and_provider_start_reaps(podman, provider):
    sb = provider.create(SandboxSpec(image=IMAGE))
    gone = reap("docker", run_id="testrun", options={"base_url": podman.base_url})
    assert sb.name in [n for n, _ in gone]
    with pytest.raises(SandboxError):
        sb.exec("true")
    sb.close()


@unless(
    None
    if os.path.exists("/usr/lib/podman/netavark")
    else "podman's bridge network needs netavark (apt-get install netavark iptables)"
)
def test_a_task_that_asks_for_network_gets_an_interface(provider):
    with provider.create(SandboxSpec(image=IMAGE, network=True)) as sb:
        ifaces = sb.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1").stdout.split()
    assert "lo" in ifaces and len(ifaces) >= 2  # no traffic is sent: only the interface is checked


def test_the_registry_builds_the_provider(podman):
    from tinkrl.sandbox import get_provider

    p = get_provider("docker", base_url=podman.base_url, reap_on_start=False)
    assert isinstance(p, DockerProvider) and p.config.base_url == podman.base_url
    p.close()
