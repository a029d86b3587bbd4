"""Replies in a renderer's own format, as its model would sample them: well-formed tool calls and
the same call broken (invalid JSON, an unclosed tag, a call without a name) for each family."""

from __future__ import annotations

import json

from tinkrl.renderers import tool_call

# a broken spelling of a well-formed piece, for the families whose arguments are not JSON
_BREAKS = [
    ("</parameter>", ""),  # Qwen3.5, Qwen3.8, Nemotron 3: a parameter left open
    ("</arg_value>", ""),  # GLM-5.3: an argument left open
    ('<｜DSML｜ invoke name="', '<｜DSML｜ invoke x="'),  # DeepSeek V4.1: a call without a name
]


def call_reply(renderer, name: str, args: dict, content: str = "", reasoning: str = "", call_id: str = "") -> dict:
    """An assistant message with one call, with reasoning where the renderer's family thinks."""
    reply = {"role": "assistant", "content": content, "tool_calls": [tool_call(name, args, call_id or None)]}
    if reasoning and getattr(getattr(renderer, "spec", None), "thinks", False):
        reply["reasoning_content"] = reasoning
    return reply


def broken_call(renderer, reply: dict) -> list[int]:
    """The sampled tokens of `reply` (one call) with the call broken so that it cannot be read."""
    text = renderer.tokenizer.decode(renderer.action_tokens(reply))
    args = json.loads(reply["tool_calls"][0]["function"]["arguments"])
    for good in (json.dumps(args), json.dumps(args, separators=(",", ":"))):
        if good in text:  # unquote the first key: not JSON any more
            return renderer.tokenizer.encode(text.replace(good, good.replace('"', "", 2), 1))
    for good, bad in _BREAKS:
        if good in text:
            return renderer.tokenizer.encode(text.replace(good, bad, 1))
    raise AssertionError(f"no call to break in {text!r}")
