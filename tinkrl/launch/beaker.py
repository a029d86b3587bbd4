"""Beaker: one experiment with one task that runs a command in the tinkrl image, through the official
`beaker-py` client (`Beaker.from_env()`: `~/.beaker/config.yml` or `BEAKER_TOKEN`).

- The spec is a plain Beaker v2 experiment spec (camelCase, as `beaker experiment create` reads it),
  built here without the client so `--dry-run` needs nothing but this checkout; it is submitted
  through `BeakerExperimentSpec.from_json`.
- The task's image is the Beaker image `tinkrl-<commit>` that `tinkrl launch image` uploads for the
  current commit (or `image=`); its command is the launched command, word for word; its result
  directory is /results; the API keys are Beaker secrets referenced by name, stored from the local
  environment when the workspace lacks them.
- `follow=true` streams the job's logs until it is finalized and returns its exit code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO, Any

from tinkrl.errors import ConfigError
from tinkrl.launch.common import DOCKERFILE, RESULTS_DIR, SECRET_ENV, GitState, describe, option, to_yaml

PRIORITIES = ("low", "normal", "high", "urgent", "immediate")
PLATFORM = "linux/amd64"  # Beaker's nodes


@dataclass
class BeakerOptions:
    """The keys of `tinkrl launch beaker`."""

    workspace: str | None = option(None, "Beaker workspace, e.g. ai2/davidh (default: your Beaker config's)")
    budget: str | None = option(None, "budget account the experiment is charged to, e.g. ai2/oe-base")
    follow: bool = option(False, "stream the job's logs until it ends, then exit with its exit code")
    allow_dirty: bool = option(False, "launch although the checkout has uncommitted changes")
    cluster: list[str] = option([], "cluster(s) the task may run on, comma-separated, e.g. ai2/jupiter")
    image: str | None = option(None, "Beaker image (default: tinkrl-<commit>, as `tinkrl launch image` names it)")
    priority: str | None = option(None, "job priority: " + " | ".join(PRIORITIES))
    preemptible: bool | None = option(None, "whether the job may be preempted")
    gpus: int = option(0, "GPUs for the task")
    name: str | None = option(None, "experiment name (default: tinkrl-<commit>-<UTC time>)")
    secrets: list[str] = option(list(SECRET_ENV), "environment variables passed as Beaker secrets of the same name")

    def __post_init__(self) -> None:
        if self.priority is not None and self.priority not in PRIORITIES:
            raise ConfigError(f"priority={self.priority}: one of {', '.join(PRIORITIES)}")
        for name in self.secrets:
            if not name.replace("_", "").isalnum():
                raise ConfigError(f"secrets: {name!r} is not an environment variable name")


@dataclass
class ImageOptions:
    """The keys of `tinkrl launch image`."""

    workspace: str | None = option(None, "Beaker workspace the image goes to (default: your Beaker config's)")
    name: str | None = option(None, "Beaker image name (default: tinkrl-<commit>)")
    allow_dirty: bool = option(False, "build although the checkout has uncommitted changes")
    tool: str | None = option(None, "docker or podman (default: docker when installed, else podman)")
    budget: str | None = option(None, "budget account for the image's storage")


def image_name(git: GitState) -> str:
    """The Beaker image name of the tinkrl image built at this commit."""
    return f"tinkrl-{git.short}"


def experiment_spec(opts: BeakerOptions, command: list[str], git: GitState, image: str) -> dict[str, Any]:
    """The Beaker v2 experiment spec (JSON form) for one task running `command` in `image`."""
    context: dict[str, Any] = {}
    if opts.priority is not None:
        context["priority"] = opts.priority
    if opts.preemptible is not None:
        context["preemptible"] = opts.preemptible
    env = [{"name": name, "secret": name} for name in opts.secrets]
    env.append({"name": "TINKRL_GIT_COMMIT", "value": git.commit})
    task: dict[str, Any] = {
        "name": "main",
        "image": {"beaker": image},
        "command": list(command),
        "envVars": env,
        "result": {"path": RESULTS_DIR},
        "context": context,
    }
    if opts.cluster:
        task["constraints"] = {"cluster": list(opts.cluster)}
    if opts.gpus:
        task["resources"] = {"gpuCount": opts.gpus}
    spec: dict[str, Any] = {"version": "v2", "description": describe(git, command)}
    if opts.budget:
        spec["budget"] = opts.budget
    spec["tasks"] = [task]
    return spec


def spec_yaml(spec: dict[str, Any], workspace: str | None, name: str) -> str:
    """The spec as YAML (what `beaker experiment create` reads), headed by comments naming the
    workspace and experiment name it is created with."""
    head = f"# beaker experiment: workspace {workspace or '(your Beaker config default)'}, name {name}\n"
    return head + to_yaml(spec)


def build_command(tool: str, git: GitState, tag: str) -> list[str]:
    """The image build: deploy/Dockerfile for linux/amd64, labelled with the commit."""
    return [
        tool,
        "build",
        "--platform",
        PLATFORM,
        "-f",
        str(git.root / DOCKERFILE),
        "-t",
        tag,
        "--label",
        f"org.opencontainers.image.revision={git.commit}",
        str(git.root),
    ]


def container_tool(preferred: str | None) -> str:
    """docker or podman, whichever is installed (or the one asked for); neither is a ConfigError."""
    choices = [preferred] if preferred else ["docker", "podman"]
    if preferred and preferred not in ("docker", "podman"):
        raise ConfigError(f"tool={preferred}: docker or podman")
    for tool in choices:
        if shutil.which(tool):
            return tool
    wanted = preferred or "docker or podman"
    raise ConfigError(f"{wanted} is not installed: the image is built with it (install Docker or Podman)")


# -- talking to Beaker ------------------------------------------------------------------------


def connect(workspace: str | None) -> Any:
    """A `beaker.Beaker` client from the local Beaker config or BEAKER_TOKEN (no version check)."""
    try:
        from beaker import Beaker
        from beaker.exceptions import BeakerConfigurationError
    except ModuleNotFoundError:
        raise ConfigError("tinkrl launch beaker needs beaker-py: pip install 'tinkrl[cluster]'") from None
    overrides = {"default_workspace": workspace} if workspace else {}
    try:
        client = Beaker.from_env(check_for_upgrades=False, **overrides)
    except BeakerConfigurationError:
        raise ConfigError(
            "no Beaker credentials: set BEAKER_TOKEN, or run `beaker config set user_token TOKEN`"
        ) from None
    if not client.config.default_workspace:
        client.close()
        raise ConfigError("no Beaker workspace: pass workspace=ORG/NAME or set one in your Beaker config")
    return client


def qualified_image(beaker: Any, image: str) -> str:
    """`image` as `owner/name` (a bare name is yours), checked to exist on Beaker."""
    from beaker.exceptions import BeakerImageNotFound

    full = image if "/" in image else f"{beaker.user_name}/{image}"
    try:
        beaker.image.get(full)
    except BeakerImageNotFound:
        raise ConfigError(
            f"Beaker image {full} not found: build and upload it with `tinkrl launch image`, or pass image=OWNER/NAME"
        ) from None
    return full


def ensure_secrets(beaker: Any, names: list[str], log: IO[str]) -> None:
    """Every named secret exists in the workspace: those missing are stored from the local environment;
    one missing in both places is a ConfigError (before anything is written)."""
    from beaker.exceptions import BeakerSecretNotFound

    missing = []
    for name in names:
        try:
            beaker.secret.get(name)
        except BeakerSecretNotFound:
            missing.append(name)
    unset = [name for name in missing if not os.environ.get(name)]
    if unset:
        keep = ",".join(n for n in names if n not in unset) or "''"
        raise ConfigError(
            f"{', '.join(unset)}: no Beaker secret of that name in {beaker.config.default_workspace} and not set in "
            f"this environment; export it, or pass only the others with secrets={keep}"
        )
    for name in missing:
        beaker.secret.write(name, os.environ[name])
        print(f"tinkrl launch: stored {name} as a Beaker secret in {beaker.config.default_workspace}", file=log)


def submit(beaker: Any, spec: dict[str, Any], name: str) -> Any:
    """Create the experiment; returns its workload."""
    from beaker import BeakerExperimentSpec
    from beaker.exceptions import BeakerError

    try:
        return beaker.experiment.create(spec=BeakerExperimentSpec.from_json(spec), name=name)
    except BeakerError as e:
        raise ConfigError(f"Beaker refused the experiment: {e}") from None


def follow(beaker: Any, workload: Any, out: IO[str], poll_s: float = 2.0) -> int:
    """Stream the experiment's job logs to `out` until its latest job is finalized (following a
    replacement job after a preemption); returns that job's exit code (1 if it never ran to exit)."""
    followed: set[str] = set()
    while True:
        job = beaker.workload.get_latest_job(workload)
        if job is None:  # not scheduled yet
            time.sleep(poll_s)
            continue
        if job.id not in followed:
            followed.add(job.id)
            for entry in beaker.job.logs(job, follow=True):  # returns once the job is finalized
                out.write(entry.message.decode("utf-8", errors="replace").rstrip("\n") + "\n")
                out.flush()
        job = beaker.job.get(job.id)
        latest = beaker.workload.get_latest_job(workload)
        if latest is not None and latest.id not in followed:
            continue  # preempted and retried: follow the new job
        if job.status.HasField("finalized"):
            return int(job.status.exit_code) if job.status.HasField("exited") else 1
        time.sleep(poll_s)


def upload_image(beaker: Any, name: str, tag: str, budget: str | None, log: IO[str]) -> str:
    """Upload the local image `tag` as the Beaker image `name`, replacing one of that name; returns its
    full name. Needs a Docker API socket (Docker, or Podman's `podman system service` via DOCKER_HOST)."""
    from beaker.exceptions import BeakerImageConflict, BeakerImageNotFound

    full = f"{beaker.user_name}/{name}"
    try:
        beaker.image.delete(beaker.image.get(full))
        print(f"tinkrl launch: replacing the Beaker image {full}", file=log)
    except BeakerImageNotFound:
        pass
    try:
        image = beaker.image.create(name, tag, budget=budget, description=f"tinkrl image {tag}")
    except BeakerImageConflict:
        raise ConfigError(f"a Beaker image named {full} appeared meanwhile; run again") from None
    except Exception as e:  # the docker SDK's connection errors name the socket it tried
        if type(e).__module__.startswith("docker"):
            raise ConfigError(f"cannot reach a Docker API to upload {tag}: {e}") from None
        raise
    return image.full_name or full


def build_image(tool: str, git: GitState, tag: str, log: IO[str] | None = None) -> None:
    """Run the image build, its output going to `log`; a failed build is a ConfigError."""
    if not (git.root / DOCKERFILE).is_file():
        raise ConfigError(f"no {DOCKERFILE} in {git.root}: run tinkrl launch image in a tinkrl checkout")
    command = build_command(tool, git, tag)
    log = log or sys.stderr
    print("tinkrl launch: " + " ".join(command), file=log, flush=True)
    if subprocess.run(command, stdout=log, stderr=log).returncode != 0:
        raise ConfigError(f"the image build failed ({tool} build exited non-zero; its output is above)")
