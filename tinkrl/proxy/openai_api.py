"""OpenAI request validation, prompt building with sampled-token splicing, and response pieces.

Pure functions over dicts and token lists (no HTTP), so the server stays a thin shell.

- `ApiError` carries OpenAI's error shape and status code.
- `parse_chat_request` / `parse_completion_request` turn a JSON body into `SampleSettings`,
  refusing (400, naming the field) options this server cannot honour rather than ignoring them.
- `build_chat_prompt` renders messages with the model's renderer, except that assistant
  messages the server produced earlier are replaced by the exact tokens it sampled (see
  `capture.py`), so the new prompt extends the earlier prompt + completion token for token.
- `tool_choice` "required" or a named function is honoured by forcing the start of the call
  (`<tool_call>\\n{"name": "…` in Hermes format); the forced text is part of the prompt the
  sampler sees, so it is observation, not action, in the captured tokens.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tinkrl.proxy.capture import AssistantTokens, message_text
from tinkrl.renderers import Renderer

MAX_N = 128
MAX_TOP_LOGPROBS = 20
_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None, type_: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or ("invalid_request_error" if status in (400, 401, 404) else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 ApiError: the request is wrong, naming the parameter."""
    return ApiError(400, message, param=param, code=code)


@dataclass
class SampleSettings:
    """The validated sampling options of one request, and the rollout id it carries."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False
    rollout_id: str | None = None


# -- parameter parsing -----------------------------------------------------------------------------
def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(f"'{name}' must be a number, got {json.dumps(value)}", name)
    if not lo <= value <= hi:
        raise bad(f"'{name}' must be between {lo:g} and {hi:g}, got {value}", name)
    return float(value)


def _integer(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"'{name}' must be an integer, got {json.dumps(value)}", name)
    if value < lo or (hi is not None and value > hi):
        raise bad(f"'{name}' must be {f'between {lo} and {hi}' if hi is not None else f'>= {lo}'}, got {value}", name)
    return value


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad("'stop' must be a non-empty string or a list of non-empty strings", "stop")
    return stop


def _refuse_unsupported(body: dict) -> None:
    """Options with a non-default value that this server would otherwise silently ignore."""
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise bad(f"'{name}' is not supported by this server (only 0)", name)
    if body.get("logit_bias"):
        raise bad("'logit_bias' is not supported by this server", "logit_bias")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") not in ("text", None)):
        raise bad(
            '\'response_format\' other than {"type": "text"} is not supported (no constrained decoding)',
            "response_format",
        )


def _common(body: dict, settings: SampleSettings) -> SampleSettings:
    _refuse_unsupported(body)
    settings.n = _integer(body, "n", 1, MAX_N) or 1
    settings.temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    settings.top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if settings.top_p == 0.0:
        raise bad("'top_p' must be greater than 0", "top_p")
    top_k = _integer(body, "top_k", -1)  # vLLM's extension, sent through extra_body
    settings.top_k = -1 if top_k in (None, 0) else top_k
    settings.seed = _integer(body, "seed", -(2**63))
    settings.stop = _stop(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise bad("'stream' must be a boolean", "stream")
    settings.stream = bool(stream)
    opts = body.get("stream_options")
    if opts is not None:
        if not settings.stream:
            raise bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
        if not isinstance(opts, dict):
            raise bad("'stream_options' must be an object", "stream_options")
        settings.include_usage = bool(opts.get("include_usage"))
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise bad("'metadata' must be an object of strings", "metadata")
        rid = metadata.get("rollout_id")
        if rid is not None:
            settings.rollout_id = str(rid)
    return settings


def parse_chat_request(body: dict) -> SampleSettings:
    """The sampling options of a `/v1/chat/completions` body, or a 400 naming the field."""
    s = _common(body, SampleSettings())
    max_completion = _integer(body, "max_completion_tokens", 1)
    max_tokens = _integer(body, "max_tokens", 1)
    s.max_tokens = max_completion if max_completion is not None else max_tokens
    lp = body.get("logprobs")
    if lp is not None and not isinstance(lp, bool):
        raise bad("'logprobs' must be a boolean for chat completions", "logprobs")
    s.logprobs = bool(lp)
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not s.logprobs:
        raise bad("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
    s.top_logprobs = top or 0
    return s


def parse_completion_request(body: dict) -> SampleSettings:
    """The sampling options of a `/v1/completions` body (`logprobs` is a count there), or a 400 naming the field."""
    s = _common(body, SampleSettings())
    s.max_tokens = _integer(body, "max_tokens", 1) or 16  # the legacy API's default
    lp = _integer(body, "logprobs", 0, 5)
    s.logprobs = lp is not None
    s.top_logprobs = lp or 0
    if body.get("echo"):
        raise bad("'echo' is not supported by this server", "echo")
    if body.get("suffix"):
        raise bad("'suffix' is not supported by this server", "suffix")
    if body.get("best_of") not in (None, 1):
        raise bad("'best_of' is not supported by this server", "best_of")
    return s


# -- messages and tools ------------------------------------------------------------------------------
def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """The chat messages checked and normalised: content as text, `developer` as system, `function` as tool."""
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{where} must be an object", where)
        role = m.get("role")
        if role not in _ROLES:
            raise bad(f"{where}.role must be one of {sorted(_ROLES)}, got {json.dumps(role)}", f"{where}.role")
        content = m.get("content")
        if isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or part.get("type") not in ("text", "input_text"):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise bad(
                        f"{where}.content: only text parts are supported, got {json.dumps(kind)}", f"{where}.content"
                    )
        elif content is not None and not isinstance(content, str):
            raise bad(f"{where}.content must be a string or a list of text parts", f"{where}.content")
        if content is None and role != "assistant":
            raise bad(f"{where}.content is required for role {role!r}", f"{where}.content")
        msg = dict(m)
        if role == "developer":
            msg["role"] = "system"
        elif role == "function":
            msg["role"] = "tool"
        calls = msg.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list) or not all(
                isinstance(c, dict)
                and isinstance(c.get("function"), dict)
                and isinstance(c["function"].get("name"), str)
                for c in calls
            ):
                raise bad(
                    f'{where}.tool_calls must be a list of {{"type": "function", "function": {{"name", "arguments"}}}}',
                    f"{where}.tool_calls",
                )
        msg["content"] = message_text(content) if content is not None else None
        out.append(msg)
    return out


def validate_tools(body: dict) -> tuple[list[dict] | None, Any]:
    """The request's tools (None when empty) and its tool_choice: "auto", "none", "required" or {"name": ...}."""
    tools = body.get("tools")
    if tools is None or tools == []:
        tools = None
    elif not isinstance(tools, list) or not all(
        isinstance(t, dict)
        and t.get("type", "function") == "function"
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
        for t in tools
    ):
        raise bad('\'tools\' must be a list of {"type": "function", "function": {"name", ...}}', "tools")
    choice = body.get("tool_choice")
    if choice is None:
        choice = "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise bad(f"'tool_choice' must be 'auto', 'none', 'required' or a function, got {choice!r}", "tool_choice")
        if choice == "required" and not tools:
            raise bad("'tool_choice' is 'required' but no 'tools' were given", "tool_choice")
    elif isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if not tools or name not in {t["function"]["name"] for t in tools}:
            raise bad(f"'tool_choice' names function {name!r}, which is not in 'tools'", "tool_choice")
        choice = {"name": name}
    else:
        raise bad('\'tool_choice\' must be a string or {"type": "function", "function": {"name"}}', "tool_choice")
    return tools, choice


def forced_prefix(renderer: Renderer, tool_choice: Any) -> str:
    """Text the assistant turn is forced to start with so a tool call is made ("" where the family has none)."""
    if tool_choice == "required":
        return renderer.tool_call_prefix()
    if isinstance(tool_choice, dict):
        return renderer.tool_call_prefix(tool_choice["name"])
    return ""


@dataclass
class ChatPrompt:
    """A rendered chat prompt: its tokens, the forced prefix, and how many assistant messages were spliced."""

    tokens: list[int]  # everything the sampler sees, forced prefix included
    forced: list[int]  # the forced prefix tokens (already at the end of `tokens`)
    assistant_messages: int
    spliced_messages: int


def build_chat_prompt(
    renderer: Renderer,
    messages: list[dict],
    tools: list[dict] | None,
    lookup: Callable[[dict], AssistantTokens | None],
    forced_text: str = "",
) -> ChatPrompt:
    """Render `messages`, splicing in the sampled tokens behind assistant messages we produced.

    Everything before a spliced assistant turn renders as it did for the call that sampled it (the
    generation prompt of those messages); what follows the turn is the renderer's `next_prompt`: the
    sampled tokens and the rendered messages after them where the family keeps past turns as
    sampled (a cut sample is closed first), the family's own rendering where it rewrites them.
    """
    tokens: list[int] | None = None
    history: list[dict] = []
    pending: list[dict] = []
    spliced: tuple[list[int], AssistantTokens] | None = None  # (prompt it was sampled from, its tokens)
    n_assistant = n_spliced = 0

    def flush() -> list[int]:
        nonlocal tokens
        if spliced is None:
            tokens = renderer.prompt_tokens(history + pending, tools)
        else:
            prompt, hit = spliced
            tokens = renderer.next_prompt(prompt, hit.tokens, history, pending, tools, hit.ended_cleanly)
        history.extend(pending)
        pending.clear()
        return tokens

    for msg in messages:
        hit = None
        if msg["role"] == "assistant":
            n_assistant += 1
            hit = lookup(msg)
        if hit is None:
            pending.append(msg)
            continue
        n_spliced += 1
        spliced = (flush(), hit)
        history.append(msg)
    flush()
    assert tokens is not None
    forced = renderer.tokenizer.encode(forced_text, add_special_tokens=False) if forced_text else []
    return ChatPrompt(tokens + forced, forced, n_assistant, n_spliced)


# -- turning samples into messages ------------------------------------------------------------------
def truncate_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """`text` cut at the first stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


@dataclass
class ChatChoice:
    """One sample as the client sees it: the assistant message, its finish reason and the tokens behind it."""

    message: dict[str, Any]  # what the client gets (and sends back)
    finish_reason: str
    text_tokens: list[int]  # sampled tokens shown to the client (no trailing end-of-turn)


def sample_to_message(
    renderer: Renderer,
    forced_text: str,
    sampled: list[int],
    stop_reason: str,
    stops: list[str],
    parse_tools: bool,
    tools: list[dict] | None = None,
) -> ChatChoice:
    """Sampled tokens as an assistant message (stops applied, tool calls parsed by the request's `tools`,
    `<think>` -> reasoning_content)."""
    ended = renderer.ends_turn(sampled)
    body = sampled[:-1] if ended else sampled
    text = forced_text + renderer.tokenizer.decode(body, skip_special_tokens=False)
    text, hit_stop = truncate_at_stop(text, stops)
    calls: list[dict] = []
    if parse_tools:
        parsed = renderer.parse_text(text, tools).message
        reasoning, content, calls = parsed.get("reasoning_content"), parsed["content"], parsed.get("tool_calls", [])
    else:
        reasoning, content = renderer.split_reasoning(text)
    message: dict[str, Any] = {"role": "assistant"}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    message["content"] = content if (content or not calls) else None
    if calls:
        message["tool_calls"] = calls
        finish = "tool_calls"
    elif stop_reason == "length" and not hit_stop:
        finish = "length"
    else:
        finish = "stop"
    return ChatChoice(message, finish, body)


def token_logprobs(
    tokenizer, tokens: list[int], logprobs: list[float], top: list[list[tuple[int, float]] | None] | None
) -> list[dict[str, Any]]:
    """OpenAI chat `logprobs.content`: one entry per token with its text, bytes and alternatives."""
    out = []
    for i, (tok, lp) in enumerate(zip(tokens, logprobs)):
        text = tokenizer.decode([tok], skip_special_tokens=False)
        alts = []
        if top is not None and i < len(top) and top[i]:
            for alt, alt_lp in top[i]:
                alt_text = tokenizer.decode([alt], skip_special_tokens=False)
                alts.append({"token": alt_text, "logprob": float(alt_lp), "bytes": list(alt_text.encode())})
        out.append({"token": text, "logprob": float(lp), "bytes": list(text.encode()), "top_logprobs": alts})
    return out
