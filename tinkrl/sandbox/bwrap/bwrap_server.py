"""The process that lives inside a bwrap sandbox as its pid 1 and runs every command.

Started by `tinkrl.sandbox.bwrap` with Debian's `/usr/bin/python3 -I -S` when no C compiler
is available; normally pid 1 is the native `bwrap_init.c`, which speaks the same protocol
and runs this file with `--one` only for tar/untar requests. It speaks a tiny framed
protocol on stdin/stdout (no json: every import adds to the start-up time every sandbox
pays). Each request runs to completion before the next is read.

Why pid 1: the kernel ignores signals that other processes of the namespace send to
init unless it installed a handler, so the agent cannot kill its own supervisor; the
process also makes itself non-dumpable so the agent (same uid) cannot ptrace it or open
its /proc files. When it dies the kernel kills everything else in the pid namespace.

Frame: 4-byte big-endian count, then that many fields, each a 4-byte length + bytes.
Requests:  exec CMD TIMEOUT_MS CWD ENV MODE MAX_OUT | write PATH MODE DATA | read PATH
           | untar DEST TAR | tar SRC | killall | ping
Responses: ok FIELDS... | err ERRNO MESSAGE
This file must stay runnable by a bare python3 (stdlib only, no tinkrl imports).
"""

import os
import select
import signal
import stat
import sys
import time

STATE_FILE = "/run/tinkrl/shell-state"
NAMES_FILE = "/run/tinkrl/shell-names"  # compgen -e into a file: no $(...) subshell fork
SHELL = "/bin/bash"
# Run in the command's shell: save cwd and exported env on exit so the next command starts
# where this one left off (like a terminal), unless the caller asked for a fresh shell.
SAVE_STATE = (
    "__tinkrl_save() { { printf '%s\\0' \"$PWD\"; compgen -e > " + NAMES_FILE + "; while read -r __v; do "
    'printf \'%s=%s\\0\' "$__v" "${!__v}"; done < ' + NAMES_FILE + "; } > " + STATE_FILE + " 2>/dev/null; }\n"
    "trap __tinkrl_save EXIT\n"
)
DRAIN_AFTER_EXIT_S = 0.05  # output still arriving from background children after the command exits


def _read_exact(fd, n):
    chunks = []
    while n:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            raise EOFError
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def recv(fd=0):
    """One request frame from `fd`, as a list of bytes fields (EOFError when the host is gone)."""
    count = int.from_bytes(_read_exact(fd, 4), "big")
    fields = []
    for _ in range(count):
        n = int.from_bytes(_read_exact(fd, 4), "big")
        fields.append(_read_exact(fd, n) if n else b"")
    return fields


def encode_frame(fields):
    """One frame: str fields as UTF-8 (surrogates kept), ints as their decimal text (the host's
    requests and this server's replies alike)."""
    parts = [len(fields).to_bytes(4, "big")]
    for f in fields:
        if isinstance(f, str):
            f = f.encode("utf-8", "surrogateescape")
        elif isinstance(f, int):
            f = str(f).encode()
        parts.append(len(f).to_bytes(4, "big"))
        parts.append(f)
    return b"".join(parts)


def send(fields, fd=1):
    """One reply frame to `fd`."""
    view = memoryview(encode_frame(fields))
    while view:
        view = view[os.write(fd, view) :]


class Capture:
    """Keeps the first and last `limit/2` bytes of a stream and counts the rest."""

    def __init__(self, limit):
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, b):
        """Take the next chunk of the stream."""
        self.total += len(b)
        room = self.half - len(self.head)
        if room > 0:
            self.head += b[:room]
            b = b[room:]
        if b:
            self.tail += b
            if len(self.tail) > 2 * self.half:
                del self.tail[: len(self.tail) - self.half]

    def result(self):
        """(bytes kept, with a marker where the middle was cut; whether anything was cut)."""
        if len(self.tail) > self.half:
            del self.tail[: len(self.tail) - self.half]
        omitted = self.total - len(self.head) - len(self.tail)
        if omitted <= 0:
            return bytes(self.head + self.tail), False
        mark = b"\n[... %d bytes of output omitted ...]\n" % omitted
        return bytes(self.head) + mark + bytes(self.tail), True


class Server:
    """The sandbox's state between requests (the shell's cwd and environment) and the request handlers."""

    def __init__(self, workdir, env):
        self.cwd = workdir
        self.env = env
        self.statuses = {}  # pid -> wait status for children reaped while reaping orphans

    # -- process bookkeeping -------------------------------------------------------------
    def reap(self):
        """Reap every exited child (pid 1 adopts orphans), keeping statuses for wait_child."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.statuses[pid] = status

    def wait_child(self, pid):
        """`pid`'s wait status, whether `reap` already collected it or not."""
        if pid in self.statuses:
            return self.statuses.pop(pid)
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return self.statuses.pop(pid, 0)

    def others_alive(self):
        """The pids in the sandbox other than this one."""
        me = str(os.getpid())
        return [p for p in os.listdir("/proc") if p.isdigit() and p != me]

    def killall(self):
        """SIGKILL every other process of the sandbox and wait until they are gone."""
        for _ in range(200):
            try:
                os.kill(-1, signal.SIGKILL)  # pid 1 is exempt: everything but us
            except ProcessLookupError:
                pass
            self.reap()
            if not self.others_alive():
                self.statuses.clear()
                return ["ok"]
            time.sleep(0.005)
        return ["err", "16", "processes survived kill"]  # EBUSY

    # -- commands ------------------------------------------------------------------------
    def exec(self, cmd, timeout_ms, cwd, env_blob, mode, max_out):
        """Run `cmd` with bash in its own session under a deadline; the reply carries exit code and capped output."""
        self.reap()
        persist = mode == b"persist"
        env = dict(self.env) if mode != b"fresh" else {}
        for item in env_blob.split(b"\0"):
            if b"=" in item:
                k, v = item.split(b"=", 1)
                env[k] = v
        workdir = cwd or self.cwd
        script = (SAVE_STATE.encode() if persist else b"") + cmd
        if persist:
            try:
                os.unlink(STATE_FILE)
            except OSError:
                pass
        outr, outw = os.pipe()
        errr, errw = os.pipe()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:  # child: new session so a timeout can kill the whole group
            try:
                os.setsid()
                for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGCHLD):
                    signal.signal(sig, signal.SIG_DFL)
                null = os.open("/dev/null", os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(outw, 1)
                os.dup2(errw, 2)
                try:
                    os.chdir(workdir)
                except OSError as e:
                    os.write(2, b"cannot cd to %s: %s\n" % (workdir, e.strerror.encode()))
                    os._exit(1)
                os.execve(SHELL, [b"bash", b"--noprofile", b"--norc", b"-c", script], env)
            finally:
                os._exit(127)
        os.close(outw)
        os.close(errw)
        out, err = Capture(max_out), Capture(max_out)
        streams = {outr: out, errr: err}
        pidfd = os.pidfd_open(pid)
        deadline = start + timeout_ms / 1000.0
        status = None
        timed_out = False
        drain_until = None
        while streams:
            now = time.monotonic()
            if status is None:
                wait = deadline - now
                if wait <= 0:
                    timed_out = True
                    for kill, target in ((os.killpg, pid), (os.kill, pid)):  # os.kill: before its setsid()
                        try:
                            kill(target, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    status = self.wait_child(pid)
                    for _ in range(2000):  # the group's orphans are ours to reap: gone before we answer
                        self.reap()
                        try:
                            os.killpg(pid, 0)
                        except ProcessLookupError:
                            break
                        time.sleep(0.001)
                    break
            else:
                if drain_until is None:
                    drain_until = now + DRAIN_AFTER_EXIT_S
                wait = drain_until - now
                if wait <= 0:
                    break
            fds = list(streams) + ([pidfd] if status is None else [])
            ready, _, _ = select.select(fds, [], [], wait)
            for fd in ready:
                if fd == pidfd:
                    status = self.wait_child(pid)
                    continue
                chunk = os.read(fd, 65536)
                if chunk:
                    streams[fd].add(chunk)
                else:
                    del streams[fd]
                    os.close(fd)
        if status is None:
            status = self.wait_child(pid)
        for fd in list(streams):
            os.close(fd)
        os.close(pidfd)
        duration = time.monotonic() - start
        code = -1 if timed_out else os.waitstatus_to_exitcode(status)
        if code < 0 and not timed_out:
            code = 128 - code  # killed by a signal: report it as a shell would
        if persist and not timed_out and not cwd:
            self.load_state()
        out_b, out_cut = out.result()
        err_b, err_cut = err.result()
        return ["ok", code, int(timed_out), int(out_cut or err_cut), out_b, err_b, f"{duration:.6f}"]

    def load_state(self):
        """Take the cwd and exported env the last persistent command saved, if it saved a sane file."""
        try:  # the agent may have swapped the file for a fifo or a link: never block or follow
            fd = os.open(STATE_FILE, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            with open(fd, "rb") as f:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_size > 16 << 20:
                    return
                parts = f.read().split(b"\0")
        except OSError:
            return
        if len(parts) < 2:
            return
        env = {}
        for item in parts[1:]:
            if b"=" in item:
                k, v = item.split(b"=", 1)
                if k not in (b"_", b"SHLVL", b"OLDPWD"):
                    env[k] = v
        if parts[0].startswith(b"/"):
            self.cwd = parts[0]
        self.env = env

    # -- files ---------------------------------------------------------------------------
    def write(self, path, mode, data):
        """Write a regular file (never through a planted fifo or device), creating its parent."""
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        # only regular files: a planted link to /proc/1/fd/1 must not reach the host's pipe
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_NOCTTY, int(mode))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(22, "not a regular file", os.fsdecode(path))
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, int(mode))
        finally:
            os.close(fd)
        return ["ok"]

    def read(self, path):
        """A regular file's bytes (IsADirectoryError for a directory, EINVAL for anything else)."""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(21, "Is a directory", os.fsdecode(path))
            if not stat.S_ISREG(mode):  # never our own pipes, fifos or devices
                raise OSError(22, "not a regular file", os.fsdecode(path))
        except BaseException:
            os.close(fd)
            raise
        with open(fd, "rb") as f:
            return ["ok", f.read()]

    def untar(self, dest, data):
        """Unpack a tar stream from the host into `dest`, owned by root inside."""
        import io
        import tarfile

        os.makedirs(dest, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            for member in tf.getmembers():
                member.uid = member.gid = 0
                member.uname = member.gname = "root"
            tf.extractall(os.fsdecode(dest), numeric_owner=True)
        return ["ok"]

    def tar(self, src):
        """A tar stream of `src` (a directory as ".", a file under its own name) for the host."""
        import io
        import tarfile

        if not os.path.lexists(src):
            raise FileNotFoundError(2, "No such file or directory", os.fsdecode(src))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            name = os.fsdecode(src)
            tf.add(name, arcname="." if os.path.isdir(name) else os.path.basename(name))
        return ["ok", buf.getvalue()]

    def handle(self, req):
        """Dispatch one request to its handler; the reply is a list of fields."""
        op = req[0]
        if op == b"exec":
            return self.exec(req[1], int(req[2]), req[3], req[4], req[5], int(req[6]))
        if op == b"write":
            return self.write(req[1], req[2], req[3])
        if op == b"read":
            return self.read(req[1])
        if op == b"untar":
            return self.untar(req[1], req[2])
        if op == b"tar":
            return self.tar(req[1])
        if op == b"killall":
            return self.killall()
        if op == b"ping":
            return ["ok"]
        return ["err", "22", f"unknown op {op!r}"]  # EINVAL


def oserror_reply(e):
    """An `err ERRNO MESSAGE` reply for an OSError, naming the file when there is one."""
    name = e.filename
    where = ": %s" % (os.fsdecode(name) if isinstance(name, (str, bytes)) else name) if name is not None else ""
    return ["err", str(e.errno or 0), f"{e.strerror or e}{where}"]


def serve_one():
    """`--one`: answer the single request on stdin (tar/untar handed over by the native pid 1)."""
    try:
        req = recv()
        resp = Server(b"/", {}).handle(req)
    except OSError as e:
        resp = oserror_reply(e)
    except Exception as e:
        resp = ["err", "0", f"{type(e).__name__}: {e}"]
    send(resp)


def main():
    """As pid 1: harden this process, set the rlimits, say ready, answer requests until EOF (`--one`: one request)."""
    if sys.argv[1:] == ["--one"]:
        return serve_one()
    # pid 1 only receives signals it has handlers for: drop Python's SIGINT handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:  # non-dumpable: the agent (same uid) cannot ptrace us or read /proc/1/{mem,fd}
        import _ctypes

        _ctypes.call_function(_ctypes.dlsym(_ctypes.dlopen(None, 0), "prctl"), (4, 0, 0, 0, 0))
    except Exception:
        pass
    workdir, nproc = sys.argv[1].encode(), int(sys.argv[2])
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if nproc > 0:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        mem = int(sys.argv[3])
        if mem > 0:
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    except (ImportError, ValueError, OSError):
        pass
    env = {}
    for item in sys.argv[4:]:
        k, _, v = item.partition("=")
        env[k.encode()] = v.encode()
    os.makedirs("/run/tinkrl", exist_ok=True)
    os.makedirs("/logs/verifier", exist_ok=True)
    server = Server(workdir, env)
    send(["ready"])
    while True:
        try:
            req = recv()
        except EOFError:
            return
        try:
            resp = server.handle(req)
        except OSError as e:
            resp = oserror_reply(e)
        except Exception as e:  # a bad request must not kill the sandbox
            resp = ["err", "0", f"{type(e).__name__}: {e}"]
        send(resp)


if __name__ == "__main__":
    main()
