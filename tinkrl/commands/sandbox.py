"""`tinkrl sandbox ...`: run one command in a fresh sandbox (`run`); more subcommands plug in here."""

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


def build_parser() -> argparse.ArgumentParser:
    """The `tinkrl sandbox` command line: `run` and `reap`."""
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
    from tinkrl.sandbox.reaper import add_reap_parser

    add_reap_parser(sub)
    return parser


def cli_main(argv: list[str]) -> int:
    """`tinkrl sandbox`: the subcommand's exit code (`run`: the command's, 124 on timeout, 125 on a sandbox failure)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args))
