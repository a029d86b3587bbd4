"""`tinkrl serve tinker`: run the Tinker HTTP protocol over the embedded engine.

    tinkrl serve tinker [--host 127.0.0.1] [--port 8000] [--model NAME ...] [--api-key KEY]

Then point the official SDK (or tinker-cookbook, or `backend=tinker`) at it:

    TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=tml-local python my_script.py
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from aiohttp import web

from tinkrl.access import add_key_arguments, check_exposure, looks_like_tinker_key
from tinkrl.tinker_server.app import SDK_VERSION, TinkerServer


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tinkrl serve tinker",
        description=f"Serve the Tinker HTTP protocol (tinker SDK {SDK_VERSION}) over tinkrl's embedded engine.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME",
        help="base model to load at start (repeatable); others load on first use",
    )
    add_key_arguments(p, "request (on loopback without one: any tml-… key)")
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    return p


def preload(engine: Any, models: list[str]) -> None:
    """Load each base model into the engine now (a bad name fails at start, not at the first request)."""
    from tinkrl.tinker_server.engine_calls import settle_blocking

    for name in models:
        settle_blocking(engine.create_sampling_client(base_model=name))


def cli_main(argv: list[str]) -> int:
    """Serve until interrupted; exit 2 on a bad --api-key or --model, 1 when the address cannot be bound."""
    args = _parser().parse_args(argv)
    if args.api_key is not None and not looks_like_tinker_key(args.api_key):
        print("tinkrl serve tinker: --api-key must start with 'tml-' (the SDK refuses other keys)", file=sys.stderr)
        return 2
    refused = check_exposure("tinkrl serve tinker", args)
    if refused is not None:
        return refused
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    from tinkrl.local import ServiceClient

    engine = ServiceClient()
    try:
        preload(engine, args.model)
    except Exception as e:  # a bad --model is user input: one line, exit 2
        print(f"tinkrl serve tinker: cannot load model: {e}", file=sys.stderr)
        return 2
    server = TinkerServer(engine, api_key=args.api_key)
    key_hint = "<the --api-key>" if args.api_key else "tml-local"
    banner = (
        f"tinkrl serve tinker: Tinker protocol (SDK {SDK_VERSION}) on http://{args.host}:{args.port}\n"
        f"  TINKER_BASE_URL=http://{args.host}:{args.port} TINKER_API_KEY={key_hint}"
    )
    try:  # run_app calls `print` once the socket is bound
        web.run_app(
            server.app, host=args.host, port=args.port, access_log=None, print=lambda _msg: print(banner, flush=True)
        )
    except OSError as e:  # port taken, address not local, ...
        print(f"tinkrl serve tinker: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0
