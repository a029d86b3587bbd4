"""Who gets into tinkrl's servers: each refuses to listen beyond loopback without a key, and a keyed one
refuses every request without it, on every route (`serve openai`'s admin routes wanting their own key
where one is set); the viewer serves only the run files it was given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tinkrl.access import exposure_problem, exposure_warning, is_loopback, key_matches, request_key
from tinkrl.aio_thread import serve_app_in_thread

ROOT = Path(__file__).parents[1]
SERVERS = [
    ["serve", "openai"],
    ["serve", "tinker"],
    ["serve", "env", "arithmetic"],
    ["view", str(ROOT / "tests")],
]


def call(url: str, method: str = "GET", headers: dict | None = None, body: bytes | None = None) -> int:
    """The HTTP status `method url` gets."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_loopback_keys_and_the_binding_rule():
    assert is_loopback("127.0.0.1") and is_loopback("127.9.9.9") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.1.2.3")
    assert not is_loopback("no-such-host.invalid")  # what cannot be resolved is not known to be local
    assert key_matches("tml-a", "tml-a") and not key_matches("tml-b", "tml-a") and not key_matches(None, "tml-a")
    assert not key_matches("tml-a\u00e9", "tml-a")  # non-ASCII compared as bytes, not a crash
    assert request_key({"authorization": "Bearer  k1 "}) == "k1" and request_key({"x-api-key": "k2"}) == "k2"
    assert request_key({"authorization": "Basic xyz"}) is None and request_key({}) is None
    assert (
        exposure_problem("s", "127.0.0.1", None, False) is None and exposure_problem("s", "0.0.0.0", "k", False) is None
    )
    assert "refusing to listen on 0.0.0.0 without a key" in exposure_problem("s", "0.0.0.0", None, False)
    assert exposure_problem("s", "0.0.0.0", None, True) is None
    assert "warning" in exposure_warning("s", "0.0.0.0", None) and exposure_warning("s", "127.0.0.1", None) is None


@pytest.mark.parametrize("command", SERVERS, ids=lambda c: " ".join(c[:2]))
def test_every_server_refuses_an_open_non_loopback_address(command):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINKRL_API_KEY")}
    done = subprocess.run(
        [sys.executable, "-m", "tinkrl.cli", *command, "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert "refusing to listen on 0.0.0.0 without a key" in done.stderr and "--no-api-key" in done.stderr


def test_serve_tinker_keyed_refuses_every_route_without_the_key():
    from tinkrl.local import ServiceClient
    from tinkrl.tinker_server.app import TinkerServer

    server = TinkerServer(ServiceClient(), api_key="tml-the-key")
    routes = sorted({(r.method, r.resource.canonical) for r in server.app.router.routes() if r.method != "HEAD"})
    assert len(routes) >= 20
    with serve_app_in_thread(server.app, "127.0.0.1", 0) as url:
        for method, path in routes:
            path = path.replace("{session_id}", "s").replace("{sampler_id}", "x").replace("{training_run_id}", "r")
            body = b"{}" if method == "POST" else None
            for headers in ({}, {"X-API-Key": "tml-other"}, {"Authorization": "Bearer tml-other"}):
                expected = 200 if path == "/api/v1/healthz" else 401
                assert call(url + path, method, headers, body) == expected, (method, path, headers)
        assert call(url + "/api/v1/get_server_capabilities", headers={"X-API-Key": "tml-the-key"}) == 200


def test_serve_openai_keys_and_its_admin_key(tmp_path):
    from tinkrl.local import ServiceClient
    from tinkrl.local.models import TINY_MODEL
    from tinkrl.proxy.server import ProxyServer, serve_in_thread

    service = ServiceClient()
    server = ProxyServer(
        service.create_sampling_client(base_model=TINY_MODEL),
        model_name=TINY_MODEL,
        api_key="sk-agents",
        admin_key="sk-admin",
        service_client=service,
    )
    routes = sorted({(r.method, r.resource.canonical) for r in server.app.router.routes() if r.method != "HEAD"})
    agent, admin = {"Authorization": "Bearer sk-agents"}, {"Authorization": "Bearer sk-admin"}
    with serve_in_thread(server) as url:
        for method, path in routes:
            path = path.replace("{rollout_id}", "r1").replace("{model:.+}", "m")
            body = b"{}" if method == "POST" else None
            if path == "/health":
                assert call(url + path) == 200
                continue
            assert call(url + path, method, {}, body) == 401, (method, path)
            assert call(url + path, method, {"Authorization": "Bearer sk-wrong"}, body) == 401, (method, path)
            is_admin = path.startswith(("/v1/admin/", "/v1/rollouts/"))
            # the agents' key gets past the key check (then the route answers for itself), but not on admin routes
            assert (call(url + path, method, agent, body) == 401) == is_admin, (method, path)
            assert (call(url + path, method, admin, body) == 401) == (not is_admin), (method, path)
        assert call(url + "/v1/admin/weights", headers=admin) == 200
        assert call(url + "/v1/models", headers={"api-key": "sk-agents"}) == 200


def test_serve_env_keyed_refuses_requests_without_the_key():
    from starlette.testclient import TestClient

    from tinkrl.commands.serve_env import parse_env_args
    from tinkrl.env_server.app import environment_classes, make_app

    app = make_app(environment_classes(parse_env_args(["arithmetic"]), 10, 5, 0), api_key="or-key")
    with TestClient(app) as client:
        for path in ("/list_environments", "/docs", "/openapi.json", "/arithmetic/tasks"):
            assert client.get(path).status_code == 401, path
            assert client.get(path, headers={"X-API-Key": "or-other"}).status_code == 401, path
        assert client.get("/list_environments", headers={"X-API-Key": "or-key"}).json() == ["arithmetic"]
        assert client.get("/list_environments", headers={"Authorization": "Bearer or-key"}).status_code == 200


def test_viewer_key_cookie_and_only_the_runs_own_files(tmp_path):
    from tinkrl.viewer.server import escapes, make_app

    runs = tmp_path / "runs"
    (runs / "good").mkdir(parents=True)
    (runs / "good" / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward": 1.0}) + "\n")
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"step": 0, "password": "hunter2"}) + "\n")
    (runs / "leaky").mkdir()
    (runs / "leaky" / "metrics.jsonl").symlink_to(secret)  # a run file that leads out of its run
    (tmp_path / "linked").symlink_to(runs / "good")  # a run dir that is itself a link: the user's own choice
    assert not escapes(tmp_path / "linked", "metrics.jsonl") and escapes(runs / "leaky", "metrics.jsonl")
    with serve_app_in_thread(make_app([runs], api_key="view-key"), "127.0.0.1", 0) as url:
        for path in ("/", "/api/sources", "/api/metrics?source=0", "/static/app.js"):
            assert call(url + path) == 401, path
            assert call(url + path, headers={"Authorization": "Bearer nope"}) == 401, path
        bearer = {"Authorization": "Bearer view-key"}
        sources = json.loads(
            urllib.request.urlopen(urllib.request.Request(url + "/api/sources", headers=bearer)).read()
        )
        assert [Path(s["path"]).name for s in sources] == ["good"]
        for i in range(len(sources)):
            request = urllib.request.Request(f"{url}/api/metrics?source={i}", headers=bearer)
            assert b"hunter2" not in urllib.request.urlopen(request).read()
        for path in ("/static/../server.py", "/static/%2e%2e/server.py", "/static/..%2fserver.py", "/../secret.jsonl"):
            assert call(url + path, headers=bearer) in (403, 404), path
        # the browser's way in: /?key=KEY once sets a cookie, then the page and its API answer
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        assert opener.open(f"{url}/?key=view-key", timeout=30).status == 200
        assert json.loads(opener.open(f"{url}/api/sources", timeout=30).read())
        assert call(f"{url}/?key=wrong") == 401
