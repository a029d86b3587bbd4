"""tinkrl's verifiers harness: the agent loop of a verifiers rollout, run in-process.

verifiers plays each rollout with a *harness*: a program that talks to the model through the
rollout's interception endpoint. Its own chat harnesses (`null`, `bash`) are scripts it installs
with `uv` into a runtime, which needs network access and minutes of setup per machine. This
harness is the same chat loop as a coroutine (the harness contract allows it: every model call
goes through `endpoint` with `secret`, and the result is a synthetic `ProgramResult`). It answers
the task's prompt, one model call per segment; a multi-turn exchange (a verifiers env with a user,
e.g. a user simulator) resumes it with the user's next turns on the accumulated conversation.

verifiers finds harnesses by module name, so `register()` makes this module importable as the
top-level module `tinkrl` ids it by (`HARNESS_MODULE`).
"""

from __future__ import annotations

import sys
from typing import Any

import verifiers.v1 as vf
from openai import AsyncOpenAI
from verifiers.v1.dialects.chat import message_to_wire

HARNESS_MODULE = "tinkrl_verifiers_harness"

__all__ = ["TinkrlChatHarness"]


class TinkrlChatHarnessConfig(vf.HarnessConfig):
    """The in-process chat harness's config (verifiers' common harness fields only)."""


def _wire_messages(system_prompt: str | None, prompt: Any) -> list[dict[str, Any]]:
    """The OpenAI chat messages for a segment: the system prompt, then the prompt (text or messages)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    elif prompt is not None:
        messages.extend(message_to_wire(m) for m in prompt)
    return messages


class TinkrlChatHarness(vf.Harness[TinkrlChatHarnessConfig]):
    """One chat completion per segment, made in-process through the rollout's interception endpoint."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: Any,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> vf.ProgramResult:
        """Ask the model once for the segment's conversation; the interception records the turn."""
        if mcp_urls:
            raise vf.HarnessError(
                f"the {HARNESS_MODULE!r} harness does not call tools; pick a verifiers harness "
                "that does (e.g. harness: bash) for a taskset with tool servers"
            )
        system_prompt, prompt = self.resolve_prompt(data)
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            reply = await client.chat.completions.create(
                model=ctx.model, messages=_wire_messages(system_prompt, prompt)
            )
        finally:
            await client.close()
        text = reply.choices[0].message.content or "" if reply.choices else ""
        return vf.ProgramResult(exit_code=0, stdout=text, stderr="")


def register() -> str:
    """Make this module importable under the top-level name verifiers' harness loader looks up; the harness id."""
    sys.modules.setdefault(HARNESS_MODULE, sys.modules[__name__])
    return HARNESS_MODULE
