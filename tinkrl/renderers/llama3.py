"""Llama 3.x (3.1, 3.2, 3.3; instruct and base) in Meta's header format, written by hand
(tml-renderers has no Llama family):

    <|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: …<|eot_id|>
    <|start_header_id|>user<|end_header_id|>\\n\\n{content}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\\n\\n

As the HF chat template of Llama 3.1/3.2/3.3 Instruct renders it: a system turn always, with the
knowledge-cutoff preamble and the date pinned to the template's own default ("26 Jul 2024"; 3.2's
template would print today's date, which would make prompts change from day to day); contents
trimmed; tool schemas (indented JSON) in the first user turn, with "Environment: ipython" in the
system turn; a tool call as the whole reply, `{"name": "NAME", "parameters": {…}}` (Llama 3.1's
JSON tool calling; several calls are joined with "; ", which the HF template refuses, and an
assistant message's text beside its calls is dropped, as the template does); tool results in an
`ipython` turn as JSON (the template's `tojson`, which quotes a plain string too). A reply ends
with `<|eot_id|>`, or `<|eom_id|>`, which Llama 3.1 may emit after a tool call.

`xml` tool calls put R2E-Gym's `<function=NAME>` syntax in the system turn instead.
"""

from __future__ import annotations

import json
import re

from .base import (
    Message,
    Renderer,
    call_arguments,
    call_from_object,
    content_text,
    parse_xml_calls,
    xml_call_text,
    xml_tools_text,
)

DATE_STRING = "26 Jul 2024"
_TOOLS_IN_USER_INTRO = (
    "Given the following functions, please respond with a JSON for a function call with its proper arguments "
    "that best answers the given prompt.\n\n"
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
    "Do not use variables.\n\n"
)
_TOOLS_IN_SYSTEM_INTRO = (
    "You have access to the following functions. To call a function, please respond with JSON for a function call."
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
    "Do not use variables.\n\n"
)
_CALL_START_RE = re.compile(r'\{\s*"name"\s*:')


class Llama3Renderer(Renderer):
    """Llama 3.x chat format with Llama 3.1 JSON tool calls (or R2E-XML)."""

    name = "llama3"

    def __init__(self, tokenizer, default_system: str | None = None, tool_format: str = "hermes"):
        super().__init__(tokenizer, default_system, tool_format)
        ids = {}
        for tok in ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"):
            tid = tokenizer.convert_tokens_to_ids(tok)
            if tid is None or tid == tokenizer.unk_token_id:
                raise ValueError(f"tokenizer has no {tok} token: not a Llama 3 model")
            ids[tok] = tid
        self.bos, self.start_header, self.end_header = (
            ids["<|begin_of_text|>"],
            ids["<|start_header_id|>"],
            ids["<|end_header_id|>"],
        )
        self.eot, self.eom = ids["<|eot_id|>"], ids["<|eom_id|>"]

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def end_of_turn_tokens(self) -> list[int]:
        return [self.eot, self.eom]

    def _turn(self, role: str, body: str) -> list[int]:
        return [self.start_header] + self._encode(role) + [self.end_header] + self._encode("\n\n" + body) + [self.eot]

    def generation_header(self) -> list[int]:
        return [self.start_header] + self._encode("assistant") + [self.end_header] + self._encode("\n\n")

    # -- message bodies ------------------------------------------------------------------------------
    def _assistant_body(self, msg: Message) -> str:
        content = content_text(msg.get("content")).strip()
        calls = msg.get("tool_calls") or []
        if not calls:
            return content
        if self.tool_format == "xml":
            text = "\n".join(xml_call_text(c) for c in calls)
            return f"{content}\n{text}" if content else text
        return "; ".join(
            '{"name": "'
            + c["function"]["name"]
            + '", "parameters": '
            + json.dumps(call_arguments(c), ensure_ascii=False)
            + "}"
            for c in calls
        )

    def _body(self, msg: Message) -> tuple[str, str]:
        role = msg["role"]
        if role == "assistant":
            return role, self._assistant_body(msg)
        if role in ("tool", "ipython"):
            content = msg.get("content")
            text = json.dumps(content, ensure_ascii=False) if isinstance(content, (str, list, dict)) else str(content)
            return "ipython", text
        return role, content_text(msg.get("content")).strip()

    def _system_turn(self, system: str, tools: list[dict] | None, tools_in_system: bool) -> list[int]:
        text = ""
        if tools and self.tool_format != "xml":
            text += "Environment: ipython\n"
        text += f"Cutting Knowledge Date: December 2023\nToday Date: {DATE_STRING}\n\n"
        if tools and tools_in_system:
            text += _TOOLS_IN_SYSTEM_INTRO + "".join(
                json.dumps(t, indent=4, ensure_ascii=False) + "\n\n" for t in tools
            )
        if tools and self.tool_format == "xml":
            system = (system + "\n\n" if system else "") + xml_tools_text(tools)
        return self._turn("system", text + system)

    # -- rendering -----------------------------------------------------------------------------------
    def render_messages(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        msgs = list(messages)
        system = self.default_system or ""
        if msgs and msgs[0]["role"] == "system":
            system = content_text(msgs.pop(0).get("content")).strip()
        tools_in_user = bool(tools) and self.tool_format != "xml" and bool(msgs) and msgs[0]["role"] == "user"
        tokens = [self.bos] + self._system_turn(system, tools, tools_in_system=bool(tools) and not tools_in_user)
        if tools_in_user:
            schemas = "".join(json.dumps(t, indent=4, ensure_ascii=False) + "\n\n" for t in tools)
            first = content_text(msgs.pop(0).get("content")).strip()
            tokens += self._turn("user", _TOOLS_IN_USER_INTRO + schemas + first)
        return tokens + self.render_messages_no_system(msgs)

    def render_messages_no_system(self, messages: list[Message]) -> list[int]:
        tokens: list[int] = []
        for msg in messages:
            tokens += self._turn(*self._body(msg))
        return tokens

    def action_tokens(self, message: Message) -> list[int]:
        return self._encode(self._assistant_body(message)) + [self.eot]

    # -- parsing -------------------------------------------------------------------------------------
    def parse_tool_calls(self, text: str) -> tuple[str, list[dict], list[str]]:
        """A reply that is `{"name": …, "parameters": {…}}` (optionally after `<|python_tag|>`, several joined
        by ";") is tool calls; any other reply is content."""
        if self.tool_format == "xml":
            return parse_xml_calls(text)
        body = text.strip()
        if body.startswith("<|python_tag|>"):
            body = body[len("<|python_tag|>") :].lstrip()
        if not _CALL_START_RE.match(body):
            return text.strip(), [], []
        calls, errors = [], []
        decoder, pos = json.JSONDecoder(), 0
        while True:
            while pos < len(body) and (body[pos].isspace() or body[pos] == ";"):
                pos += 1
            if pos >= len(body):
                break
            try:
                obj, end = decoder.raw_decode(body, pos)
            except json.JSONDecodeError as e:
                errors.append(f"tool call is not valid JSON ({e.msg} at char {e.pos}): {body[pos : pos + 200]}")
                break
            call, error = call_from_object(obj, body[pos:end], keys=("parameters", "arguments"))
            if call is not None:
                calls.append(call)
            else:
                errors.append(error)
            pos = end
        return "", calls, errors

    def tool_call_prefix(self, name: str | None = None) -> str:
        if self.tool_format == "xml":
            return "<function=" if name is None else f"<function={name}>\n"
        return '{"name": "' if name is None else '{"name": ' + json.dumps(name) + ', "parameters": '
