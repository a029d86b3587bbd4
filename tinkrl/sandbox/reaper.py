"""`tinkrl sandbox reap`: delete sandboxes that a dead run leaked (docker containers,
Kubernetes pods, or Harbor environments).

A sandbox is a leak when its TTL (`expires-at`) has passed, or when its owner is gone:
for docker, the owner process on this host (pid + start time) no longer runs; for
Kubernetes, the owner pod no longer exists (or is a different pod by uid, or finished);
for harbor, the bridge process that recorded it in its ledger no longer runs.
A live run's sandboxes are left alone. `--run-id` deletes every sandbox of that run.
Wire it with `add_reap_parser(subparsers)`; the parsed args go to `run_reap(args)`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def reap(
    provider: str = "kubernetes",
    *,
    run_id: str | None = None,
    dry_run: bool = False,
    options: dict[str, Any] | None = None,
) -> list[tuple[str, str]]:
    """Delete leaked sandboxes of `provider`; returns (name, reason) for each one deleted."""
    options = dict(options or {})
    if provider == "docker":
        from tinkrl.config import DockerSandboxConfig
        from tinkrl.sandbox.docker import _client, reap_containers

        client = _client(DockerSandboxConfig(**options))
        try:
            return reap_containers(client, run_id=run_id, dry_run=dry_run)
        finally:
            client.close()
    if provider == "kubernetes":
        from tinkrl.config import KubernetesSandboxConfig
        from tinkrl.sandbox.kubernetes import reap_pods

        return reap_pods(KubernetesSandboxConfig(**options), run_id=run_id, dry_run=dry_run)
    if provider == "harbor":
        from tinkrl.config import HarborSandboxConfig
        from tinkrl.sandbox.harbor import reap_sandboxes

        return reap_sandboxes(HarborSandboxConfig(**options), run_id=run_id, dry_run=dry_run)
    raise ValueError(f"reap: provider must be docker, kubernetes or harbor, got {provider!r}")


def add_reap_parser(subparsers) -> argparse.ArgumentParser:
    """Add `reap` to an argparse subparsers object (sets func=run_reap)."""
    p = subparsers.add_parser(
        "reap", help="delete sandboxes leaked by runs that are gone (docker, kubernetes or harbor)"
    )
    p.add_argument("--provider", choices=("kubernetes", "docker", "harbor"), default="kubernetes")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a run config whose sandbox: section gives the defaults below (default: $TINKRL_CONFIG)",
    )
    p.add_argument("--namespace", help="kubernetes: the sandbox namespace (default: sandbox.kubernetes.namespace)")
    p.add_argument("--kubeconfig", help="kubernetes: kubeconfig file (default: in-cluster, else ~/.kube/config)")
    p.add_argument("--context", help="kubernetes: kubeconfig context")
    p.add_argument("--base-url", help="docker: engine socket (default: $DOCKER_HOST or the usual sockets)")
    p.add_argument("--ledger", help="harbor: the bridges' ledger folder (default: sandbox.harbor.ledger)")
    p.add_argument("--run-id", help="delete every sandbox of this run, live or not")
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    p.set_defaults(func=run_reap)
    return p


def run_reap(args: argparse.Namespace) -> int:
    """`tinkrl sandbox reap`: delete (or, with --dry-run, list) leaked sandboxes; exit 1 on a provider error, 2 on
    a config error. Where to look comes from the flags, else the run config's sandbox section."""
    from tinkrl.config import load_sandbox_config
    from tinkrl.errors import ConfigError
    from tinkrl.sandbox.base import SandboxError

    try:
        section = load_sandbox_config(getattr(args, "config", None))
    except ConfigError as e:
        print(f"tinkrl sandbox reap: {e}", file=sys.stderr)
        return 2
    options = _reap_options(section, args)
    try:
        gone = reap(args.provider, run_id=args.run_id, dry_run=args.dry_run, options=options)
    except SandboxError as e:
        print(f"tinkrl sandbox reap: {e}", file=sys.stderr)
        return 1
    verb = "would delete" if args.dry_run else "deleted"
    for name, reason in gone:
        print(f"{verb} {name}: {reason}")
    print(f"{verb} {len(gone)} sandbox(es)")
    return 0


def _reap_options(section: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Where to look: the run config's settings for the provider (the one section training uses), then the
    flags. Only the keys that say where sandboxes are (a reap creates nothing)."""
    if args.provider == "kubernetes":
        k = section.kubernetes
        options = {"namespace": k.namespace, "kubeconfig": k.kubeconfig, "context": k.context}
        flags = ("namespace", "kubeconfig", "context")
    elif args.provider == "harbor":
        h = section.harbor
        options = {"ledger": h.ledger, "python": h.python}
        flags = ("ledger",)
    else:
        options = {"base_url": section.docker.base_url}
        flags = ("base_url",)
    for key in flags:
        if getattr(args, key, None):
            options[key] = getattr(args, key)
    return {k: v for k, v in options.items() if v is not None}


def cli_main(argv: list[str]) -> int:
    """Stand-alone entry (`python -m tinkrl.sandbox.reaper ...`) until `tinkrl sandbox reap` is wired."""
    parser = argparse.ArgumentParser(prog="tinkrl sandbox")
    add_reap_parser(parser.add_subparsers(dest="subcommand", required=True))
    args = parser.parse_args(["reap", *argv])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(cli_main(sys.argv[1:]))
