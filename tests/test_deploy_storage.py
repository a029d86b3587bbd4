"""Run-dir sync to S3 (tinkrl.storage) against moto's S3-compatible server on loopback, and
`make -C deploy results` fetching a run back through it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server", reason="moto[server] not installed (pip install -e '.[dev]')")

from tinkrl import storage  # noqa: E402

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    client = storage.s3_client(url)
    client.create_bucket(Bucket="runs-bucket")
    yield url, client
    server.stop()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _run_dir(root: Path) -> Path:
    run = root / "myrun"
    (run / "checkpoints" / "000010").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "config.yaml").write_text("batch_size: 8\n")
    (run / "checkpoints" / "000010" / "adapter.safetensors").write_bytes(os.urandom(200_000))
    return run


def test_push_uploads_changes_only_and_pull_restores(s3, tmp_path):
    url, client = s3
    run = _run_dir(tmp_path)
    pusher = storage.Pusher(run, "s3://runs-bucket/runs/myrun", url)
    first = pusher.push_once()
    assert sorted(first) == [
        "runs/myrun/checkpoints/000010/adapter.safetensors",
        "runs/myrun/config.yaml",
        "runs/myrun/metrics.jsonl",
    ]
    assert pusher.push_once() == []  # nothing changed
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 2}\n')
    assert pusher.push_once() == ["runs/myrun/metrics.jsonl"]
    # a fresh pusher (a restarted sidecar) matches by content and sends nothing
    assert storage.push(run, "s3://runs-bucket/runs/myrun", url) == []

    dest = tmp_path / "restored"
    got = storage.pull("s3://runs-bucket/runs/myrun", dest, url)
    assert len(got) == 3
    for p in run.rglob("*"):
        if p.is_file():
            assert (dest / p.relative_to(run)).read_bytes() == p.read_bytes()
    assert storage.pull("s3://runs-bucket/runs/myrun", dest, url) == []  # already identical


def test_bad_uri_is_one_line_exit_2(capsys):
    assert storage.cli_main(["pull", "http://nope", "x"]) == 2
    assert "not an s3:// URI" in capsys.readouterr().err


def test_make_results_fetches_a_run(s3, tmp_path):
    url, client = s3
    run = _run_dir(tmp_path / "src")
    assert storage.cli_main(["push", str(run), "s3://runs-bucket/runs/myrun", "--endpoint-url", url]) == 0
    results = tmp_path / "results"
    env = {**os.environ, "TINKRL_S3_ENDPOINT_URL": url, "PY": sys.executable}
    out = subprocess.run(
        [
            "make",
            "-s",
            "-C",
            "deploy",
            "results",
            "BUCKET=runs-bucket",
            "ACCOUNT=000000000000",
            "RUN=myrun",
            f"RESULTS={results}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (results / "myrun" / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert (results / "myrun" / "checkpoints" / "000010" / "adapter.safetensors").stat().st_size == 200_000


def test_a_repeating_push_makes_a_last_pass_on_sigterm(s3, tmp_path):
    """The sidecar is stopped with SIGTERM when its pod ends (a launched Job's command exited): what the
    run wrote since the last pass is still sent, and the sidecar exits 0."""
    url, client = s3
    run = _run_dir(tmp_path / "src")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tinkrl.storage", "push", str(run), "s3://runs-bucket/runs/last", "--every", "3600"],
        env={**os.environ, "TINKRL_S3_ENDPOINT_URL": url, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().startswith("pushed 3 file(s)")  # the first pass
    (run / "final.json").write_text('{"done": true}\n')  # written after it, before the pod ends
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    body = client.get_object(Bucket="runs-bucket", Key="runs/last/final.json")["Body"].read()
    assert body == b'{"done": true}\n'
