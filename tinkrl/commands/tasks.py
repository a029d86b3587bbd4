"""`tinkrl tasks check DIR...`: load every task, run the gate, print a table; exit 1 if any failed."""

from __future__ import annotations

import argparse
import sys

from tinkrl.sandbox import get_provider
from tinkrl.sandbox.base import SandboxError
from tinkrl.taskdirs.gate import run_gate
from tinkrl.taskdirs.loaders import iter_tasks
from tinkrl.taskdirs.model import TaskLoadError


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def _cmd_check(args: argparse.Namespace) -> int:
    try:
        provider = get_provider(args.provider)
    except SandboxError as e:
        print(f"tinkrl tasks check: {e}", file=sys.stderr)
        return 2
    rows, failed = [], 0
    try:
        for item in iter_tasks(args.paths):
            if isinstance(item, TaskLoadError):
                failed += 1
                rows.append(("?", "-", "-", "-", "-", "LOAD ERROR", str(item)))
            else:
                res = run_gate(item, provider, use_cache=not args.no_cache)
                failed += not res.ok
                status = ("ok" + (" (cached)" if res.cached else "")) if res.ok else "FAIL"
                rows.append(
                    (
                        item.id,
                        item.format,
                        item.grader,
                        _fmt(res.solution_reward),
                        _fmt(res.noop_reward),
                        status,
                        "" if res.ok else res.detail,
                    )
                )
            print(f"  {rows[-1][0]}: {rows[-1][5]}", file=sys.stderr, flush=True)
    finally:
        provider.close()
    header = ("TASK", "FORMAT", "GRADER", "SOLUTION", "NO-OP", "RESULT", "WHY")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(6)]
    for r in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r[:6], widths)) + ("  " + r[6] if r[6] else ""))
    print(f"\n{len(rows) - failed}/{len(rows)} tasks passed the gate")
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    """The `tinkrl tasks` command line: `check`."""
    parser = argparse.ArgumentParser(prog="tinkrl tasks", description="task directories")
    sub = parser.add_subparsers(dest="subcommand", required=True)
    check = sub.add_parser("check", help="load tasks and run the gate (solution -> 1, no-op -> 0)")
    check.add_argument("paths", nargs="+", help="task dirs, dirs of task dirs, or .json/.jsonl row files")
    check.add_argument("--provider", default="bwrap")
    check.add_argument("--no-cache", action="store_true", help="re-run gates even if cached")
    check.set_defaults(func=_cmd_check)
    return parser


def cli_main(argv: list[str]) -> int:
    """`tinkrl tasks`: the subcommand's exit code (`check`: 1 if any task failed, 2 if the provider cannot start)."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))
