"""One bwrap sandbox: the hardened bwrap command line, its start-up and the calls to its pid 1.

Inside there are no capabilities (bounding set empty), no further user namespaces, no
network unless asked, a new session, a cleared environment, the system directories
read-only, the generated /etc, and size-capped tmpfs for the workdir, /tmp, /root, /tests
and /logs. The host's /root, /home, project and run directories are never mounted. As root,
the sandbox runs as its own unprivileged host uid (`uids.py`), mapped to root inside.

Unusual: bwrap is always forked from one long-lived thread (`_Spawner`), because
`--die-with-parent` ties a sandbox to the *thread* that forked it.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tinkrl.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxSpec
from tinkrl.sandbox.bwrap.build import HOST_ETC_PASSTHROUGH, SANDBOX_PYTHON
from tinkrl.sandbox.bwrap.cgroups import descendants
from tinkrl.sandbox.bwrap.protocol import FrameReader, encode_frame
from tinkrl.sandbox.bwrap.uids import UidPool
from tinkrl.sandbox.files import check_abs, safe_extract, tar_host_path

if TYPE_CHECKING:
    from tinkrl.sandbox.bwrap.provider import BwrapProvider

SERVER_IN_SANDBOX = "/run/tinkrl-server.pyc"
INIT_IN_SANDBOX = "/run/tinkrl-init"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
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
STARTUP_TIMEOUT_S = 20.0
REPLY_GRACE_S = 15.0  # how long past a command's own timeout the server may take to answer


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
        """`fn()` called on the spawner thread (directly on the main thread, which lives as long as the process)."""
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


def check_workdir(workdir: str) -> str:
    """`workdir` normalised; SandboxError when it is relative or inside a system directory."""
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
        self.workdir = check_workdir(spec.workdir)
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
        argv += ["--proc", "/proc", "--dev", "/dev"]
        scratch = [("/dev/shm", "1777", small), ("/tmp", "1777", disk), ("/root", "0700", small)]
        scratch += [("/run", "0755", "4194304"), *((d, "0755", small) for d in ("/tests", "/logs", "/solution"))]
        for d, perms, size in scratch:  # each a tmpfs of its own size
            argv += ["--perms", perms, "--size", size, "--tmpfs", d]
        argv += ["--dir", "/var", "--symlink", "../tmp", "/var/tmp"]
        argv += ["--perms", "0755", "--size", disk, "--tmpfs", self.workdir]
        argv += ["--remount-ro", "/", "--chdir", self.workdir]
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
        self._reader = FrameReader(self.proc.stdout.fileno())
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
            p.cgroups.add(self.cgroup, descendants(self.proc.pid))

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
            UidPool.release(self._uid_fd)
            self._uid_fd = -1
        self.provider._forget(self)

    # -- protocol ------------------------------------------------------------------------
    def _call(self, fields: list, timeout: float) -> list[bytes]:
        with self._lock:
            if self._closed:
                raise SandboxError("sandbox is closed", "sandbox_closed")
            try:
                self.proc.stdin.write(encode_frame(fields))
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
        self._call(["untar", check_abs(dest), tar_host_path(src, ".")], 300.0)

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
        """Open and its bwrap process still running."""
        return not self._closed and self.proc is not None and self.proc.poll() is None
