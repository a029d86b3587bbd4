"""`tinkrl serve env ENV... [ENV.field=value ...]`: tinkrl's environments over the Open Reward Standard.

    tinkrl serve env arithmetic arithmetic.max_value=999 tasks tasks.path=tasks --port 8080

Other trainers and machines reach them as ORS environments (`tinkrl.env_server.app`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tinkrl.access import add_key_arguments, check_exposure
from tinkrl.errors import ConfigError


def parse_env_args(items: list[str]) -> dict[str, dict[str, Any]]:
    """`arithmetic arithmetic.max_value=999 tasks tasks.path=tasks` -> {name: {field: value}}."""
    from tinkrl.config import parse_value, set_dotted

    envs: dict[str, dict[str, Any]] = {}
    for item in items:
        if "=" in item:
            dotted, text = item.split("=", 1)
            name, _, field = dotted.partition(".")
            if not field:
                raise ConfigError(f"{item!r}: give fields as ENV.field=value")
            set_dotted(envs.setdefault(name, {}), field, parse_value(text))
        else:
            envs.setdefault(item, {})
    return envs


def cli_main(argv: list[str]) -> int:
    """Serve until interrupted; exit 2 on a bad environment or field."""
    from tinkrl.env_server.app import environment_classes, make_app

    parser = argparse.ArgumentParser(
        prog="tinkrl serve env", description="Serve tinkrl environments over the Open Reward Standard."
    )
    parser.add_argument("envs", nargs="+", metavar="ENV", help="environment names, and ENV.field=value settings")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--train-size", type=int, default=1000, help="train problems served for arithmetic (an unbounded generator)"
    )
    parser.add_argument("--eval-problems", type=int, default=100, help="problems in the test split")
    parser.add_argument("--seed", type=int, default=0)
    add_key_arguments(parser, "request (clients send it as X-API-Key; trainers name it in env.server_key_env)")
    args = parser.parse_args(argv)
    refused = check_exposure("tinkrl serve env", args)
    if refused is not None:
        return refused
    try:
        classes = environment_classes(parse_env_args(args.envs), args.train_size, args.eval_problems, args.seed)
        app = make_app(classes, args.api_key)
    except ConfigError as e:
        print(f"tinkrl serve env: {e}", file=sys.stderr)
        return 2
    import uvicorn

    names = ", ".join(c.name().lower() for c in classes)
    print(f"serving {names} over ORS at http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_keep_alive=60)
    return 0
