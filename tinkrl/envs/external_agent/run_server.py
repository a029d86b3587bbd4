"""The OpenAI-compatible server a training run's external rollouts sample through.

Environments whose rollouts are driven from outside the trainer (an agent program, a
third-party environment library) reach the policy over the OpenAI API. One `RunServer` per
run serves it on 127.0.0.1: started on first use, its policy swapped to each step's
sampling client, every call captured under its rollout id (see `runner`). It
answers only requests carrying its random API key (handed to each agent as OPENAI_API_KEY), as
its per-rollout sandbox route runs commands in a rollout's sandbox.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from typing import Any

from tinkrl.envs.external_agent.runner import ExternalAgentRunner
from tinkrl.proxy.server import ProxyServer, serve_in_thread


class RunServer:
    """A lazily started `ProxyServer` that always serves the sampling client it was last handed."""

    def __init__(self, model_name: str, *, tool_format: str = "hermes", max_context: int | None = None):
        self.model_name = model_name
        self.tool_format = tool_format
        self.max_context = max_context
        self._lock = threading.Lock()
        self._stack = contextlib.ExitStack()
        self._server: ProxyServer | None = None
        self._url = ""

    def runner(self, sampling_client: Any) -> ExternalAgentRunner:
        """A runner whose rollouts sample from `sampling_client` (the server starts on the first call)."""
        with self._lock:
            if self._server is None:
                self._server = ProxyServer(
                    sampling_client,
                    model_name=self.model_name,
                    tool_format=self.tool_format,
                    max_context=self.max_context,
                    api_key="tinkrl-" + secrets.token_hex(16),
                )
                self._url = self._stack.enter_context(serve_in_thread(self._server))
            elif self._server.policy.client is not sampling_client:
                self._server.set_sampling_client(sampling_client)
            return ExternalAgentRunner(self._server, self._url)

    @property
    def url(self) -> str:
        """The server's base URL (no /v1); empty before the first `runner` call."""
        return self._url

    def close(self) -> None:
        """Stop the server (idempotent)."""
        with self._lock:
            self._stack.close()
            self._server = None
            self._url = ""
