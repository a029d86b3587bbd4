"""`tinkrl view RUN_DIR... [--port N]`: a local web page over training runs and `tinkrl eval` outputs.

Learning curves (several runs overlaid), every episode of every step as a transcript, eval results
per task with each trial's transcript; an ongoing run updates without a reload. Everything is served
from this machine, so it works offline.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tinkrl.access import add_key_arguments, check_exposure


def cli_main(argv: list[str]) -> int:
    """`tinkrl view`: exit 2 when a path does not exist or holds no run or eval directory."""
    parser = argparse.ArgumentParser(prog="tinkrl view", description=__doc__)
    parser.add_argument("paths", nargs="+", type=Path, help="run dirs, tinkrl eval output dirs, or folders of them")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    add_key_arguments(parser, "page and API request (open /?key=KEY once in the browser)")
    args = parser.parse_args(argv)
    refused = check_exposure("tinkrl view", args)
    if refused is not None:
        return refused
    from aiohttp import web

    from tinkrl.traces.runs import find_dirs
    from tinkrl.viewer.server import make_app

    missing = [str(p) for p in args.paths if not p.is_dir()]
    if missing:
        print(f"tinkrl view: no such directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    found = find_dirs(args.paths)
    if not found:
        print(
            "tinkrl view: no run directory (metrics.jsonl) or tinkrl eval output (results.json) in "
            + ", ".join(map(str, args.paths))
            + " (a folder given is watched: runs that start later appear)",
            file=sys.stderr,
        )
    print(f"tinkrl view: {len(found)} run/eval dirs at http://{args.host}:{args.port}/ (Ctrl-C to stop)", flush=True)
    web.run_app(make_app(args.paths, args.api_key), host=args.host, port=args.port, print=None, access_log=None)
    return 0
