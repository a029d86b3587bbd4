"""A mini-swe-agent environment class that runs the agent's commands in a tinkrl rollout's sandbox.

mini-swe-agent picks its environment by dotted import path, so an unmodified `mini` process
acts on the rollout's sandbox (bwrap, no network) instead of the host with

    mini ... --environment-class tinkrl.harness.mini_swe_agent.TinkrlSandboxEnvironment \\
         -c environment.url={sandbox_url} -c environment.cwd={workdir}

(the run server's key comes from OPENAI_API_KEY, as litellm's does).

Each `execute` posts the command to the run server's `POST <url>/exec` (see
`tinkrl.proxy.server.ProxyServer.sandbox_exec`) and answers as mini's `LocalEnvironment` does:
`{"output", "returncode", "exception_info"}`, raising mini's `Submitted` when the output starts
with its submit marker. This module runs inside the agent's process: it imports only the
standard library, pydantic and minisweagent, never the trainer.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import urllib.error
import urllib.request
from typing import Any

from pydantic import BaseModel, Field

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini's own, as in its LocalEnvironment


class TinkrlSandboxEnvironmentConfig(BaseModel):
    """Where the rollout's sandbox is served, and how mini runs commands there."""

    url: str
    """The rollout's sandbox URL (TINKRL_SANDBOX_URL; the server adds /exec)."""
    api_key: str = Field(default_factory=lambda: os.environ.get("OPENAI_API_KEY", ""))
    """The run server's API key; default: OPENAI_API_KEY (kept out of the command line)."""
    cwd: str = ""
    """Working directory of each command (the task's workdir; empty: the sandbox's default)."""
    timeout: int = 30
    """Seconds one command may run; a command that runs longer is killed and reported."""
    env: dict[str, str] = {}
    """Variables set for every command (mini's configs set PAGER=cat and the like)."""


class TinkrlSandboxEnvironment:
    """mini-swe-agent's Environment protocol over a tinkrl rollout's sandbox."""

    def __init__(self, *, config_class: type = TinkrlSandboxEnvironmentConfig, **kwargs: Any):
        self.config = config_class(**kwargs)

    def _post(self, command: str, cwd: str, timeout: int) -> dict[str, Any]:
        body = json.dumps({"command": command, "timeout": timeout, "workdir": cwd or None}).encode()
        request = urllib.request.Request(
            self.config.url.rstrip("/") + "/exec",
            data=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.config.api_key}"},
        )
        with urllib.request.urlopen(request, timeout=timeout + 60) as response:
            return json.loads(response.read())

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run `action["command"]` in the sandbox; the result as mini's LocalEnvironment gives it."""
        command = action.get("command", "")
        if self.config.env:
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.config.env.items())
            command = f"export {exports}\n{command}"
        limit = timeout or self.config.timeout
        try:
            result = self._post(command, cwd or self.config.cwd, limit)
        except urllib.error.HTTPError as e:  # the server's answer names the reason (e.g. the rollout ended)
            raise RuntimeError(f"the tinkrl sandbox refused the command: {e.code} {e.read().decode()[:500]}") from None
        output = {"output": result["output"], "returncode": result["exit_code"], "exception_info": ""}
        if result.get("timed_out"):
            output["exception_info"] = f"The command timed out after {limit} seconds and was killed."
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict) -> None:
        """Raise mini's Submitted when the command printed the submit marker first and succeeded."""
        from minisweagent.exceptions import Submitted

        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """What mini's prompt templates may use: this config and the machine (`{{system}}` etc.)."""
        return {**self.config.model_dump(exclude={"api_key"}), **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict:
        """This environment's part of mini's trajectory file (the API key left out)."""
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json", exclude={"api_key"}),
                    "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                }
            }
        }
