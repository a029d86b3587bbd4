"""Who may use a tinkrl server: the key it asks for, compared in constant time, and where it may listen.

tinkrl's four servers (`serve tinker`, `serve openai`, `serve env`, `view`) listen on 127.0.0.1 by
default, which only this machine reaches. On any other address, whoever reaches it could sample on
the user's Tinker key, swap the weights a proxy serves, run commands in a rollout's sandbox or read
run files; so a server asked to listen there without a key does not start, unless `--no-api-key`
says that is meant (then it warns). A key comes from `--api-key` or `$TINKRL_API_KEY` (how the Helm
chart hands its generated key to the proxy without putting it on a command line).
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import os
import socket
import sys
from collections.abc import Mapping

KEY_ENV = "TINKRL_API_KEY"


def add_key_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """`--api-key` (default `$TINKRL_API_KEY`) and `--no-api-key` on a server command's parser."""
    parser.add_argument(
        "--api-key",
        default=os.environ.get(KEY_ENV) or None,
        help=f"require this key of every {what} (Authorization: Bearer KEY or X-API-Key: KEY); default ${KEY_ENV}",
    )
    parser.add_argument(
        "--no-api-key",
        action="store_true",
        help="listen on a non-loopback --host without a key (anyone who reaches the address gets in)",
    )


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback one (127.0.0.0/8, ::1): only this machine reaches it."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def exposure_problem(prog: str, host: str, api_key: str | None, no_api_key: bool) -> str | None:
    """The one line that stops a server from listening on `host` without a key; None when it may start."""
    if api_key or no_api_key or is_loopback(host):
        return None
    return (
        f"{prog}: refusing to listen on {host} without a key: anyone who reaches that address could use "
        f"this server; give --api-key KEY (or set ${KEY_ENV}), or --no-api-key to serve it open on purpose"
    )


def exposure_warning(prog: str, host: str, api_key: str | None) -> str | None:
    """The warning a server started open on a non-loopback address prints; None otherwise."""
    if api_key or is_loopback(host):
        return None
    return f"{prog}: warning: listening on {host} with no key (--no-api-key): anyone who reaches it gets in"


def check_exposure(prog: str, args: argparse.Namespace) -> int | None:
    """A server command's check of `args.host` against its key: prints the refusal and returns exit code 2,
    or prints the warning for an open server (`--no-api-key`) and returns None, as it does when all is well."""
    problem = exposure_problem(prog, args.host, args.api_key, args.no_api_key)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    warning = exposure_warning(prog, args.host, args.api_key)
    if warning:
        print(warning, file=sys.stderr)
    return None


def request_key(headers: Mapping[str, str]) -> str | None:
    """The key a request carries: `Authorization: Bearer KEY`, else `X-API-Key` (Tinker, ORS), else `api-key`
    (Azure-style OpenAI clients). `headers`: case-insensitive (aiohttp's), or with lower-case names."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return headers.get("x-api-key") or headers.get("api-key") or None


def key_matches(given: str | None, expected: str) -> bool:
    """Whether `given` is `expected`, compared in time that does not depend on where they differ."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def looks_like_tinker_key(key: str) -> bool:
    """Whether `key` has the shape of a Tinker API key (`tml-…`, or a JWT's `eyJ…`), the only keys the SDK sends."""
    return key.startswith(("tml-", "eyJ"))
