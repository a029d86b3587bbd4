"""Hostile commands in a bwrap sandbox are denied or contained; host and next sandbox unaffected."""

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from helpers.requirements import STRICT, needs_bwrap

from tinkrl.sandbox import get_provider
from tinkrl.sandbox.base import SandboxSpec

pytestmark = needs_bwrap
PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", params=["native", "python"])
def provider(request):
    """Every test runs against both pid-1 servers: the compiled bwrap_init.c and bwrap_server.py."""
    if request.param == "native" and shutil.which("cc") is None and not STRICT:
        pytest.skip("no C compiler: the native sandbox server cannot be built (`make install` installs gcc)")
    p = get_provider("bwrap", server=request.param)
    assert p.server == request.param
    yield p
    p.close()


@pytest.fixture
def sb(provider):
    with provider.create(SandboxSpec(workdir="/app", memory_mb=256, pids=64, disk_mb=32)) as s:
        yield s


def test_host_files_are_invisible(sb, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    r = sb.exec(f"cat /etc/shadow; cat {secret}; ls {PROJECT}; ls -A /root /home; cat /etc/passwd")
    assert "host secret" not in r.output
    assert "No such file" in r.output
    assert "pyproject.toml" not in r.output
    passwd = sb.read_file("/etc/passwd").decode()
    assert passwd.splitlines()[0].startswith("root:x:0:0") and len(passwd.splitlines()) == 2
    assert sb.exec("ls -A /root").stdout == ""


def test_no_capabilities_and_no_user_namespaces(sb):
    caps = sb.exec("grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status").stdout.split("\n")
    assert len([c for c in caps if c]) == 4 and all(c.endswith("0000000000000000") for c in caps if c)
    assert sb.exec("unshare -U true").exit_code != 0
    assert sb.exec("unshare -n true").exit_code != 0


def test_cannot_remount_or_write_outside_writable_dirs(sb):
    r = sb.exec("mount -o remount,rw /usr; mount -o remount,rw /; touch /usr/x /etc/x /x /bin/x 2>&1; echo done")
    assert r.output.count("Read-only file system") >= 4
    assert sb.exec("test -e /usr/x || test -e /x").exit_code != 0
    assert sb.exec("touch /app/ok /tmp/ok /root/ok").exit_code == 0


def test_no_network_even_to_host_loopback(sb):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        r = sb.exec(f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\"")
        assert r.exit_code != 0 and ("refused" in r.output or "unreachable" in r.output)
    finally:
        srv.close()


def test_host_environment_is_not_inherited(provider, monkeypatch):
    monkeypatch.setenv("TINKRL_TEST_HOST_SECRET", "s3cr3t")
    with provider.create(SandboxSpec(env={"VISIBLE": "yes"})) as s:
        out = s.exec("env").stdout
    assert "s3cr3t" not in out and "VISIBLE=yes" in out and "PATH=/usr/local/sbin" in out


def test_supervisor_cannot_be_killed_or_inspected(sb):
    r = sb.exec("kill -9 1; kill -INT 1; cat /proc/1/environ; ls /proc/1/fd; echo still-here")
    assert "still-here" in r.stdout
    assert sb.exec("echo alive").stdout == "alive\n"


def test_fork_bomb_is_contained_and_sibling_unaffected(provider):
    with provider.create(SandboxSpec(pids=32, memory_mb=256)) as bomb, provider.create(SandboxSpec()) as sibling:
        results = {}
        t = threading.Thread(target=lambda: results.update(r=bomb.exec("f(){ f | f & }; f; sleep 10", timeout=3)))
        t.start()
        time.sleep(0.5)
        assert sibling.exec("for i in 1 2 3; do echo ok; done").stdout == "ok\nok\nok\n"
        t.join()
        assert results["r"].timed_out
        bomb.kill_all()
        assert bomb.exec("echo recovered").stdout == "recovered\n"


def test_memory_limit(provider):
    with provider.create(SandboxSpec(memory_mb=128)) as s:
        r = s.exec("python3 -c 'x = bytearray(600 * 1024 * 1024); print(len(x))'", timeout=30)
        assert r.exit_code != 0 and "629145600" not in r.stdout
        assert s.exec("echo alive").stdout == "alive\n"


def test_disk_fill_with_small_files_is_capped(provider):
    with provider.create(SandboxSpec(disk_mb=8, memory_mb=512)) as s:
        r = s.exec("i=0; while echo x > /app/f$i; do i=$((i+1)); done; echo made $i", timeout=20)
        assert "No space left on device" in r.output
        made = int(r.stdout.split()[-1])
        assert 100 < made < 10000  # 8 MiB of 4 KiB pages
        size = s.exec("df -k --output=size /app | tail -1").stdout.strip()
        assert int(size) <= 8 * 1024
        assert s.exec("rm -f /app/f*; echo freed").stdout == "freed\n"


def test_huge_output_is_capped_head_and_tail(sb):
    r = sb.exec("echo FIRST; head -c 200000000 /dev/zero | tr '\\0' x; echo; echo LAST", timeout=60)
    assert r.truncated and r.exit_code == 0
    assert r.stdout.startswith("FIRST") and r.stdout.rstrip().endswith("LAST")
    assert len(r.stdout) < 100_000 and "bytes of output omitted" in r.stdout


def test_timeout_kills_the_group_and_sandbox_stays_usable(sb):
    r = sb.exec("sleep 1000 & sleep 1000", timeout=1)
    assert r.timed_out and r.exit_code == -1
    assert "sleep" not in sb.exec("ps -eo comm").stdout
    assert sb.exec("echo next").stdout == "next\n"


def test_state_and_background_processes_persist_until_kill_all(sb):
    sb.exec("cd /tmp && export GREETING=hi && (sleep 300 &)")
    r = sb.exec("pwd; echo $GREETING; ps -eo comm | grep -c sleep")
    assert r.stdout.split() == ["/tmp", "hi", "1"]
    assert sb.exec("pwd", workdir="/app").stdout == "/app\n"
    assert sb.exec("pwd").stdout == "/tmp\n"
    sb.kill_all()
    assert sb.exec("ps -eo comm | grep -c sleep").stdout.strip() == "0"


def test_files_roundtrip_and_copy_out_is_safe(sb, tmp_path):
    sb.write_file("/app/d/a.txt", "A")
    sb.exec("ln -s /etc/passwd /app/d/link; mkdir -p /app/d/sub && echo B > /app/d/sub/b.txt")
    assert sb.read_file("/app/d/a.txt") == b"A"
    with pytest.raises(FileNotFoundError):
        sb.read_file("/app/missing")
    sb.copy_out("/app/d", tmp_path / "out")
    assert (tmp_path / "out" / "a.txt").read_text() == "A"
    assert (tmp_path / "out" / "sub" / "b.txt").read_text() == "B\n"
    assert not (tmp_path / "out" / "link").exists()  # links never come out
    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    (src / "x" / "y.txt").write_text("Y")
    sb.copy_in(src, "/app/in")
    assert sb.read_file("/app/in/x/y.txt") == b"Y"


def test_next_sandbox_starts_clean(provider):
    with provider.create(SandboxSpec()) as a:
        a.exec("echo dirty > /app/mark; echo dirty > /tmp/mark; (sleep 300 &)")
    with provider.create(SandboxSpec()) as b:
        assert b.exec("ls -A /app /tmp; ps -eo comm | grep -c sleep").stdout.split() == ["/app:", "/tmp:", "0"]


def test_closed_sandbox_raises_sandbox_error(provider):
    from tinkrl.sandbox.base import SandboxError

    s = provider.create(SandboxSpec())
    s.close()
    s.close()  # idempotent
    with pytest.raises(SandboxError):
        s.exec("true")


def test_bad_workdir_is_refused(provider):
    from tinkrl.sandbox.base import SandboxError

    with pytest.raises(SandboxError, match="workdir"):
        provider.create(SandboxSpec(workdir="/usr/lib"))


def test_sandbox_outlives_the_thread_that_created_it(provider):
    # --die-with-parent ties bwrap to the forking *thread*; creation goes through a long-lived one
    box = {}
    t = threading.Thread(target=lambda: box.update(sb=provider.create(SandboxSpec())))
    t.start()
    t.join()
    time.sleep(0.2)
    with box["sb"] as s:
        assert s.exec("echo alive").stdout == "alive\n"


def test_state_file_swapped_for_a_fifo_does_not_hang_the_supervisor(sb):
    # pid 1 reads the shell's saved cwd/env after each command: a fifo there must not block it
    r = sb.exec("trap - EXIT; rm -f /run/tinkrl/shell-state; mkfifo /run/tinkrl/shell-state; echo planted", timeout=5)
    assert r.stdout == "planted\n"
    assert sb.exec("echo alive", timeout=5).stdout == "alive\n"


def test_every_sandbox_process_runs_as_its_own_uid_inside_its_cgroups(provider):
    from tinkrl.sandbox.bwrap.cgroups import descendants

    if os.geteuid() != 0:
        pytest.skip("per-sandbox host uids and cgroups need root")
    with provider.create(SandboxSpec()) as s:
        s.exec("sleep 30 &")
        pids = descendants(s.proc.pid)
        assert len(pids) >= 3  # bwrap, pid 1, sleep
        for pid in pids:
            uids = Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[:4]
            assert uids == [str(s.uid)] * 4 and s.uid != 0
            if provider.cgroups.mode != "none":
                cgroups = Path(f"/proc/{pid}/cgroup").read_text()
                for ctrl in ("pids", "memory"):
                    line = next(
                        ln
                        for ln in cgroups.splitlines()
                        if ctrl in ln.split(":")[1].split(",")
                        or (provider.cgroups.mode == "v2" and ln.startswith("0::"))
                    )
                    assert line.endswith(f"/{s.cgroup}")


def test_planted_links_to_the_supervisors_pipes_are_refused(sb):
    # write_file/read_file run in pid 1: a link to its own stdin/stdout must not touch the host protocol
    sb.exec(
        "mkdir -p /tests && ln -s /proc/1/fd/1 /tests/out.py && ln -s /proc/1/fd/0 /tests/in.txt && "
        "ln -s /dev/stdout /tests/std.py && mkfifo /tests/fifo"
    )
    for path in ("/tests/out.py", "/tests/std.py", "/tests/fifo"):  # denied (pid 1 is non-dumpable) or refused
        with pytest.raises(OSError):
            sb.write_file(path, "\x00\x00\x00\x01\x00\x00\x00\x02ok")
    with pytest.raises(OSError):
        sb.read_file("/tests/in.txt")
    with pytest.raises(OSError, match="not a regular file"):  # a fifo nobody writes must not block pid 1
        sb.read_file("/tests/fifo")
    with pytest.raises(IsADirectoryError):
        sb.read_file("/tests")
    assert sb.exec("echo alive").stdout == "alive\n"
    sb.write_file("/tests/real.py", "x = 1\n")
    assert sb.read_file("/tests/real.py") == b"x = 1\n"


def test_tiny_timeouts_and_nul_bytes_are_command_failures(sb):
    for _ in range(5):  # the deadline may pass before the command's shell has its own session
        r = sb.exec("sleep 1000", timeout=0.001)
        assert r.timed_out and r.exit_code == -1
    r = sb.exec("echo a\x00b")
    assert r.exit_code != 0 and not r.timed_out
    assert sb.exec("echo alive").stdout == "alive\n"


def test_megabytes_copy_in_and_out_intact(sb, tmp_path):
    import hashlib

    src = tmp_path / "big"
    src.mkdir()
    blob = os.urandom(3 << 20)
    (src / "blob.bin").write_bytes(blob)
    sb.copy_in(src, "/app/big")  # tar through the pid 1's file helper
    assert sb.exec("sha256sum /app/big/blob.bin").stdout.split()[0] == hashlib.sha256(blob).hexdigest()
    sb.write_file("/app/w.bin", blob)
    assert sb.read_file("/app/w.bin") == blob
    sb.copy_out("/app/big", tmp_path / "back")
    assert (tmp_path / "back" / "blob.bin").read_bytes() == blob
