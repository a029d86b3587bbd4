"""`tinkrl launch`: run a command where the compute is, from the current git checkout.

    tinkrl launch beaker workspace=ai2/me budget=ai2/oe-base follow=true -- tinkrl train model_name=... log_path=/results
    tinkrl launch k8s values=values-training.yaml follow=true -- tinkrl train model_name=... log_path=/results
    tinkrl launch image workspace=ai2/me          # build the image (linux/amd64) and upload it to Beaker
    tinkrl launch beaker|k8s|image ... --dry-run  # print the Beaker spec / Job manifest / build; contact nothing

Keys and what each target needs: `tinkrl launch TARGET --help`; the library is `tinkrl.launch`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

from tinkrl.errors import ConfigError

# target -> (synopsis, what it does)
TARGETS: dict[str, tuple[str, str]] = {
    "beaker": ("beaker KEY=VALUE ... -- COMMAND ...", "one Beaker experiment running COMMAND in the tinkrl image"),
    "k8s": ("k8s KEY=VALUE ... -- COMMAND ...", "one Kubernetes Job running COMMAND next to the Helm chart's release"),
    "image": ("image KEY=VALUE ...", "build the tinkrl image for linux/amd64 and upload it as a Beaker image"),
}
NEEDS = {
    "beaker": "needs: beaker-py (pip install 'tinkrl[cluster]'), BEAKER_TOKEN or ~/.beaker/config.yml, the Beaker "
    "image tinkrl-<commit> (tinkrl launch image), and TINKER_API_KEY / WANDB_API_KEY / OPENREWARD_API_KEY in the "
    "workspace's secrets or this environment (stored from here when missing)",
    "k8s": "needs: the kubernetes client (pip install 'tinkrl[cluster]'), a kubeconfig, the chart installed "
    "(make -C deploy deploy) and the image pushed at this commit (make -C deploy push)",
    "image": "needs: docker or podman, beaker-py and Beaker credentials (the upload goes through the Docker API: "
    "with podman, run `podman system service` and set DOCKER_HOST)",
}
K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
BEAKER_NAME = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*$")


def usage(target: str | None = None) -> str:
    """The help text: every target, or one target's keys and needs."""
    if target is None:
        lines = ["usage: tinkrl launch TARGET KEY=VALUE ... [--dry-run] [-- COMMAND ...]", "", "targets:"]
        lines += [f"  {name:<8}{text}" for name, (_, text) in TARGETS.items()]
        return "\n".join(lines + ["", "tinkrl launch TARGET --help lists its keys."])
    from tinkrl.launch.common import option_help

    cls = _options_class(target)
    synopsis, text = TARGETS[target]
    return f"usage: tinkrl launch {synopsis} [--dry-run]\n{text}\n{NEEDS[target]}\n\nkeys:\n{option_help(cls)}"


def _options_class(target: str) -> type:
    from tinkrl.launch.beaker import BeakerOptions, ImageOptions
    from tinkrl.launch.kubernetes_job import JobOptions

    return {"beaker": BeakerOptions, "k8s": JobOptions, "image": ImageOptions}[target]


def _prepare(target: str, argv: list[str], name_rule: re.Pattern, what: str) -> tuple[Any, Any, Any, str]:
    """The line, options, checkout and run name of `tinkrl launch TARGET ... -- COMMAND` (bad input,
    a dirty checkout without allow_dirty, or a name the cluster would refuse: a ConfigError)."""
    from tinkrl.launch.common import build_options, default_name, git_state, option_keys, require_clean, split_line

    cls = _options_class(target)
    line = split_line(argv, option_keys(cls), "tinkrl launch " + TARGETS[target][0])
    opts = build_options(cls, line.options)
    git = git_state()
    require_clean(git, opts.allow_dirty)
    name = opts.name or default_name(git)
    if not name_rule.match(name):
        raise ConfigError(f"name={name}: not a valid {what} name")
    return line, opts, git, name


def launch_beaker(argv: list[str]) -> int:
    """`tinkrl launch beaker`: the spec (dry run), or the experiment created (and followed)."""
    from tinkrl.launch import beaker as bk

    line, opts, git, name = _prepare("beaker", argv, BEAKER_NAME, "Beaker experiment")
    image = opts.image or bk.image_name(git)
    if line.dry_run:
        print(bk.spec_yaml(bk.experiment_spec(opts, line.command, git, image), opts.workspace, name), end="")
        if "/" not in image:
            print(
                f"tinkrl launch: the image {image} is yours: it is submitted as <your Beaker user>/{image}",
                file=sys.stderr,
            )
        return 0
    with bk.connect(opts.workspace) as beaker:
        spec = bk.experiment_spec(opts, line.command, git, bk.qualified_image(beaker, image))
        bk.ensure_secrets(beaker, opts.secrets, sys.stderr)
        workload = bk.submit(beaker, spec, name)
        print(f"experiment {name}: {beaker.workload.url(workload)}", flush=True)
        return bk.follow(beaker, workload, sys.stdout) if opts.follow else 0


def launch_k8s(argv: list[str]) -> int:
    """`tinkrl launch k8s`: the Job manifest (dry run), or the Job created (and followed)."""
    from tinkrl.launch import kubernetes_job as kj
    from tinkrl.launch.common import to_yaml

    line, opts, git, name = _prepare("k8s", argv, K8S_NAME, "Kubernetes Job (DNS label)")
    chart = kj.chart_settings(git, opts.release, opts.values)
    manifest = kj.job_manifest(opts, chart, line.command, git, name)
    kj.warn_ephemeral(manifest)
    if line.dry_run:
        print(to_yaml(manifest), end="")  # the Job as `kubectl apply -f` reads it
        return 0
    batch, core = kj.connect(opts)
    kj.check_release(core, chart, opts.namespace)
    kj.submit(batch, manifest)
    print(f"job/{name} created in namespace {opts.namespace}", flush=True)
    return kj.follow(batch, core, opts.namespace, name, sys.stdout) if opts.follow else 0


def launch_image(argv: list[str]) -> int:
    """`tinkrl launch image`: the build command (dry run), or the image built and uploaded to Beaker."""
    import shlex
    import shutil

    from tinkrl.launch import beaker as bk
    from tinkrl.launch.common import build_options, git_state, option_keys, parse_pairs, require_clean

    if "--" in argv:
        raise ConfigError("tinkrl launch image takes no command: tinkrl launch " + TARGETS["image"][0])
    opts = build_options(
        bk.ImageOptions, parse_pairs(argv, option_keys(bk.ImageOptions), "tinkrl launch " + TARGETS["image"][0])
    )
    git = git_state()
    require_clean(git, opts.allow_dirty)
    name = opts.name or bk.image_name(git)
    if not BEAKER_NAME.match(name):
        raise ConfigError(f"name={name}: not a valid Beaker image name")
    tag = f"tinkrl:{git.short}"
    if "--dry-run" in argv:
        tool = opts.tool or next((t for t in ("docker", "podman") if shutil.which(t)), "docker")
        print(shlex.join(bk.build_command(tool, git, tag)))
        print(
            f"# then: upload {tag} as the Beaker image <your Beaker user>/{name} (workspace {opts.workspace or 'default'})"
        )
        return 0
    tool = bk.container_tool(opts.tool)
    with bk.connect(opts.workspace) as beaker:  # credentials first: no build that cannot be uploaded
        bk.build_image(tool, git, tag)
        print(bk.upload_image(beaker, name, tag, opts.budget, sys.stderr))
    return 0


RUNNERS: dict[str, Callable[[list[str]], int]] = {"beaker": launch_beaker, "k8s": launch_k8s, "image": launch_image}


def cli_main(argv: list[str]) -> int:
    """`tinkrl launch TARGET ...`: the target's exit code (with follow=true, the job's), 2 on bad input."""
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    target, rest = argv[0], argv[1:]
    if target not in RUNNERS:
        print(f"tinkrl launch: unknown target {target!r}; one of {', '.join(RUNNERS)}", file=sys.stderr)
        return 2
    head = rest[: rest.index("--")] if "--" in rest else rest
    if "-h" in head or "--help" in head:
        print(usage(target))
        return 0
    try:
        return RUNNERS[target](rest)
    except ConfigError as e:
        print(f"tinkrl launch {target}: error: {e}", file=sys.stderr)
        return 2
