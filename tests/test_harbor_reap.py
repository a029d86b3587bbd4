"""What ends the harbor provider's sandboxes when their bridge cannot: its ledger and the reaper.

Without the harness these check which ledger entries a reap takes (a gone bridge's, a run's, never
a live bridge's). With it (marked `harness`): a bridge killed with SIGKILL while Harbor's podman
environment holds real containers (Debian's podman, podman-compose from the harness virtualenv),
stopped by `tinkrl sandbox reap --provider harbor`; and the remote services' own SDKs pointed at a
server on 127.0.0.1: an outage retried and recorded as an infrastructure failure (E2B, Daytona),
and sandboxes stopped by their recorded ids (E2B, Runloop). The live services are not reached.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import podman_helper

from tinkrl.config import HarborSandboxConfig
from tinkrl.sandbox import harbor as harbor_mod
from tinkrl.sandbox.base import SandboxError, SandboxSpec
from tinkrl.sandbox.container import Owner

ROOT = Path(__file__).resolve().parents[1]
HARNESS_PYTHON = ROOT / ".venv-harness" / "bin" / "python"
needs_harness = pytest.mark.skipif(
    not (ROOT / ".venv-harness" / "bin" / "harbor").exists(),
    reason="the harness virtualenv is not built (.venv-harness has no harbor): run `make harness`",
)


def dead_owner() -> dict[str, str]:
    """The owner keys of a process that has exited."""
    p = subprocess.Popen(["true"])
    owner = Owner.current()
    p.wait()
    return {"owner-host": owner.host, "owner-pid": str(p.pid), "owner-start": "1"}


def live_owner() -> dict[str, str]:
    me = Owner.current()
    return {"owner-host": me.host, "owner-pid": str(me.pid), "owner-start": me.start}


def write_entry(ledger: Path, sid: str, owner: dict[str, str], **fields) -> Path:
    ledger.mkdir(parents=True, exist_ok=True)
    path = ledger / f"{sid}.json"
    path.write_text(json.dumps({"sid": sid, "run_id": "r1", "environment": "e2b", "type": "e2b", **owner, **fields}))
    return path


def test_a_reap_takes_gone_bridges_and_named_runs_never_a_live_bridge(tmp_path):
    ledger = tmp_path / "ledger"
    write_entry(ledger, "gone-1", dead_owner(), service_id="a")
    write_entry(ledger, "live-1", live_owner(), service_id="b")
    write_entry(ledger, "live-2", live_owner(), run_id="r2", service_id="c")
    (ledger / "half.json").write_text("{")  # a file being written: left for a later reap
    config = HarborSandboxConfig(ledger=str(ledger), python=sys.executable)
    assert harbor_mod.reap_sandboxes(config, dry_run=True) == [("gone-1", "bridge gone")]
    assert harbor_mod.reap_sandboxes(config, run_id="r2", dry_run=True) == [("live-2", "run r2")]
    assert len(list(ledger.glob("*.json"))) == 4  # a dry run deletes nothing


def test_a_reap_that_dies_before_answering_keeps_the_files_and_says_so(tmp_path):
    ledger = tmp_path / "ledger"
    write_entry(ledger, "gone-1", dead_owner(), service_id="a")
    config = HarborSandboxConfig(ledger=str(ledger), python="/bin/false")  # exits 1 at once, answers nothing
    with pytest.raises(SandboxError, match="gone-1: no answer from the reap"):
        harbor_mod.reap_sandboxes(config)
    assert [f.stem for f in ledger.glob("*.json")] == ["gone-1"]


def test_the_ledger_defaults_under_tinkrl_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TINKRL_HOME", str(tmp_path))
    assert harbor_mod.ledger_dir(HarborSandboxConfig()) == tmp_path / "sandboxes" / "harbor"
    assert harbor_mod.ledger_dir(HarborSandboxConfig(ledger=str(tmp_path / "x"))) == tmp_path / "x"


# -- a local stand-in for a service's API: what the real SDKs send -----------------------------
class Service:
    """A server on 127.0.0.1 that records each request and answers with `answer(method, path)`."""

    def __init__(self, answer):
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        service = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                service.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                status, body = answer(self.command, self.path)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _any

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self):
        self.server.shutdown()


E2B_KEY = "e2b_" + "0" * 40


OUTAGES = {  # environment: (its SDK's settings for a local endpoint, the request each start sends, its credential)
    "e2b": ({"E2B_API_KEY": E2B_KEY, "E2B_API_URL": "{url}"}, ("GET", "/templates/harbor-"), ("x-api-key", E2B_KEY)),
    "daytona": (
        {"DAYTONA_API_KEY": "dtn-key", "DAYTONA_API_URL": "{url}"},
        ("POST", "/sandbox"),
        ("authorization", "Bearer dtn-key"),
    ),
}


@pytest.mark.harness
@needs_harness
@pytest.mark.parametrize("environment", sorted(OUTAGES))
def test_a_service_outage_is_retried_then_an_infrastructure_failure(environment, tmp_path, monkeypatch):
    """Harbor's E2B or Daytona environment with the service's SDK against a local server that answers 503: the
    provider retries the start, then raises an infrastructure failure (never a reward); every try reached the
    service with the credential (E2B: the template lookup, Harbor's build cache by the definition's hash;
    Daytona: the sandbox create), and the ledger is empty after."""
    settings, (method, path), (header, credential) = OUTAGES[environment]
    service = Service(lambda method, path: (503, b'{"code": 503, "message": "service unavailable"}'))
    for key, value in settings.items():
        monkeypatch.setenv(key, value.format(url=service.url))
    ledger = tmp_path / "ledger"
    p = harbor_mod.HarborProvider(
        python=str(HARNESS_PYTHON), environment=environment, start_retries=1, retry_backoff_s=0.1, ledger=str(ledger)
    )
    try:
        with pytest.raises(SandboxError) as e:
            p.create(SandboxSpec(workdir="/app", image="ubuntu:24.04"))
        assert e.value.failure_mode == "sandbox_error" and "unavailable" in str(e.value).lower()
        assert p.summary() == {"started": 0, "failed": 1, "retried": 1}
    finally:
        p.close()
        service.close()
    starts = [h for m, at, h in service.requests if m == method and at.startswith(path)]
    assert len(starts) >= 2 and all(h.get(header) == credential for h in starts)
    assert not list(ledger.glob("*.json"))


@pytest.mark.harness
@needs_harness
def test_leaked_remote_sandboxes_are_stopped_by_id_with_the_services_sdks(tmp_path, monkeypatch):
    """Ledger entries of a gone bridge on E2B and Runloop: the reaper stops each through its SDK by the recorded
    id (E2B: DELETE /sandboxes/ID with the key; Runloop: POST /v1/devboxes/ID/shutdown with the bearer token);
    one the service refuses stays in the ledger and is named in the error."""

    def answer(method: str, path: str) -> tuple[int, bytes]:
        if "refused" in path:
            return 500, b'{"message": "internal error"}'
        if method == "DELETE" and path.startswith("/sandboxes/"):
            return 204, b""
        if method == "POST" and path.startswith("/v1/devboxes/") and path.endswith("/shutdown"):
            devbox = path.split("/")[3]
            return 200, json.dumps({"id": devbox, "status": "shutdown"}).encode()
        return 404, b'{"message": "not found"}'

    service = Service(answer)
    monkeypatch.setenv("E2B_API_KEY", E2B_KEY)
    monkeypatch.setenv("E2B_API_URL", service.url)
    monkeypatch.setenv("RUNLOOP_API_KEY", "rl-test-key")
    monkeypatch.setenv("RUNLOOP_BASE_URL", service.url)
    ledger = tmp_path / "ledger"
    gone = dead_owner()
    write_entry(ledger, "s-e2b", gone, service_id="ie2bsandbox1")
    write_entry(ledger, "s-runloop", gone, environment="runloop", type="runloop", service_id="dbx_42")
    write_entry(ledger, "s-refused", gone, service_id="refused-7")
    write_entry(ledger, "s-live", live_owner(), service_id="kept-9")
    config = HarborSandboxConfig(ledger=str(ledger), python=str(HARNESS_PYTHON))
    try:
        with pytest.raises(SandboxError) as e:
            harbor_mod.reap_sandboxes(config)
    finally:
        service.close()
    assert "s-refused" in str(e.value) and "2 stopped" in str(e.value)
    calls = [(m, path, h) for m, path, h in service.requests]
    assert ("DELETE", "/sandboxes/ie2bsandbox1") in [(m, p) for m, p, _ in calls]
    assert ("POST", "/v1/devboxes/dbx_42/shutdown") in [(m, p) for m, p, _ in calls]
    assert all(h.get("x-api-key") == E2B_KEY for _, p, h in calls if p.startswith("/sandboxes/"))
    assert all(h.get("authorization") == "Bearer rl-test-key" for _, p, h in calls if p.startswith("/v1/"))
    assert not any("kept-9" in p for _, p, _ in calls)
    assert sorted(f.stem for f in ledger.glob("*.json")) == ["s-live", "s-refused"]


@pytest.mark.harness
@needs_harness
def test_the_service_handles_are_where_harbor_keeps_them():
    """The attributes the bridge reads a started sandbox's id from are the ones Harbor's classes set, and the
    SDK objects have that id attribute (a Harbor upgrade that moves them fails here, not in a user's reap)."""
    script = """
import inspect, json
from harbor.environments.factory import EnvironmentFactory
from harbor.models.environment_type import EnvironmentType
from tinkrl.sandbox.harbor_bridge import SERVICE_HANDLES
from e2b import AsyncSandbox as E2B
from daytona import AsyncSandbox as Daytona
from modal import Sandbox as Modal
from runloop_api_client.types import DevboxView
sdk = {"e2b": E2B, "daytona": Daytona, "modal": Modal, "runloop": DevboxView}
out = {}
for name, (handle, key) in SERVICE_HANDLES.items():
    source = inspect.getsource(inspect.getmodule(EnvironmentFactory.get_environment_class(EnvironmentType(name))))
    cls = sdk[name]
    fields = getattr(cls, "model_fields", {})
    out[name] = [f"{handle} = " in source or f"{handle}: " in source, hasattr(cls, key) or key in fields]
print(json.dumps(out))
"""
    r = subprocess.run([str(HARNESS_PYTHON), "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    found = json.loads(r.stdout.strip().splitlines()[-1])
    assert found == {name: [True, True] for name in ("e2b", "daytona", "modal", "runloop")}


# -- Harbor's podman environment: real containers that outlive a killed bridge -----------------
needs_podman = pytest.mark.skipif(
    podman_helper.unavailable_reason() is not None, reason=str(podman_helper.unavailable_reason())
)


@pytest.fixture
def podman_env(tmp_path, monkeypatch):
    pm = podman_helper.start(tmp_path / "podman", with_service=False, with_bash=True)
    for key in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "TMPDIR"):
        monkeypatch.setenv(key, pm.env[key])
    yield pm
    pm.stop()


def running(pm) -> list[str]:
    return pm.run("ps", "-q").stdout.decode().split()


@pytest.mark.harness
@needs_harness
@needs_podman
def test_a_bridge_killed_with_sigkill_leaves_podman_containers_that_reap_stops(podman_env, tmp_path):
    """Two sandboxes of Harbor's podman environment (commands and files through the bridge); the bridge killed
    with SIGKILL leaves both containers running; `tinkrl sandbox reap --provider harbor` stops them by making
    the environments again from the ledger, and the ledger is empty after."""
    ledger = tmp_path / "ledger"
    image = podman_helper.BASH_IMAGE
    p = harbor_mod.HarborProvider(
        python=str(HARNESS_PYTHON), environment="podman", image=image, start_retries=0, ledger=str(ledger)
    )
    try:
        sandboxes = [p.create(SandboxSpec(workdir="/app", image=image, network=True)) for _ in range(2)]
        r = sandboxes[0].exec("echo hi > note.txt; pwd", timeout=60)
        assert r.exit_code == 0 and r.stdout.strip() == "/app"
        assert sandboxes[0].read_file("/app/note.txt") == b"hi\n"
        sandboxes[1].write_file("/app/in.txt", "from the host\n")
        assert sandboxes[1].exec("cat in.txt", timeout=60).stdout.strip() == "from the host"
        assert len(list(ledger.glob("*.json"))) == 2 and len(running(podman_env)) == 2
        os.kill(p._bridge.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while p._bridge.alive and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        assert len(running(podman_env)) == 2, "the containers should outlive a bridge killed with SIGKILL"
        argv = [sys.executable, "-m", "tinkrl.cli", "sandbox", "reap", "--provider", "harbor"]
        argv += ["--ledger", str(ledger)]
        dry = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert dry.returncode == 0 and "would delete 2 sandbox(es)" in dry.stdout, dry.stdout + dry.stderr
        env = {**os.environ, "TINKRL_HARNESS_PYTHON": str(HARNESS_PYTHON)}
        reaped = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
        assert reaped.returncode == 0 and "deleted 2 sandbox(es)" in reaped.stdout, reaped.stdout + reaped.stderr
        assert "bridge gone: podman environment" in reaped.stdout
        assert running(podman_env) == [] and not list(ledger.glob("*.json"))
        assert podman_env.run("image", "exists", image, check=False).returncode == 0  # the next start needs it
    finally:
        p.close()
