"""`tinkrl sandbox ...`: run one command in a fresh sandbox (`run`), check that a provider works end to end
with the user's settings and keys (`check`), delete what dead runs leaked (`reap`)."""

from __future__ import annotations

import argparse
import sys

from tinkrl.sandbox import get_provider
from tinkrl.sandbox.base import SandboxError, SandboxSpec


def _cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("tinkrl sandbox run: give a command after --", file=sys.stderr)
        return 2
    # One argument is a shell line as typed; several are an argv to quote.
    import shlex

    line = command[0] if len(command) == 1 else shlex.join(command)
    spec = SandboxSpec(
        workdir=args.workdir, memory_mb=args.memory_mb, pids=args.pids, disk_mb=args.disk_mb, network=False
    )
    try:
        provider = get_provider(args.provider)
        with provider.create(spec) as sandbox:
            result = sandbox.exec(line, timeout=args.timeout)
    except SandboxError as e:
        print(f"tinkrl sandbox run: {e}", file=sys.stderr)
        return 125
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.timed_out:
        print(f"tinkrl sandbox run: timed out after {args.timeout:g}s", file=sys.stderr)
        return 124
    return result.exit_code if 0 <= result.exit_code < 256 else 1


def _cmd_check(args: argparse.Namespace) -> int:
    """Start one sandbox of the configured provider, run a command, copy a file in and out, stop it: each
    step's seconds on stdout; exit 0 when every step worked, 1 on the first that did not, 2 on a bad setting."""
    import tempfile
    import time
    from pathlib import Path

    from tinkrl.config import load_sandbox_config
    from tinkrl.errors import ConfigError

    sets = list(args.sandbox_sets) + ([f"sandbox.provider={args.provider}"] if args.provider else [])
    try:
        section = load_sandbox_config(args.config, sets)
    except ConfigError as e:
        print(f"tinkrl sandbox check: {e}", file=sys.stderr)
        return 2
    payload = f"tinkrl sandbox check {time.time()}\n".encode()
    steps: list[tuple[str, float]] = []

    def step(name: str, t0: float) -> None:
        steps.append((name, time.monotonic() - t0))
        print(f"{name:<28} {steps[-1][1]:7.2f}s", flush=True)

    where = section.provider + (f" ({section.harbor.environment})" if section.provider == "harbor" else "")
    print(f"tinkrl sandbox check: provider {where}", flush=True)
    provider = sandbox = None
    try:
        t0 = time.monotonic()
        provider = get_provider(section.provider, **section.provider_options())
        step("provider ready", t0)
        t0 = time.monotonic()
        sandbox = provider.create(SandboxSpec(workdir=args.workdir, image=args.image, network=False))
        step("sandbox started", t0)
        t0 = time.monotonic()
        r = sandbox.exec("echo ok; uname -sm", timeout=args.timeout)
        if r.exit_code != 0 or not r.stdout.startswith("ok"):
            raise SandboxError(f"the command exited {r.exit_code}: {r.output.strip()[-300:]}")
        step("command run", t0)
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "in" / "check.txt"
            src.parent.mkdir()
            src.write_bytes(payload)
            t0 = time.monotonic()
            sandbox.copy_in(src.parent, f"{args.workdir}/check")
            step("file copied in", t0)
            t0 = time.monotonic()
            sandbox.copy_out(f"{args.workdir}/check", Path(tmp) / "out")
            back = (Path(tmp) / "out" / "check.txt").read_bytes()
            if back != payload:
                raise SandboxError(f"the file came back as {back[:80]!r}, not as it went in")
            step("file copied out", t0)
        t0 = time.monotonic()
        sandbox.close()
        sandbox = None
        step("sandbox stopped", t0)
    except (SandboxError, OSError) as e:
        print(f"tinkrl sandbox check: failed after {len(steps)} step(s): {e}", file=sys.stderr)
        return 1
    finally:
        if sandbox is not None:
            sandbox.close()
        if provider is not None:
            provider.close()
    print(f"tinkrl sandbox check: ok, {sum(s for _, s in steps):.2f}s in all")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The `tinkrl sandbox` command line: `run`, `check` and `reap`."""
    parser = argparse.ArgumentParser(prog="tinkrl sandbox", description="sandboxes for agent tasks")
    sub = parser.add_subparsers(dest="subcommand", required=True)
    run = sub.add_parser("run", help="run one command in a fresh sandbox: tinkrl sandbox run [--workdir DIR] -- CMD...")
    run.add_argument("--workdir", default="/app", help="the sandbox's workdir (default /app)")
    run.add_argument("--provider", default="bwrap", help="sandbox provider (default bwrap)")
    run.add_argument("--timeout", type=float, default=60.0, help="seconds before the command is killed")
    run.add_argument("--memory-mb", type=int, default=2048)
    run.add_argument("--pids", type=int, default=256)
    run.add_argument("--disk-mb", type=int, default=1024)
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    run.set_defaults(func=_cmd_run)
    check = sub.add_parser(
        "check",
        help="start one sandbox, run a command, copy a file both ways, stop it, with timings: "
        "tinkrl sandbox check --provider harbor --set sandbox.harbor.environment=daytona",
    )
    check.add_argument("--provider", help="sandbox provider (default: the run config's sandbox.provider)")
    check.add_argument(
        "--config", metavar="FILE", help="a run config whose sandbox: section to use (default: $TINKRL_CONFIG)"
    )
    check.add_argument(
        "--set",
        dest="sandbox_sets",
        action="append",
        default=[],
        metavar="sandbox.KEY=VALUE",
        help="a sandbox setting over the run config's (repeatable), e.g. sandbox.harbor.environment=modal",
    )
    check.add_argument("--image", help="the sandbox's image (default: the provider's)")
    check.add_argument("--workdir", default="/app", help="the sandbox's workdir (default /app)")
    check.add_argument("--timeout", type=float, default=60.0, help="seconds the command may take")
    check.set_defaults(func=_cmd_check)
    from tinkrl.sandbox.reaper import add_reap_parser

    add_reap_parser(sub)
    return parser


def cli_main(argv: list[str]) -> int:
    """`tinkrl sandbox`: the subcommand's exit code (`run`: the command's, 124 on timeout, 125 on a sandbox failure)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args))
