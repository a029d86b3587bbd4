"""Test helpers: start ORS servers as subprocesses on 127.0.0.1 and wait until they answer."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now: for a server to bind, or for a refused connection."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, proc: subprocess.Popen, timeout: float = 120.0, health: str = "/health") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = Path(getattr(proc, "log_path", "/dev/null")).read_text()[-3000:]
            raise RuntimeError(f"server exited with {proc.returncode}; its log ends:\n{log}")
        try:
            with urllib.request.urlopen(url + health, timeout=2) as r:
                if json.loads(r.read()).get("status") == "ok":
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not come up in {timeout}s")


def start_server(argv: list[str], port: int, health: str = "/health") -> tuple[subprocess.Popen, str]:
    """Run `python argv...` (which must bind 127.0.0.1:port) and wait for `health` to say ok."""
    env = dict(os.environ, OPENREWARD_DISABLE_UPDATE_CHECK="1", PYTHONUNBUFFERED="1")
    # Logs go to a file: a pipe nobody reads would fill up and stall the server.
    log = tempfile.NamedTemporaryFile("w", prefix="ors-server-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    proc.log_path = log.name  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, proc, health=health)
    except Exception:
        proc.kill()
        raise
    return proc, url


def start_toy_server(port: int | None = None, die_at_session: int = 0) -> tuple[subprocess.Popen, str]:
    port = port or free_port()
    return start_server(
        [
            str(REPO / "tests" / "helpers" / "ors_toy_env.py"),
            "--port",
            str(port),
            "--die-at-session",
            str(die_at_session),
        ],
        port,
    )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
