"""tinkrl inside the official Harbor and terminal-bench packages (`make test-harness`).

`harbor run` from the harness virtualenv (`make harness`: `.venv-harness`, Python >= 3.12) runs
shipped Harbor tasks with tinkrl's bwrap sandbox as its environment, and tinkrl's agent sampling a
checkpoint from a local `tinkrl serve tinker`: the job's result and the agent's token trajectory
are checked, the logprobs against the server's own. terminal-bench loads the agent through its
import-path mechanism; its trials need docker-compose containers, which this machine cannot start, so
past that step the test makes the container itself (podman serving the Docker API) and runs
terminal-bench's TmuxSession and the agent's perform_task on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.engine import TINY, real_models_dir
from helpers.ors import free_port

pytestmark = pytest.mark.harness

ROOT = Path(__file__).resolve().parents[1]
HARNESS_BIN = ROOT / ".venv-harness" / "bin"
AGENT = "tinkrl.harness.harbor_agent:TinkrlAgent"
ENVIRONMENT = "tinkrl.harness.harbor_env:BwrapEnvironment"
MAX_TURNS = 3

if not (HARNESS_BIN / "harbor").exists():
    pytest.skip(
        f"the harness virtualenv is not built ({HARNESS_BIN.parent} has no harbor): run `make harness`",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A fresh $TINKRL_HOME (checkpoints) sharing the real model cache."""
    h = tmp_path_factory.mktemp("harness") / "home"
    h.mkdir()
    (h / "models").symlink_to(real_models_dir(), target_is_directory=True)
    return h


@pytest.fixture(scope="module")
def server(home):
    """`tinkrl serve tinker` as a process on a free port, the tiny model preloaded."""
    import httpx

    port = free_port()
    env = {**os.environ, "TINKRL_HOME": str(home)}
    cmd = [sys.executable, "-m", "tinkrl.cli", "serve", "tinker", "--port", str(port), "--model", TINY]
    proc = subprocess.Popen(
        [*cmd, "--log-level", "WARNING"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(480):
            try:
                if httpx.get(f"{url}/api/v1/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.25)
        else:
            pytest.fail("tinkrl serve tinker did not come up")
        yield url
    finally:
        proc.terminate()  # aiohttp's graceful shutdown waits up to a minute for requests still running
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def checkpoint(server) -> str:
    """A sampler checkpoint saved by the server (a LoRA training run of the tiny model), as a tinker:// path."""
    import tinker

    with tinker.ServiceClient(base_url=server, api_key="tml-harness") as sc:
        tc = sc.create_lora_training_client(TINY, rank=8).result()
        return tc.save_weights_for_sampler("harbor").result().path


def harness_env(server: str, home: Path) -> dict[str, str]:
    """The environment a user runs the harness CLIs in: the Tinker URL and key, litellm kept offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(
        TINKER_BASE_URL=server,
        TINKER_API_KEY="tml-harness",
        TINKRL_HOME=str(home),
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        PATH=f"{HARNESS_BIN}:{env.get('PATH', '')}",
    )
    return env


def harbor_run(task: str, agent: str, jobs: Path, env: dict[str, str], *extra: str) -> dict:
    """`harbor run` of one shipped task with tinkrl's environment; the one trial's result.json."""
    cmd = [str(HARNESS_BIN / "harbor"), "run", "-p", str(ROOT / "tasks" / task), "--agent", agent]
    cmd += ["--env", ENVIRONMENT, "-o", str(jobs), "-n", "1", *extra]
    out = subprocess.run(cmd, cwd=jobs.parent, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = sorted(jobs.glob(f"*/{task}__*/result.json"))
    assert len(results) == 1, (results, out.stdout[-2000:])
    return json.loads(results[0].read_text())


@pytest.mark.parametrize(
    ("task", "agent", "reward"),
    [
        ("hello-file", "oracle", 1.0),
        ("hello-file", "nop", 0.0),
        ("fix-permissions", "oracle", 1.0),
        ("fix-permissions", "nop", 0.0),
    ],
)
def test_harbor_grades_shipped_tasks_in_the_bwrap_environment(tmp_path, server, home, task, agent, reward):
    """Harbor's own oracle (the task's solution) scores 1 and its no-op agent 0 in tinkrl's sandbox:
    the workspace is built (fix-permissions: its Dockerfile's COPY and RUN steps), Harbor's verifier
    uploads and runs the tests, and reads their reward back."""
    result = harbor_run(task, agent, tmp_path / "jobs", harness_env(server, home))
    assert result["exception_info"] is None, result["exception_info"]
    assert result["config"]["environment"]["import_path"] == ENVIRONMENT
    assert result["verifier_result"]["rewards"]["reward"] == reward


def test_harbor_runs_tinkrl_agent_on_a_checkpoint_and_records_its_tokens(tmp_path, server, home, checkpoint):
    """tinkrl's agent samples the checkpoint from `tinkrl serve tinker` in tinkrl's environment: the
    trial ends cleanly and is graded, and the token trajectory (in the agent dir and in Harbor's
    rollout_details) holds every turn's prompt, sampled tokens and the server's logprobs for them."""
    import tinker

    from tinkrl.local.models import load_tokenizer

    extra = ["-m", TINY, "--ak", f"checkpoint_path={checkpoint}", "--ak", f"max_turns={MAX_TURNS}"]
    extra += ["--ak", "max_tokens_per_turn=12"]
    result = harbor_run("hello-file", AGENT, tmp_path / "jobs", harness_env(server, home), *extra)
    assert result["exception_info"] is None, result["exception_info"]
    assert result["verifier_result"]["rewards"]["reward"] in (0.0, 1.0)

    trial = Path(result["trial_uri"].removeprefix("file://"))
    traj = json.loads((trial / "agent" / "tinkrl_trajectory.json").read_text())
    assert traj["checkpoint_path"] == checkpoint and traj["action_format"] == "shell"
    assert traj["renderer"] == "smollm2"
    turns = traj["turns"]
    assert 1 <= len(turns) <= MAX_TURNS
    assert traj["end_reason"] in ("submit", "max_turns")
    for t in turns:
        assert 1 <= len(t["sampled_tokens"]) <= 12
        assert len(t["logprobs"]) == len(t["sampled_tokens"])
        assert all(lp <= 0.0 for lp in t["logprobs"])
    for a, b in zip(turns, turns[1:]):  # one growing token sequence: trainable as one datum
        assert b["prompt_tokens"][: len(a["prompt_tokens"]) + len(a["sampled_tokens"])] == (
            a["prompt_tokens"] + a["sampled_tokens"]
        )
    first_prompt = load_tokenizer(TINY).decode(turns[0]["prompt_tokens"])
    assert "/app/hello.txt" in first_prompt and "```bash" in first_prompt

    detail = result["agent_result"]["rollout_details"][0]
    assert detail["prompt_token_ids"] == [t["prompt_tokens"] for t in turns]
    assert detail["completion_token_ids"] == [t["sampled_tokens"] for t in turns]
    assert result["agent_result"]["n_output_tokens"] == sum(len(t["sampled_tokens"]) for t in turns)
    assert result["agent_result"]["metadata"]["end_reason"] == traj["end_reason"]

    # the recorded logprobs are the checkpoint's: the server scores the same tokens alike
    with tinker.ServiceClient(base_url=server, api_key="tml-harness") as sc:
        sampler = sc.create_sampling_client(model_path=checkpoint).result()
        for t in turns:
            full = t["prompt_tokens"] + t["sampled_tokens"]
            scored = sampler.compute_logprobs(tinker.ModelInput.from_ints(full)).result()
            got = scored[len(t["prompt_tokens"]) :]
            assert max(abs(x - y) for x, y in zip(got, t["logprobs"])) < 2e-2


def test_harbor_agent_in_the_tools_action_format(tmp_path, server, home, checkpoint):
    """`--ak action_format=tools`: the prompt lists tinkrl's tools in the renderer's tool format instead of
    the shell format's short prompt, and the trajectory says which format it was played in."""
    from tinkrl.local.models import load_tokenizer

    extra = ["-m", TINY, "--ak", f"checkpoint_path={checkpoint}", "--ak", "action_format=tools"]
    extra += ["--ak", "max_turns=1", "--ak", "max_tokens_per_turn=8"]
    result = harbor_run("hello-file", AGENT, tmp_path / "jobs", harness_env(server, home), *extra)
    assert result["exception_info"] is None, result["exception_info"]
    trial = Path(result["trial_uri"].removeprefix("file://"))
    traj = json.loads((trial / "agent" / "tinkrl_trajectory.json").read_text())
    assert traj["action_format"] == "tools" and len(traj["turns"]) == 1
    prompt = load_tokenizer(TINY).decode(traj["turns"][0]["prompt_tokens"])
    assert "execute_bash" in prompt and "file_editor" in prompt and "```bash" not in prompt


def test_an_agent_stopped_at_its_time_limit_keeps_its_turns(tmp_path, server, home, checkpoint):
    """Harbor cancels an agent that runs past the task's time limit: the trial is still graded, and the
    turns sampled so far are in the trajectory file and in Harbor's rollout_details."""
    extra = ["-m", TINY, "--ak", f"checkpoint_path={checkpoint}", "--ak", "max_turns=1000"]
    extra += ["--ak", "max_tokens_per_turn=8", "--agent-timeout-multiplier", "0.02"]  # 120 s -> 2.4 s
    result = harbor_run("hello-file", AGENT, tmp_path / "jobs", harness_env(server, home), *extra)
    assert result["exception_info"]["exception_type"] == "AgentTimeoutError"
    assert result["verifier_result"]["rewards"]["reward"] == 0.0
    trial = Path(result["trial_uri"].removeprefix("file://"))
    traj = json.loads((trial / "agent" / "tinkrl_trajectory.json").read_text())
    assert traj["end_reason"] is None
    assert result["agent_result"]["metadata"]["end_reason"] == "stopped by the harness"
    detail = result["agent_result"]["rollout_details"][0]
    assert detail["completion_token_ids"] == [t["sampled_tokens"] for t in traj["turns"]]


def test_harbor_refuses_bad_agent_kwargs_with_one_line(tmp_path, server, home):
    """A checkpoint path that is not tinker:// stops the trial with the reason, not a traceback deep inside."""
    extra = ["-m", TINY, "--ak", "checkpoint_path=/no/such/ckpt"]
    cmd = [str(HARNESS_BIN / "harbor"), "run", "-p", str(ROOT / "tasks" / "hello-file"), "--agent", AGENT]
    cmd += ["--env", ENVIRONMENT, "-o", str(tmp_path / "jobs"), "-n", "1", *extra]
    out = subprocess.run(cmd, env=harness_env(server, home), capture_output=True, text=True, timeout=300)
    logs = out.stdout + out.stderr + "".join(p.read_text() for p in (tmp_path / "jobs").rglob("*.log"))
    logs += "".join(p.read_text() for p in (tmp_path / "jobs").rglob("result.json"))
    assert "checkpoint_path must be a tinker:// path" in logs


def test_terminal_bench_loads_the_agent_by_import_path_and_stops_at_docker(tmp_path, server, home, checkpoint):
    """`tb run --agent-import-path` resolves tinkrl's class through terminal-bench's AgentFactory; the trial
    then needs terminal-bench's docker-compose container, which this machine cannot start (no Docker daemon,
    no compose plugin): that is where it stops, and the run says so."""
    env = harness_env(server, home)
    probe = "from terminal_bench.agents.agent_factory import AgentFactory as F; "
    probe += "c = F.get_agent_class(import_path='tinkrl.harness.terminal_bench:TinkrlTbAgent'); print(c.name())"
    out = subprocess.run([str(HARNESS_BIN / "python"), "-c", probe], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("tinkrl"), out.stderr[-2000:]

    cmd = [str(HARNESS_BIN / "tb"), "run", "--agent-import-path", "tinkrl.harness.terminal_bench:TinkrlTbAgent"]
    cmd += ["--agent-kwarg", f"model_name={TINY}", "--agent-kwarg", f"checkpoint_path={checkpoint}"]
    cmd += ["--dataset-path", str(ROOT / "tasks"), "--task-id", "tb-hello", "--output-path", str(tmp_path / "tb")]
    cmd += ["--n-concurrent", "1"]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert "Failed to import agent" not in text and "ModuleNotFoundError" not in text
    if "Please ensure that Docker is installed and running" not in text:
        pytest.skip("a Docker daemon is reachable here: terminal-bench's trials go further than this test covers")
    results = json.loads(next((tmp_path / "tb").glob("*/results.json")).read_text())
    assert results["n_unresolved"] == 1 and results["n_resolved"] == 0


TB_IMAGE = "localhost/tinkrl-tb-tmux:1"


def tb_rootfs(dest: Path) -> Path:
    """A root filesystem terminal-bench's session can drive: the busybox test image plus this machine's
    bash and tmux (with their shared libraries) and the C.UTF-8 locale tmux insists on."""
    import shutil
    import tarfile

    from helpers import podman_helper

    out = dest / "tb-rootfs.tar"
    shutil.copy(podman_helper.busybox_rootfs_tar(dest), out)
    bins = [shutil.which("bash") or "/bin/bash", shutil.which("tmux") or "/usr/bin/tmux"]
    libs: set[str] = set()
    for b in bins:
        for line in subprocess.run(["ldd", b], capture_output=True, text=True, check=True).stdout.splitlines():
            parts = line.split()
            path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
            if path.startswith("/"):
                libs.add(path)
    with tarfile.open(out, "a") as tf:
        for d in ("usr", "usr/bin", "usr/lib", "usr/lib/locale", "lib", "lib/x86_64-linux-gnu", "lib64", "logs"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(info)
        for p in [*bins, *sorted(libs)]:
            tf.add(str(Path(p).resolve()), arcname=p.lstrip("/"))
        tf.add("/usr/lib/locale/C.utf8", arcname="usr/lib/locale/C.utf8")
    return out


def test_terminal_bench_session_episode_in_a_real_container(tmp_path, server, home, checkpoint):
    """Past the docker-compose step: a container made here (podman serving the Docker API), then
    terminal-bench's own TmuxSession on it and tinkrl's agent's perform_task: the episode's tokens are
    written to the logging dir, and the agent's sandbox runs commands in that container with their exit
    codes, stdout and stderr, and reads and writes its files."""
    import shutil

    from helpers import podman_helper

    reason = podman_helper.unavailable_reason() or (None if shutil.which("tmux") else "tmux is not installed")
    if reason:
        pytest.skip(reason)
    import docker

    pm = podman_helper.start(tmp_path / "podman")
    try:
        if pm.run("image", "exists", TB_IMAGE, check=False).returncode != 0:
            changes = ["CMD=/bin/sh", "ENV=PATH=/usr/local/bin:/usr/bin:/bin", "ENV=LANG=C.UTF-8", "WORKDIR=/app"]
            pm.run("import", *(a for c in changes for a in ("--change", c)), str(tb_rootfs(tmp_path)), TB_IMAGE)
        container = docker.DockerClient(base_url=pm.base_url).containers.run(TB_IMAGE, ["sleep", "600"], detach=True)
        logs = tmp_path / "agent-logs"
        script = Path(__file__).parent / "helpers" / "tb_session_episode.py"
        argv = [str(HARNESS_BIN / "python"), str(script), pm.base_url, container.id, TINY, checkpoint, str(logs)]
        out = subprocess.run(argv, env=harness_env(server, home), capture_output=True, text=True, timeout=300)
        container.remove(force=True)
    finally:
        pm.stop()
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["result"]["failure_mode"] == "none"
    traj = json.loads((logs / "tinkrl_trajectory.json").read_text())
    assert 1 <= len(traj["turns"]) <= 2 and traj["checkpoint_path"] == checkpoint
    assert got["result"]["total_output_tokens"] == sum(len(t["sampled_tokens"]) for t in traj["turns"])
    assert (got["exit_code"], got["stdout"], got["stderr"]) == (3, "out\n", "err\n")
    assert got["read_back"] == "written\n"
    assert "written" in got["tool_observation"] and "from-tmux" in got["tool_observation"]
    assert "/app" in got["tool_observation"] and got["tmux_alive"]
