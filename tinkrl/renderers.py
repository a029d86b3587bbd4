"""Chat messages <-> tokens, stop tokens, and tool-call parsing/rendering per model family.

One implementation used by environments, the trainer and the servers. A renderer builds
prompts by encoding each message separately and concatenating token lists, never by
re-tokenising a whole conversation, so a multi-turn observation extends the previous one
token for token (the extension property): `prompt_t + action_t + continuation_t` is the
next prompt, and a whole trajectory trains as one datum.

Formats:
- ChatML (`<|im_start|>role\\n…<|im_end|>\\n`) for SmolLM2 and Qwen2/2.5/3, with Hermes-style
  tools as Qwen2.5 renders them: tool schemas in the system turn inside `<tools></tools>`,
  calls as `<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`, results as a user turn
  of `<tool_response>` blocks. SmolLM2's own template has no tool syntax; it gets this one.
- `xml` tool calls, R2E-Gym's text format for models without native tools:
  `<function=NAME>\\n<parameter=KEY>VALUE</parameter>\\n</function>`.

Messages are OpenAI-style dicts: {"role", "content", "tool_calls"?: [{"id", "type": "function",
"function": {"name", "arguments": JSON string}}], "tool_call_id"?}.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import tinker

Message = dict[str, Any]

_HERMES_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_HERMES_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call>"
)
_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_XML_FUNC_RE = re.compile(r"<function\s*=\s*([^>]+)>(.*?)</function>", re.DOTALL)
_XML_PARAM_RE = re.compile(r"<parameter\s*=\s*([^>]+)>(.*?)</parameter>", re.DOTALL)


@dataclass
class ParsedResponse:
    """A parsed response: the assistant message, whether it ended cleanly, and its malformed tool calls."""

    message: Message  # role assistant; content without tool-call markup; tool_calls if any
    ended_cleanly: bool  # the response ended with the stop token (not cut by max_tokens)
    tool_call_errors: list[str] = field(default_factory=list)  # malformed calls, one line each


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:12]


def tool_call(name: str, arguments: dict | str, call_id: str | None = None) -> dict:
    """An OpenAI-style tool call; dict arguments are serialised to JSON, and an id is made when none is given."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id or _call_id(), "type": "function", "function": {"name": name, "arguments": args}}


class ChatMLRenderer:
    """ChatML chat format (SmolLM2, Qwen2/2.5/3) with Hermes or R2E-XML tool calls."""

    def __init__(self, tokenizer, default_system: str | None = None, tool_format: str = "hermes"):
        if tool_format not in ("hermes", "xml"):
            raise ValueError(f"tool_format must be 'hermes' or 'xml', got {tool_format!r}")
        self.tokenizer = tokenizer
        self.default_system = default_system
        self.tool_format = tool_format
        self.im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if self.im_end is None or self.im_end == tokenizer.unk_token_id:
            raise ValueError("tokenizer has no <|im_end|> token: not a ChatML model")

    # -- encoding ---------------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def stop_sequences(self) -> list[int]:
        return [self.im_end]

    def _tool_system_text(self, tools: list[dict]) -> str:
        if self.tool_format == "xml":
            lines = [
                "You have access to the following functions. To call one, reply with:",
                "<function=NAME>\n<parameter=PARAM>VALUE</parameter>\n</function>",
                "",
            ]
            for t in tools:
                fn = t.get("function", t)
                lines.append(
                    f"---- BEGIN FUNCTION: {fn['name']} ----\n{fn.get('description', '')}\n"
                    f"Parameters: {json.dumps(fn.get('parameters', {}))}\n---- END FUNCTION ----"
                )
            return "\n".join(lines)
        return (
            _HERMES_TOOLS_INTRO + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + _HERMES_TOOLS_OUTRO
        )

    def _render_tool_calls(self, calls: list[dict]) -> str:
        parts = []
        for c in calls:
            fn = c["function"]
            args = fn.get("arguments", "{}")
            try:
                args_obj = json.loads(args) if isinstance(args, str) else args
            except json.JSONDecodeError:
                args_obj = args
            if self.tool_format == "xml":
                params = args_obj if isinstance(args_obj, dict) else {"input": args_obj}
                body = "".join(
                    f"<parameter={k}>{v if isinstance(v, str) else json.dumps(v)}</parameter>\n"
                    for k, v in params.items()
                )
                parts.append(f"<function={fn['name']}>\n{body}</function>")
            else:
                parts.append(
                    "<tool_call>\n"
                    + json.dumps({"name": fn["name"], "arguments": args_obj}, ensure_ascii=False)
                    + "\n</tool_call>"
                )
        return "\n".join(parts)

    def message_text(self, msg: Message) -> tuple[str, str]:
        """(role used in the template, body text) for one message."""
        role, content = msg["role"], msg.get("content") or ""
        if isinstance(content, list):  # OpenAI content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if role == "assistant" and msg.get("tool_calls"):
            calls = self._render_tool_calls(msg["tool_calls"])
            content = f"{content}\n{calls}" if content else calls
        if role == "tool":
            return "user", f"<tool_response>\n{content}\n</tool_response>"
        return role, content

    def _turn(self, role: str, body: str) -> list[int]:
        return [self.im_start] + self._encode(f"{role}\n{body}") + [self.im_end] + self._encode("\n")

    def render_messages(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """Tokens of whole turns (no generation prompt), with the family's default system turn."""
        msgs = list(messages)
        if not msgs or msgs[0]["role"] != "system":
            if self.default_system is not None or tools:
                msgs.insert(0, {"role": "system", "content": self.default_system or ""})
        return self._turns(msgs, tools)

    def _turns(self, msgs: list[Message], tools: list[dict] | None = None) -> list[int]:
        """Encode turns one by one; a run of consecutive tool results shares one user turn."""
        tokens: list[int] = []
        i = 0
        while i < len(msgs):
            role, body = self.message_text(msgs[i])
            if i == 0 and msgs[i]["role"] == "system" and tools:
                body = (body + "\n\n" if body else "") + self._tool_system_text(tools)
            if msgs[i]["role"] == "tool":
                bodies = [body]
                while i + 1 < len(msgs) and msgs[i + 1]["role"] == "tool":
                    i += 1
                    bodies.append(self.message_text(msgs[i])[1])
                body = "\n".join(bodies)
            tokens += self._turn(role, body)
            i += 1
        return tokens

    def generation_header(self) -> list[int]:
        return [self.im_start] + self._encode("assistant\n")

    def build_generation_prompt(self, messages: list[Message], tools: list[dict] | None = None) -> tinker.ModelInput:
        return tinker.ModelInput.from_ints(self.render_messages(messages, tools) + self.generation_header())

    def continuation(self, new_messages: list[Message], action_ended_cleanly: bool = True) -> list[int]:
        """Tokens that follow a sampled assistant action to make the next prompt.

        The action ends with <|im_end|> (the stop token, included by the sampler); the chat
        format's newline, the new turns and the next assistant header follow. An action cut by
        max_tokens is closed with <|im_end|> first (those tokens are observation, not action).
        """
        closing = [] if action_ended_cleanly else [self.im_end]
        return closing + self._encode("\n") + self.render_messages_no_system(new_messages) + self.generation_header()

    def render_messages_no_system(self, messages: list[Message]) -> list[int]:
        return self._turns(list(messages))

    # -- parsing -----------------------------------------------------------------------------------
    def parse_response(self, tokens: list[int]) -> ParsedResponse:
        ended = bool(tokens) and tokens[-1] == self.im_end
        text = self.tokenizer.decode(tokens[:-1] if ended else tokens, skip_special_tokens=False)
        content, calls, errors = self.parse_tool_calls(text)
        msg: Message = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        return ParsedResponse(msg, ended, errors)

    def parse_tool_calls(self, text: str) -> tuple[str, list[dict], list[str]]:
        """Split text into (content without call markup, well-formed calls, errors for malformed ones)."""
        calls, errors = [], []
        if self.tool_format == "xml":
            for m in _XML_FUNC_RE.finditer(text):
                params = {k.strip(): v.strip() for k, v in _XML_PARAM_RE.findall(m.group(2))}
                calls.append(tool_call(m.group(1).strip(), params))
            content = _XML_FUNC_RE.sub("", text)
            if "<function=" in content:
                errors.append("a <function=...> block is not closed with </function>")
            return content.strip(), calls, errors
        for m in _TOOL_CALL_RE.finditer(text):
            raw = m.group(1)
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                errors.append(f"tool call is not valid JSON ({e.msg} at char {e.pos}): {raw[:200]}")
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                errors.append(f'tool call must be an object {{"name": str, "arguments": object}}: {raw[:200]}')
                continue
            args = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    errors.append(f"arguments of {obj['name']!r} are not a JSON object: {args[:200]}")
                    continue
            if not isinstance(args, dict):
                errors.append(f"arguments of {obj['name']!r} must be a JSON object, got {type(args).__name__}")
                continue
            calls.append(tool_call(obj["name"], args))
        content = _TOOL_CALL_RE.sub("", text)
        if "<tool_call>" in content:
            errors.append("a <tool_call> block is not closed with </tool_call>")
            content = content.split("<tool_call>")[0]
        return content.strip(), calls, errors


# Default system prompts the families' own chat templates insert when none is given.
_DEFAULT_SYSTEM = {
    "smollm2": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    "qwen2": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "qwen3": None,
}


def family_of(model_name: str) -> str:
    """The model family a name belongs to (smollm2, qwen3, qwen2, else chatml): it picks the default system prompt."""
    name = model_name.lower()
    if "smollm" in name or name.startswith("tinkrl/tiny"):
        return "smollm2"
    if "qwen3" in name:
        return "qwen3"
    if "qwen" in name:
        return "qwen2"
    return "chatml"


def get_renderer(tokenizer, model_name: str, tool_format: str = "hermes") -> ChatMLRenderer:
    """The renderer for a model; every supported family speaks ChatML (see module docstring)."""
    return ChatMLRenderer(tokenizer, _DEFAULT_SYSTEM.get(family_of(model_name)), tool_format)
