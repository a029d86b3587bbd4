"""The JSON reply the test HTTP servers in tests/helpers send (status, Content-Type, Content-Length)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


def send_json(handler: BaseHTTPRequestHandler, code: int, body: dict) -> None:
    """Answer the handler's request with `body` as JSON and status `code`."""
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
