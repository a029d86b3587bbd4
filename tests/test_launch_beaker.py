"""`tinkrl launch beaker` and `tinkrl launch image`.

Seed 001's Beaker launch commands run as written, with `python tinking/beaker/launch.py` replaced by
`tinkrl launch beaker` and `python tinking/trainer.py` by `tinkrl train`; with `--dry-run` the printed
spec is read back by beaker-py's own `BeakerExperimentSpec.from_json`. Submission and `follow=true`
run the real beaker-py client, in a `tinkrl launch` process, against tests/helpers/beaker_server.py:
beaker-py's generated gRPC service over TLS and its HTTP endpoints on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.git_repo import checkout, git
from test_seed_dialects import ERDOS_BEAKER, HELLO_BEAKER, PAPERGYM_BEAKER, POLARIS

from tinkrl.cli import main as tinkrl

beaker = pytest.importorskip("beaker", reason="beaker-py not installed (pip install -e '.[dev]')")
from helpers.beaker_server import BeakerStandIn, JobScript  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# seed 001, "rl on ttt-discovery" / "rl on beaker": the launcher's keys as written
LAUNCHER = "workspace=ai2/davidh budget=ai2/oe-base follow=true allow_dirty=true --"
SEED_LAUNCHES = {"erdos": ERDOS_BEAKER, "hello": HELLO_BEAKER, "polaris": POLARIS, "papergym": PAPERGYM_BEAKER}
SECRETS = {"TINKER_API_KEY": "tml-local-value", "WANDB_API_KEY": "wandb-local-value", "OPENREWARD_API_KEY": "or-value"}


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A checkout to launch from (the working directory), with an uncommitted change."""
    path = checkout(tmp_path / "repo", {"README.md": "a checkout\n"})
    (path / "notes.txt").write_text("not committed\n")
    monkeypatch.chdir(path)
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return path


def launch(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = tinkrl(["launch", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def kept(ours, theirs) -> bool:
    """Every key and value of `ours` is in `theirs` (which may add defaults)."""
    if isinstance(ours, dict):
        return isinstance(theirs, dict) and all(k in theirs and kept(v, theirs[k]) for k, v in ours.items())
    if isinstance(ours, list):
        return isinstance(theirs, list) and len(ours) == len(theirs) and all(map(kept, ours, theirs))
    return ours == theirs


@pytest.mark.parametrize("seed", list(SEED_LAUNCHES))
def test_seed_001_launch_commands_dry_run_to_a_spec_beaker_py_reads(repo, capsys, seed):
    from beaker import BeakerExperimentSpec

    trainer = shlex.split(SEED_LAUNCHES[seed])
    rc, out, err = launch(capsys, ["beaker", "--dry-run", *shlex.split(LAUNCHER), "tinkrl", "train", *trainer])
    assert rc == 0, err
    head = out.splitlines()[0]
    assert head.startswith("# beaker experiment: workspace ai2/davidh, name tinkrl-")  # workspace as given
    spec = yaml.safe_load(out)
    parsed = BeakerExperimentSpec.from_json(spec)
    assert kept(spec, parsed.to_json())  # beaker-py read every field we wrote, none dropped or changed
    assert parsed.budget == "ai2/oe-base"
    [task] = parsed.tasks
    assert task.command == ["tinkrl", "train", *trainer]  # the train command, word for word
    assert task.result.path == "/results"
    short = git(repo, "rev-parse", "--short", "HEAD")
    assert task.image.beaker == f"tinkrl-{short}"
    env = {e.name: e for e in task.env_vars}
    for name in SECRETS:
        assert env[name].secret == name and env[name].value is None  # by reference
    assert env["TINKRL_GIT_COMMIT"].value == git(repo, "rev-parse", "HEAD")
    assert not any(value in out for value in SECRETS.values())  # no key's value anywhere in the spec
    assert "(dirty)" in spec["description"]  # allow_dirty=true launched a changed checkout, and says so


def test_beaker_keys_map_onto_the_spec(repo, capsys):
    from beaker import BeakerExperimentSpec

    keys = "cluster=ai2/jupiter,ai2/saturn priority=high preemptible=true gpus=2 image=bob/tinkrl-x name=run-1"
    rc, out, _ = launch(capsys, ["beaker", *keys.split(), "allow_dirty=true", "--dry-run", "--", "echo", "hi there"])
    assert rc == 0
    spec = yaml.safe_load(out)
    task = BeakerExperimentSpec.from_json(spec).tasks[0]
    assert task.constraints.cluster == ["ai2/jupiter", "ai2/saturn"] and task.resources.gpu_count == 2
    assert task.context.priority.name == "high" and task.context.preemptible is True
    assert task.image.beaker == "bob/tinkrl-x" and task.command == ["echo", "hi there"]
    assert "name run-1" in out.splitlines()[0] and "budget" not in spec


@pytest.mark.parametrize(
    "argv, message",
    [
        (["workspace=ai2/davidh", "tinkrl", "train"], "missing `--` before the command"),
        (["workspace=ai2/davidh", "--"], "no command after `--`"),
        (["wrkspace=ai2/davidh", "--", "true"], "unknown key 'wrkspace'; keys: workspace, budget"),
        (["follow=maybe", "--", "true"], "follow=maybe: expected true or false"),
        (["priority=asap", "--", "true"], "priority=asap: one of low, normal, high, urgent, immediate"),
        (["gpus=two", "--", "true"], "gpus=two: expected a whole number"),
        (["--", "true"], "uncommitted changes in"),  # notes.txt, and no allow_dirty=true
    ],
)
def test_bad_input_is_one_line_and_exit_2(repo, capsys, argv, message):
    rc, out, err = launch(
        capsys, ["beaker", *argv, "--dry-run"] if "--" not in argv else ["beaker", "--dry-run", *argv]
    )
    assert rc == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1, err
    if message == "uncommitted changes in":
        assert "notes.txt" in err and "allow_dirty=true" in err


def test_outside_a_git_repository(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    rc, _, err = launch(capsys, ["beaker", "--dry-run", "--", "true"])
    assert rc == 2 and "is not in a git repository" in err and len(err.strip().splitlines()) == 1


def test_no_beaker_credentials(repo, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("BEAKER_CONFIG", str(tmp_path / "absent.yml"))
    monkeypatch.delenv("BEAKER_TOKEN", raising=False)
    rc, _, err = launch(capsys, ["beaker", "allow_dirty=true", "--", "true"])
    assert rc == 2 and "no Beaker credentials: set BEAKER_TOKEN" in err


# -- against the stand-in ---------------------------------------------------------------------


@pytest.fixture
def stand_in(tmp_path):
    server = BeakerStandIn(tmp_path).start()
    yield server
    server.stop()


def run_launch(repo: Path, server: BeakerStandIn, argv: list[str], **env: str) -> subprocess.CompletedProcess:
    """`tinkrl launch ...` as its own process (its gRPC channel trusts the stand-in's certificate)."""
    full_env = {**os.environ, **server.client_env(), "PYTHONPATH": str(ROOT), "HOME": str(repo.parent), **env}
    full_env.pop("BEAKER_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-m", "tinkrl.cli", "launch", *argv],
        cwd=repo,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_submit_stores_missing_secrets_and_follows_the_job_to_its_exit_code(repo, stand_in):
    short = git(repo, "rev-parse", "--short", "HEAD")
    state = stand_in.state
    state.images[f"alice/tinkrl-{short}"] = "01IMAGE"
    state.secrets[("01WSDAVIDH", "TINKER_API_KEY")] = "already-there"
    state.next_script = JobScript(lines=["step 0 reward 0.1", "step 1 reward 0.5", "bye"], exit_code=7)
    command = ["tinkrl", "train", *shlex.split(ERDOS_BEAKER)]
    proc = run_launch(repo, stand_in, ["beaker", *shlex.split(LAUNCHER), *command])

    assert proc.returncode == 7, proc.stderr  # follow=true exits with the job's exit code
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("experiment tinkrl-") and "/ex/01EXP" in lines[0]
    assert lines[1:] == ["step 0 reward 0.1", "step 1 reward 0.5", "bye"]  # the job's logs, in order

    [created] = state.experiments
    assert created["workspace_id"] == "01WSDAVIDH" and created["name"].startswith(f"tinkrl-{short}-")
    spec = created["spec"]
    assert spec["budget"] == "ai2/oe-base"
    task = spec["tasks"][0]
    assert task["command"] == command and task["result"] == {"path": "/results"}
    assert task["image"] == {"beaker": f"alice/tinkrl-{short}"}  # your image, by its full name
    assert {e["name"]: e.get("secret") for e in task["envVars"] if e["name"] in SECRETS} == {n: n for n in SECRETS}
    body = json.dumps(spec)
    assert not any(value in body for value in SECRETS.values())  # values never travel in the spec
    # the workspace had TINKER_API_KEY; the other two were stored from this environment, by value
    assert state.secret_writes == [("01WSDAVIDH", "WANDB_API_KEY"), ("01WSDAVIDH", "OPENREWARD_API_KEY")]
    assert state.secrets[("01WSDAVIDH", "TINKER_API_KEY")] == "already-there"
    assert state.secrets[("01WSDAVIDH", "WANDB_API_KEY")] == SECRETS["WANDB_API_KEY"]
    assert "stored WANDB_API_KEY as a Beaker secret in ai2/davidh" in proc.stderr
    assert "StreamJobLogs" in state.calls


def test_a_key_found_nowhere_stops_before_anything_is_created(repo, stand_in):
    short = git(repo, "rev-parse", "--short", "HEAD")
    stand_in.state.images[f"alice/tinkrl-{short}"] = "01IMAGE"
    proc = run_launch(repo, stand_in, ["beaker", *shlex.split(LAUNCHER), "true"], OPENREWARD_API_KEY="")
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "OPENREWARD_API_KEY: no Beaker secret of that name in ai2/davidh and not set in this environment" in err
    assert "secrets=TINKER_API_KEY,WANDB_API_KEY" in err and len(err.splitlines()) == 1
    assert stand_in.state.experiments == [] and stand_in.state.secret_writes == []


def test_without_follow_it_returns_once_created_and_a_missing_image_is_named(repo, stand_in):
    short = git(repo, "rev-parse", "--short", "HEAD")
    proc = run_launch(repo, stand_in, ["beaker", "workspace=ai2/davidh", "allow_dirty=true", "--", "true"])
    assert proc.returncode == 2
    assert f"Beaker image alice/tinkrl-{short} not found: build and upload it with `tinkrl launch image`" in proc.stderr
    stand_in.state.images[f"alice/tinkrl-{short}"] = "01IMAGE"
    proc = run_launch(repo, stand_in, ["beaker", "workspace=ai2/davidh", "allow_dirty=true", "--", "true"])
    assert proc.returncode == 0 and proc.stdout.startswith("experiment tinkrl-")
    assert len(stand_in.state.experiments) == 1 and "StreamJobLogs" not in stand_in.state.calls


# -- the image ------------------------------------------------------------------------------------


def test_image_dry_run_builds_for_linux_amd64_from_the_deploy_dockerfile(repo, capsys):
    rc, out, _ = launch(capsys, ["image", "workspace=ai2/davidh", "tool=podman", "allow_dirty=true", "--dry-run"])
    assert rc == 0
    build = shlex.split(out.splitlines()[0])
    short, commit = git(repo, "rev-parse", "--short", "HEAD"), git(repo, "rev-parse", "HEAD")
    assert build[:4] == ["podman", "build", "--platform", "linux/amd64"]
    assert build[build.index("-f") + 1] == str(repo / "deploy" / "Dockerfile")
    assert build[build.index("-t") + 1] == f"tinkrl:{short}" and build[-1] == str(repo)
    assert f"org.opencontainers.image.revision={commit}" in build
    assert f"Beaker image <your Beaker user>/tinkrl-{short}" in out


def test_image_without_docker_or_podman_is_one_line(repo, capsys, monkeypatch, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to(shutil.which("git"))
    monkeypatch.setenv("PATH", str(bin_dir))
    rc, _, err = launch(capsys, ["image", "allow_dirty=true"])
    assert rc == 2 and "docker or podman is not installed" in err and len(err.strip().splitlines()) == 1
    rc, _, err = launch(capsys, ["image", "allow_dirty=true", "--", "x"])
    assert rc == 2 and "takes no command" in err
