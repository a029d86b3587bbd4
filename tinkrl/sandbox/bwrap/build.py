"""What every bwrap sandbox mounts, built once per machine into the provider's state directory.

- the sandbox's pid 1: `bwrap_init.c` compiled with the host's C compiler (static when libc.a
  is there), or, without one, `bwrap_server.py` compiled to a .pyc by Debian's
  /usr/bin/python3 (the sandbox's own python, never the project venv);
- a minimal generated /etc (never the host's passwd/shadow), with mount points for the few
  host entries that are bound read-only on top.

Each artefact is named by a hash of its inputs and written under a temporary name then
renamed, so concurrent processes and upgrades never see a half-written or stale file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

SERVER_SOURCE = Path(__file__).with_name("bwrap_server.py")
INIT_SOURCE = Path(__file__).with_name("bwrap_init.c")
SANDBOX_PYTHON = "/usr/bin/python3"
HOST_ETC_PASSTHROUGH = ("alternatives", "ld.so.cache", "ssl", "localtime", "gitconfig", "mime.types")


def default_state_dir() -> Path:
    """Where uid locks and built files live: /run as root, else the user's runtime dir (or /tmp)."""
    if os.geteuid() == 0:
        return Path("/run/tinkrl-sandbox")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "tinkrl-sandbox" if runtime else Path(f"/tmp/tinkrl-sandbox-{os.getuid()}")


def generated_etc(state_dir: Path) -> Path:
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


def compiled_server(state_dir: Path) -> Path:
    """bwrap_server.py compiled once by the sandbox's own python, so starting a sandbox never compiles it."""
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


def compiled_init(state_dir: Path) -> tuple[Path | None, str]:
    """bwrap_init.c built once (static if libc.a is there); (None, why) without a C compiler."""
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
