"""The bubblewrap sandbox provider: one hardened bwrap namespace per episode, ~10 ms to start.

tinkrl usually runs as root, and bwrap started by root is no boundary by itself, so each
sandbox is started *as an unprivileged host uid of its own* (a lock file per uid in a
reserved range, so rlimits and cgroups are never shared between concurrent sandboxes) with
a user namespace that maps just that uid to root inside. Inside there are no capabilities
(bounding set empty), no further user namespaces, no network, a new session, a cleared
environment, the system directories read-only, a generated minimal /etc, and size-capped
tmpfs for the workdir, /tmp, /root, /tests and /logs. The host's /root, /home, project and
run directories are never mounted. pid and memory limits come from cgroups (v2 or v1,
whichever is writable), else from rlimits.

The sandbox's pid 1 is `bwrap_init.c`, compiled once per machine (or, without a C
compiler, `bwrap_server.py` run by Debian's /usr/bin/python3 — never the project venv):
it executes each command in its own session with a deadline, keeps the head and tail of
the output, and keeps cwd/exported env between calls like a terminal. Background processes
outlive the command that started them and die with the sandbox. The same binary, run as
root with `--launch`, joins the sandbox's cgroups and drops to its uid before exec'ing
bwrap, so no process of the sandbox ever has to be moved between cgroups.
"""

from __future__ import annotations

import fcntl
import io
import os
import queue
import select
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from pathlib import Path

from tinkrl.errors import ConfigError
from tinkrl.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxProvider, SandboxSpec
from tinkrl.sandbox.scaleout import check_abs, safe_extract

SERVER_SOURCE = Path(__file__).with_name("bwrap_server.py")
SERVER_IN_SANDBOX = "/run/tinkrl-server.pyc"
INIT_SOURCE = Path(__file__).with_name("bwrap_init.c")
INIT_IN_SANDBOX = "/run/tinkrl-init"
SERVERS = ("auto", "native", "python")
SANDBOX_PYTHON = "/usr/bin/python3"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_UID_BASE = 2_000_000_000
DEFAULT_UID_COUNT = 4096
DEFAULT_MAX_OUTPUT = 64 * 1024  # bytes of stdout (and of stderr) kept per command, head + tail
SMALL_TMPFS_MB = 256  # /root, /tests, /logs, /dev/shm
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
FORBIDDEN_WORKDIRS = (
    "/",
    "/usr",
    "/etc",
    "/proc",
    "/dev",
    "/sys",
    "/run",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/tests",
    "/logs",
    "/root",
    "/tmp",
    "/solution",
)
HOST_ETC_PASSTHROUGH = ("alternatives", "ld.so.cache", "ssl", "localtime", "gitconfig", "mime.types")
STARTUP_TIMEOUT_S = 20.0
REPLY_GRACE_S = 15.0  # how long past a command's own timeout the server may take to answer


def _bwrap_path() -> str:
    path = shutil.which("bwrap") or ("/usr/bin/bwrap" if os.path.exists("/usr/bin/bwrap") else None)
    if not path:
        raise SandboxError(
            "bubblewrap is not installed (apt-get install bubblewrap; see scripts/install-system.sh)",
            "sandbox_unavailable",
        )
    return path


# -- framing (mirror of bwrap_server.send/recv) ----------------------------------------------
def _frame(fields: list[bytes | str | int]) -> bytes:
    parts = [len(fields).to_bytes(4, "big")]
    for f in fields:
        if isinstance(f, str):
            f = f.encode("utf-8", "surrogateescape")
        elif isinstance(f, int):
            f = str(f).encode()
        parts.append(len(f).to_bytes(4, "big"))
        parts.append(f)
    return b"".join(parts)


class _Reader:
    """Reads frames from the server's stdout with a deadline."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buf = bytearray()

    def _need(self, n: int, deadline: float) -> bytes:
        while len(self.buf) < n:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.fd], [], [], wait)
            if ready:
                chunk = os.read(self.fd, max(1 << 16, n - len(self.buf)))
                if not chunk:
                    raise EOFError
                self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def recv(self, deadline: float) -> list[bytes]:
        count = int.from_bytes(self._need(4, deadline), "big")
        fields = []
        for _ in range(count):
            n = int.from_bytes(self._need(4, deadline), "big")
            fields.append(self._need(n, deadline) if n else b"")
        return fields


# -- uid allocation ------------------------------------------------------------------------
class _UidPool:
    """Hands out host uids from a reserved range; a flock per uid makes them unique host-wide."""

    def __init__(self, lock_dir: Path, base: int, count: int):
        self.lock_dir, self.base, self.count = lock_dir, base, count
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        self._next = 0
        self._mutex = threading.Lock()

    def acquire(self) -> tuple[int, int]:
        with self._mutex:
            start = self._next
            for i in range(self.count):
                idx = (start + i) % self.count
                uid = self.base + idx
                fd = os.open(self.lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._next = (idx + 1) % self.count
                return uid, fd
        raise SandboxError(f"all {self.count} sandbox uids from {self.base} are in use", "sandbox_capacity")

    @staticmethod
    def release(fd: int) -> None:
        try:
            os.close(fd)  # closing drops the flock
        except OSError:
            pass


# -- cgroups -------------------------------------------------------------------------------
class _Cgroups:
    """pid + memory limits per sandbox uid through cgroup v2 or v1; `mode` "none" when not writable."""

    NAME = "tinkrl-sandbox"

    def __init__(self, enabled: bool = True):
        self.mode = "none"
        self.bases: dict[str, Path] = {}
        if enabled and os.geteuid() == 0:
            for probe in (self._setup_v2, self._setup_v1):
                try:
                    if probe():
                        break
                except OSError:
                    self.bases = {}
            else:
                self.mode = "none"

    @staticmethod
    def _own_path(controller: str) -> str:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            if controller in ctrls.split(","):
                return path
        return "/"

    def _setup_v2(self) -> bool:
        root = Path("/sys/fs/cgroup")
        controllers = (
            (root / "cgroup.controllers").read_text().split() if (root / "cgroup.controllers").exists() else []
        )
        if not {"pids", "memory"} <= set(controllers):
            return False
        base = root / self.NAME
        (root / "cgroup.subtree_control").write_text("+pids +memory")
        base.mkdir(exist_ok=True)
        (base / "cgroup.subtree_control").write_text("+pids +memory")
        self.bases = {"unified": base}
        self.mode = "v2"
        self._probe()
        return True

    def _setup_v1(self) -> bool:
        bases = {}
        for ctrl in ("pids", "memory"):
            mount = Path("/sys/fs/cgroup") / ctrl
            if not (mount / "cgroup.procs").exists():
                return False
            own = self._own_path(ctrl).lstrip("/")
            base = mount / own / self.NAME
            base.mkdir(exist_ok=True)
            bases[ctrl] = base
        self.bases = bases
        self.mode = "v1"
        self._probe()
        return True

    def _probe(self) -> None:
        name = f"probe-{os.getpid()}"
        self.prepare(name, pids=16, memory_mb=64)
        self.remove(name)

    def _dirs(self, name: str) -> list[Path]:
        return [base / name for base in self.bases.values()]

    def procs_files(self, name: str) -> list[str]:
        """The cgroup.procs files a process writes itself into to join sandbox `name`."""
        return [str(d / "cgroup.procs") for d in self._dirs(name)]

    def prepare(self, name: str, pids: int, memory_mb: int) -> None:
        mem = str(memory_mb * 1024 * 1024)
        for d in self._dirs(name):
            d.mkdir(exist_ok=True)
            self._kill_members(d)
        if self.mode == "v2":
            d = self.bases["unified"] / name
            (d / "pids.max").write_text(str(pids))
            (d / "memory.max").write_text(mem)
            if (d / "memory.swap.max").exists():
                (d / "memory.swap.max").write_text("0")
        elif self.mode == "v1":
            (self.bases["pids"] / name / "pids.max").write_text(str(pids))
            m = self.bases["memory"] / name
            memsw = m / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text("-1")
            (m / "memory.limit_in_bytes").write_text(mem)
            if memsw.exists():
                memsw.write_text(mem)

    def add(self, name: str, pids: list[int]) -> None:
        for d in self._dirs(name):
            for pid in pids:
                try:
                    (d / "cgroup.procs").write_text(str(pid))
                except ProcessLookupError:
                    pass

    @staticmethod
    def _kill_members(d: Path) -> None:
        kill = d / "cgroup.kill"
        try:
            if kill.exists():
                kill.write_text("1")
                return
            for line in (d / "cgroup.procs").read_text().split():
                try:
                    os.kill(int(line), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        except OSError:
            pass

    def kill(self, name: str) -> None:
        for d in self._dirs(name):
            self._kill_members(d)

    def remove(self, name: str) -> None:
        for d in self._dirs(name):
            for _ in range(50):
                self._kill_members(d)
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.002)


# -- spawning ------------------------------------------------------------------------------
class _Spawner:
    """Starts bwrap from one long-lived thread.

    `--die-with-parent` ties the sandbox to the *thread* that forked it (PR_SET_PDEATHSIG),
    so sandboxes created from a short-lived worker thread would die with that thread.
    """

    def __init__(self):
        self._q: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _loop(self) -> None:
        while True:
            fn, box = self._q.get()
            try:
                box["result"] = fn()
            except BaseException as e:  # handed back to the caller's thread
                box["error"] = e
            box["done"].set()

    def run(self, fn):
        if threading.current_thread() is threading.main_thread():
            return fn()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="tinkrl-bwrap-spawner", daemon=True)
                self._thread.start()
        box = {"done": threading.Event()}
        self._q.put((fn, box))
        box["done"].wait()
        if "error" in box:
            raise box["error"]
        return box["result"]


_SPAWNER = _Spawner()


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return out


def _generated_etc(state_dir: Path) -> Path:
    """A minimal /etc shared (read-only) by all sandboxes: never the host's passwd/shadow."""
    files = {
        "passwd": "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": "root:x:0:\nnogroup:x:65534:\n",
        "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        "resolv.conf": "# no network in the sandbox\n",
        "hostname": "sandbox\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
        "shells": "/bin/sh\n/bin/bash\n",
    }
    import hashlib

    digest = hashlib.sha256(repr(sorted(files.items())).encode() + repr(HOST_ETC_PASSTHROUGH).encode()).hexdigest()[:12]
    etc = state_dir / f"etc-{digest}"
    if etc.is_dir():
        return etc
    tmp = state_dir / f".etc-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o755)
    for name, text in files.items():
        (tmp / name).write_text(text)
        (tmp / name).chmod(0o644)
    for name in HOST_ETC_PASSTHROUGH:  # mount points for the host entries bound read-only on top
        host = Path("/etc") / name
        if host.is_dir():
            (tmp / name).mkdir(mode=0o755)
        elif host.exists():
            (tmp / name).touch(mode=0o644)
    os.symlink("../usr/lib/os-release", tmp / "os-release")
    tmp.chmod(0o755)
    try:
        tmp.rename(etc)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return etc


def _compiled_server(state_dir: Path) -> Path:
    """bwrap_server.py compiled once by the sandbox's own python (saves ~5 ms per sandbox start)."""
    import hashlib

    source = SERVER_SOURCE.read_bytes()
    version = subprocess.run(
        [SANDBOX_PYTHON, "-I", "-S", "-c", "import sys; print(sys.hexversion)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    digest = hashlib.sha256(source + version.encode()).hexdigest()[:12]
    pyc = state_dir / f"server-{digest}.pyc"
    if not pyc.exists():
        tmp = state_dir / f".server-{os.getpid()}-{threading.get_ident()}"
        tmp.mkdir(mode=0o755, exist_ok=True)
        (tmp / "bwrap_server.py").write_bytes(source)
        subprocess.run(
            [
                SANDBOX_PYTHON,
                "-I",
                "-S",
                "-c",
                "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)",
                str(tmp / "bwrap_server.py"),
                str(tmp / "server.pyc"),
            ],
            check=True,
            capture_output=True,
        )
        (tmp / "server.pyc").chmod(0o644)
        os.replace(tmp / "server.pyc", pyc)
        shutil.rmtree(tmp, ignore_errors=True)
    return pyc


def _compiled_init(state_dir: Path) -> tuple[Path | None, str]:
    """bwrap_init.c built once (static if libc.a is there); (None, why) without a C compiler."""
    import hashlib

    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None, "no C compiler (cc) on PATH"
    if not INIT_SOURCE.exists():
        return None, f"{INIT_SOURCE} is missing from this install"
    source = INIT_SOURCE.read_bytes()
    binary = state_dir / f"init-{hashlib.sha256(source).hexdigest()[:12]}"
    if binary.exists():
        return binary, ""
    tmp = state_dir / f".init-{os.getpid()}-{threading.get_ident()}"
    err = ""
    for static in (["-static"], []):
        r = subprocess.run([cc, "-O2", "-o", str(tmp), str(INIT_SOURCE), *static], capture_output=True, text=True)
        if r.returncode == 0:
            tmp.chmod(0o755)
            os.replace(tmp, binary)
            return binary, ""
        err = (r.stderr.strip().splitlines() or [f"cc exited {r.returncode}"])[-1]
    tmp.unlink(missing_ok=True)
    return None, f"cannot compile {INIT_SOURCE.name}: {err}"


def _default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/run/tinkrl-sandbox")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "tinkrl-sandbox" if runtime else Path(f"/tmp/tinkrl-sandbox-{os.getuid()}")


def _check_workdir(workdir: str) -> str:
    norm = os.path.normpath(workdir) if workdir else ""
    inside_system = any(norm.startswith(d + "/") for d in FORBIDDEN_WORKDIRS if d not in ("/", "/tmp"))
    if not norm.startswith("/") or norm in FORBIDDEN_WORKDIRS or inside_system:
        raise SandboxError(f"workdir {workdir!r} must be an absolute path outside the system directories", "bad_spec")
    return norm


class BwrapSandbox(Sandbox):
    """A running bwrap namespace; every method talks to its pid-1 server."""

    def __init__(self, provider: BwrapProvider, spec: SandboxSpec):
        self.spec = spec
        self.provider = provider
        self.workdir = _check_workdir(spec.workdir)
        self._lock = threading.Lock()
        self._closed = False
        self.proc: subprocess.Popen | None = None
        self.uid, self._uid_fd = provider._uids.acquire() if provider._uids else (os.getuid(), -1)
        self.cgroup = f"u{self.uid}"
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # -- lifecycle -----------------------------------------------------------------------
    def _argv(self) -> list[str]:
        p, spec = self.provider, self.spec
        disk = str(max(spec.disk_mb, 1) * 1024 * 1024)
        small = str(min(max(spec.disk_mb, 1), SMALL_TMPFS_MB) * 1024 * 1024)
        argv = [
            p.bwrap,
            "--unshare-user",
            "--uid",
            "0",
            "--gid",
            "0",
            "--disable-userns",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "sandbox",
            "--new-session",
            "--die-with-parent",
            "--as-pid-1",
            "--clearenv",
            "--cap-drop",
            "ALL",
        ]
        if not spec.network:
            argv.append("--unshare-net")
        for d in SYSTEM_DIRS:
            if os.path.islink(d):
                argv += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                argv += ["--ro-bind", d, d]
        argv += ["--ro-bind", str(p.etc_dir), "/etc"]
        for name in HOST_ETC_PASSTHROUGH:
            if (p.etc_dir / name).exists():
                argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        argv += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--perms",
            "1777",
            "--size",
            small,
            "--tmpfs",
            "/dev/shm",
            "--perms",
            "1777",
            "--size",
            disk,
            "--tmpfs",
            "/tmp",
            "--perms",
            "0700",
            "--size",
            small,
            "--tmpfs",
            "/root",
            "--perms",
            "0755",
            "--size",
            "4194304",
            "--tmpfs",
            "/run",
            "--perms",
            "0755",
            "--size",
            small,
            "--tmpfs",
            "/tests",
            "--perms",
            "0755",
            "--size",
            small,
            "--tmpfs",
            "/logs",
            "--perms",
            "0755",
            "--size",
            small,
            "--tmpfs",
            "/solution",
            "--dir",
            "/var",
            "--symlink",
            "../tmp",
            "/var/tmp",
            "--perms",
            "0755",
            "--size",
            disk,
            "--tmpfs",
            self.workdir,
            "--remount-ro",
            "/",
            "--chdir",
            self.workdir,
        ]
        mem_rlimit = 0 if p.cgroups.mode != "none" else spec.memory_mb * 1024 * 1024
        nproc = spec.pids + 4  # + server, bwrap's own processes
        env = {
            "PATH": DEFAULT_PATH,
            "HOME": "/root",
            "USER": "root",
            "LOGNAME": "root",
            "SHELL": "/bin/bash",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "TMPDIR": "/tmp",
            "HOSTNAME": "sandbox",
        }
        env.update(spec.env)
        argv += ["--ro-bind", str(p.server_pyc), SERVER_IN_SANDBOX]
        if p.server == "native":
            argv += ["--ro-bind", str(p.init_bin), INIT_IN_SANDBOX, "--", INIT_IN_SANDBOX]
        else:
            argv += ["--", SANDBOX_PYTHON, "-I", "-S", SERVER_IN_SANDBOX]
        argv += [self.workdir, str(nproc), str(mem_rlimit)]
        argv += [f"{k}={v}" for k, v in env.items()]
        if p._uids is not None and p.init_bin is not None:
            # join the cgroups and drop to the sandbox's uid *before* bwrap forks anything
            cgroups = p.cgroups.procs_files(self.cgroup) if p.cgroups.mode != "none" else []
            argv = [str(p.init_bin), "--launch", str(self.uid), *cgroups, "--", *argv]
        return argv

    def _start(self) -> None:
        p = self.provider
        if p.cgroups.mode != "none":
            p.cgroups.prepare(self.cgroup, pids=self.spec.pids + 4, memory_mb=self.spec.memory_mb)
        argv = self._argv()
        launched = p._uids is not None and p.init_bin is not None  # the launcher drops to self.uid
        as_user = p._uids is not None and not launched

        def spawn() -> subprocess.Popen:
            return subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd="/",
                env={"PATH": DEFAULT_PATH},
                close_fds=True,
                user=self.uid if as_user else None,
                group=self.uid if as_user else None,
                extra_groups=[] if as_user else None,
            )

        self.proc = _SPAWNER.run(spawn)
        self._reader = _Reader(self.proc.stdout.fileno())
        try:
            reply = self._reader.recv(time.monotonic() + STARTUP_TIMEOUT_S)
        except (EOFError, TimeoutError):
            self._kill_proc()
            err = self.proc.stderr.read().decode(errors="replace").strip() if self.proc.stderr else ""
            raise SandboxError(
                f"bwrap sandbox failed to start: {err or 'no reply from the sandbox server'}", "sandbox_start_failed"
            ) from None
        if reply != [b"ready"]:
            raise SandboxError(f"bwrap sandbox sent {reply!r} instead of ready", "sandbox_start_failed")
        if p.cgroups.mode != "none" and not launched:  # nothing of the agent's runs yet: move bwrap + server in
            p.cgroups.add(self.cgroup, _descendants(self.proc.pid))

    def _kill_proc(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
            self.proc.wait()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._kill_proc()  # pid 1 inside gets SIGKILL from --die-with-parent; the kernel kills the rest
        if self.proc:
            for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                try:
                    f and f.close()
                except OSError:
                    pass
        if self.provider.cgroups.mode != "none":
            self.provider.cgroups.kill(self.cgroup)
        if self._uid_fd >= 0:
            _UidPool.release(self._uid_fd)
            self._uid_fd = -1
        self.provider._forget(self)

    # -- protocol ------------------------------------------------------------------------
    def _call(self, fields: list, timeout: float) -> list[bytes]:
        with self._lock:
            if self._closed:
                raise SandboxError("sandbox is closed", "sandbox_closed")
            try:
                self.proc.stdin.write(_frame(fields))
                self.proc.stdin.flush()
                reply = self._reader.recv(time.monotonic() + timeout)
            except (BrokenPipeError, EOFError, TimeoutError, ValueError) as e:
                died = self.proc.poll() is not None
                self._closed = True
                self._kill_proc()
                self._closed = False
                self.close()
                what = "died" if died else "stopped answering"
                raise SandboxError(f"bwrap sandbox {what} ({type(e).__name__})", "sandbox_died") from None
        if reply and reply[0] == b"err":
            errno_ = int(reply[1] or 0)
            msg = reply[2].decode(errors="replace")
            if errno_ == 2:
                raise FileNotFoundError(errno_, msg)
            if errno_ == 21:
                raise IsADirectoryError(errno_, msg)
            raise OSError(errno_, msg)
        return reply[1:]

    # -- Sandbox API ---------------------------------------------------------------------
    def exec(
        self,
        command: str,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run `command` with bash; `workdir` given = a one-off directory (the shell's cwd is kept).

        `user` is accepted for interface compatibility: a bwrap sandbox has one user (root inside).
        """
        env_blob = b"\0".join(f"{k}={v}".encode() for k, v in (env or {}).items())
        mode = "persist" if workdir is None else "oneshot"
        timeout_ms = max(int(timeout * 1000), 1)
        t0 = time.monotonic()
        code, timed_out, truncated, out, err, _ = self._call(
            ["exec", command, timeout_ms, workdir or "", env_blob, mode, self.provider.max_output_bytes],
            timeout + REPLY_GRACE_S,
        )
        return ExecResult(
            exit_code=int(code),
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            timed_out=timed_out == b"1",
            truncated=truncated == b"1",
            duration_s=time.monotonic() - t0,
        )

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        if isinstance(data, str):
            data = data.encode()
        self._call(["write", check_abs(path), str(mode), data], 60.0)

    def read_file(self, path: str) -> bytes:
        return self._call(["read", check_abs(path)], 60.0)[0]

    def copy_in(self, src: Path, dest: str) -> None:
        """Copy a host file to `dest`, or a host directory's contents into directory `dest`."""
        src = Path(src)
        if src.is_file():
            self.write_file(dest, src.read_bytes(), src.stat().st_mode & 0o777)
            return
        if not src.is_dir():
            raise FileNotFoundError(2, "No such file or directory", str(src))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            tf.add(str(src), arcname=".")
        self._call(["untar", check_abs(dest), buf.getvalue()], 300.0)

    def copy_out(self, src: str, dest: Path) -> None:
        """Copy a sandbox file to host path `dest`, or a directory's contents into directory `dest`.

        Only regular files and directories come out (no links, devices or absolute paths):
        the sandbox's content is untrusted and we are usually root.
        """
        data = self._call(["tar", check_abs(src)], 300.0)[0]
        safe_extract(data, Path(dest), strip_top=False)

    def kill_all(self) -> None:
        self._call(["killall"], 30.0)

    @property
    def alive(self) -> bool:
        return not self._closed and self.proc is not None and self.proc.poll() is None


def _pool_key(spec: SandboxSpec) -> tuple:
    """Everything a started sandbox has baked in (mounts, limits, pid 1's env)."""
    return (spec.workdir, tuple(sorted(spec.env.items())), spec.network, spec.memory_mb, spec.pids, spec.disk_mb)


class _WarmPool:
    """Keeps `size` started, never-used sandboxes per recently asked-for spec.

    A pooled sandbox is exactly what a cold `create` would return — started, handshake
    done, nothing run in it — only started earlier by a background thread; each is handed
    out once. The pool refills for the `MAX_SPECS` specs asked for most recently.
    """

    MAX_SPECS = 4
    RETRY_AFTER_FAILURE_S = 2.0

    def __init__(self, provider: BwrapProvider, size: int):
        self.provider, self.size = provider, size
        self.ready: dict[tuple, list[BwrapSandbox]] = {}
        self.starting: dict[tuple, int] = {}
        self.wanted: dict[tuple, SandboxSpec] = {}  # insertion order = least recently asked first
        self.cond = threading.Condition()
        self.closed = False
        self.last_error: str | None = None
        self.thread = threading.Thread(target=self._fill, name="tinkrl-bwrap-pool", daemon=True)
        self.thread.start()

    def take(self, spec: SandboxSpec) -> BwrapSandbox | None:
        key = _pool_key(spec)
        evicted: list[BwrapSandbox] = []
        with self.cond:
            self.wanted.pop(key, None)
            self.wanted[key] = SandboxSpec(
                workdir=spec.workdir,
                env=dict(spec.env),
                network=spec.network,
                memory_mb=spec.memory_mb,
                pids=spec.pids,
                disk_mb=spec.disk_mb,
            )
            while len(self.wanted) > self.MAX_SPECS:
                old = next(iter(self.wanted))
                del self.wanted[old]
                evicted += self.ready.pop(old, [])
            ready = self.ready.get(key)
            sb = ready.pop(0) if ready else None
            self.cond.notify_all()
        for old_sb in evicted:
            old_sb.close()
        if sb is not None and not sb.alive:  # died while waiting (e.g. killed from outside)
            sb.close()
            return None
        if sb is not None:
            sb.spec = spec
        return sb

    def _next_wanted(self) -> tuple[tuple, SandboxSpec] | None:
        for key, spec in reversed(self.wanted.items()):  # most recently asked first
            if len(self.ready.get(key, ())) + self.starting.get(key, 0) < self.size:
                return key, spec
        return None

    def _fill(self) -> None:
        while True:
            with self.cond:
                while not self.closed and (job := self._next_wanted()) is None:
                    self.cond.wait()
                if self.closed:
                    return
                key, spec = job
                self.starting[key] = self.starting.get(key, 0) + 1
            sb, failed = None, False
            try:
                sb = self.provider._start_sandbox(spec)
            except Exception as e:  # recorded; callers fall back to a cold start
                self.last_error, failed = f"{type(e).__name__}: {e}", True
            with self.cond:
                self.starting[key] -= 1
                keep = sb is not None and not self.closed and key in self.wanted
                if keep:
                    self.ready.setdefault(key, []).append(sb)
            if sb is not None and not keep:
                sb.close()
            if failed:
                time.sleep(self.RETRY_AFTER_FAILURE_S)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            idle = [sb for sbs in self.ready.values() for sb in sbs]
            self.ready.clear()
            self.cond.notify_all()
        for sb in idle:
            sb.close()
        self.thread.join(timeout=STARTUP_TIMEOUT_S)


class BwrapProvider(SandboxProvider):
    """Creates bwrap sandboxes on this machine.

    Options: `uid_base`/`uid_count` (the reserved host uid range, root only), `state_dir`
    (uid locks and the generated /etc), `max_output_bytes` (kept per stream and command),
    `cgroups` (False = rlimits only), `server` ("native": the compiled bwrap_init.c as pid 1;
    "python": bwrap_server.py as pid 1; "auto": native when a C compiler is there), `pool`
    (0 = start every sandbox on demand; N = keep N fresh, never-used sandboxes started
    ahead for each recently asked-for spec, so `create` hands one out).
    """

    name = "bwrap"

    def __init__(
        self,
        *,
        uid_base: int = DEFAULT_UID_BASE,
        uid_count: int = DEFAULT_UID_COUNT,
        state_dir: str | Path | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT,
        cgroups: bool = True,
        server: str = "auto",
        pool: int = 0,
    ):
        if server not in SERVERS:
            raise ConfigError(f"bwrap server {server!r} is not one of {', '.join(SERVERS)}")
        self.bwrap = _bwrap_path()
        if not os.access(SANDBOX_PYTHON, os.X_OK):
            raise SandboxError(
                f"{SANDBOX_PYTHON} is missing: the sandbox runs Debian's python3 (apt-get install python3)",
                "sandbox_unavailable",
            )
        self.state_dir = Path(state_dir) if state_dir else _default_state_dir()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o755)
        self.etc_dir = _generated_etc(self.state_dir)
        self.server_pyc = _compiled_server(self.state_dir)
        self.init_bin, why = _compiled_init(self.state_dir) if server != "python" else (None, "")
        if server == "native" and self.init_bin is None:
            raise SandboxError(f"the native bwrap sandbox server is unavailable: {why}", "sandbox_unavailable")
        self.server = "native" if self.init_bin is not None else "python"
        self.max_output_bytes = max_output_bytes
        self._uids = _UidPool(self.state_dir / "uids", uid_base, uid_count) if os.geteuid() == 0 else None
        self.cgroups = _Cgroups(enabled=cgroups)
        self._live: set[BwrapSandbox] = set()
        self._live_lock = threading.Lock()
        if pool < 0:
            raise ConfigError(f"bwrap pool must be >= 0, got {pool}")
        self.pool = _WarmPool(self, pool) if pool else None

    def create(self, spec: SandboxSpec | None = None) -> BwrapSandbox:
        spec = spec or SandboxSpec()
        if spec.image:
            raise ConfigError(
                f"this task needs the container image {spec.image!r}, which the bwrap sandbox cannot "
                "run: set sandbox.provider to docker or kubernetes"
            )
        if self.pool is not None:
            _check_workdir(spec.workdir)
            sb = self.pool.take(spec)
            if sb is not None:
                return sb
        return self._start_sandbox(spec)

    def _start_sandbox(self, spec: SandboxSpec) -> BwrapSandbox:
        sb = BwrapSandbox(self, spec)
        with self._live_lock:
            self._live.add(sb)
        return sb

    def _forget(self, sb: BwrapSandbox) -> None:
        with self._live_lock:
            self._live.discard(sb)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        with self._live_lock:
            live = list(self._live)
        for sb in live:
            sb.close()
