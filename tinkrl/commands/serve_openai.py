"""`tinkrl serve openai`: an OpenAI-compatible server over the policy, with token capture.

    tinkrl serve openai [--host 127.0.0.1] [--port 8001] [--model NAME | --checkpoint PATH]
                        [--backend local|tinker] [--api-key KEY] [--admin-key KEY]

Point any OpenAI client at it (`OPENAI_BASE_URL=http://127.0.0.1:8001/v1`); a base URL of
`http://127.0.0.1:8001/rollouts/<id>/v1` captures every call under rollout `<id>`, fetched
with `GET /v1/rollouts/<id>`. `POST /v1/admin/weights {"model_path": ...}` swaps weights.
On an address other than loopback it needs a key (`tinkrl.access`); `--admin-key` guards the weight
swap and the captured rollouts with a key of their own.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path

from aiohttp import web

from tinkrl.access import add_key_arguments, check_exposure

ADMIN_KEY_ENV = "TINKRL_ADMIN_KEY"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tinkrl serve openai",
        description="Serve the policy over the OpenAI API (chat/completions, completions, "
        "models), recording every sampled token per rollout.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8001, help="port (default 8001)")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--model", default=None, help="base model to serve (default with --backend local: the default model)"
    )
    src.add_argument(
        "--checkpoint",
        default=None,
        metavar="PATH",
        help="sampler weights to serve: tinker://… path or a checkpoint directory",
    )
    p.add_argument(
        "--backend",
        choices=["local", "tinker"],
        default="local",
        help="local: the embedded engine; tinker: the Tinker API at --base-url / TINKER_BASE_URL",
    )
    p.add_argument("--base-url", default=None, help="Tinker service URL for --backend tinker")
    add_key_arguments(p, "request")
    p.add_argument(
        "--admin-key",
        default=os.environ.get(ADMIN_KEY_ENV) or None,
        help=f"require this key, not --api-key, to swap weights or read captured rollouts; default ${ADMIN_KEY_ENV}",
    )
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: the base model)")
    p.add_argument("--max-context", type=int, default=None, help="context length in tokens (default: the model's)")
    p.add_argument("--tool-format", choices=["hermes", "xml"], default="hermes", help="tool-call syntax in the prompt")
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    return p


def build_server(args: argparse.Namespace):
    """The `ProxyServer` the flags ask for: a base model or a checkpoint, on the local engine or the Tinker service.
    Its `service_client` is the caller's to end, as a context manager around the serving (`cli_main`); when
    no server comes of it, its session has already ended (errored) here."""
    from tinkrl.backends import make_service_client
    from tinkrl.config import BackendConfig
    from tinkrl.local.models import DEFAULT_MODEL
    from tinkrl.proxy.server import ProxyServer

    service = make_service_client(BackendConfig(backend=args.backend, base_url=args.base_url))
    with contextlib.ExitStack() as on_failure:
        on_failure.enter_context(service)
        if args.checkpoint:
            client = service.create_sampling_client(model_path=args.checkpoint)
            model_name = client.get_base_model()  # both backends' clients know it without a call
            if not model_name:
                raise ValueError(f"cannot tell the base model of checkpoint {args.checkpoint!r}")
            label = args.checkpoint
        else:
            model_name = args.model or DEFAULT_MODEL
            client = service.create_sampling_client(base_model=model_name)
            label = model_name
        server = ProxyServer(
            client,
            model_name=model_name,
            served_model_name=args.served_model_name,
            api_key=args.api_key,
            admin_key=args.admin_key,
            max_context=args.max_context,
            tool_format=args.tool_format,
            service_client=service,
            label=label,
        )
        on_failure.pop_all()  # a server: the service stays open for it
    return server


def cli_main(argv: list[str]) -> int:
    """Serve until interrupted; exit 2 on a missing checkpoint or a model or backend that fails to load."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    refused = check_exposure("tinkrl serve openai", args)
    if refused is not None:
        return refused
    if (
        args.checkpoint
        and args.backend == "local"
        and not args.checkpoint.startswith("tinker://")
        and not Path(args.checkpoint).expanduser().exists()
    ):
        print(f"tinkrl serve openai: checkpoint {args.checkpoint!r} does not exist", file=sys.stderr)
        return 2
    if args.backend == "tinker" and not (args.model or args.checkpoint):
        print(
            "tinkrl serve openai: --backend tinker needs --model (a model the Tinker service serves, e.g. "
            "Qwen/Qwen3-8B) or --checkpoint (a tinker:// path); the default model is served by the local engine",
            file=sys.stderr,
        )
        return 2
    try:
        server = build_server(args)
    except Exception as e:  # a bad model, checkpoint or backend is user input: one line, exit 2
        print(f"tinkrl serve openai: {e}", file=sys.stderr)
        return 2
    url = f"http://{args.host}:{args.port}"
    print(
        f"tinkrl serve openai: {server.served_model_name} ({server.policy.label}) on {url}/v1\n"
        f"  OPENAI_BASE_URL={url}/v1 OPENAI_API_KEY={'<the --api-key>' if args.api_key else 'EMPTY'}\n"
        f"  per-rollout capture: {url}/rollouts/<rollout_id>/v1",
        flush=True,
    )
    # Stopping the server (Ctrl-C, SIGTERM) is its normal end: the service records the session as a success.
    with server.service_client:
        web.run_app(server.app, host=args.host, port=args.port, print=None, access_log=None)
    return 0
