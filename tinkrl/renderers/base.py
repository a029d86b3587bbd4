"""The one renderer interface every caller uses, its result type, and the text tool-call formats
several families share (Hermes `<tool_call>` JSON and R2E-Gym's `<function=...>` XML).

A renderer turns OpenAI-style messages into the token ids of one model family's chat format and
sampled token ids back into a message. An episode's next prompt is `next_prompt(...)`: for a family
that keeps its past turns as sampled, `prompt_t + action_t + continuation(new_messages)`, so the
episode extends token for token (the extension property) and trains as one datum; a family that
rewrites its history (thinking dropped from past turns) gives its own rendering of the conversation,
and the episode trains as several datums, none with tokens the sampler did not see.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tinker

Message = dict[str, Any]

TOOL_FORMATS = ("hermes", "xml")


@dataclass
class ParsedResponse:
    """A parsed response: the assistant message, whether it ended cleanly, and its malformed tool calls."""

    message: Message  # role assistant; content without tool-call markup; tool_calls / reasoning_content if any
    ended_cleanly: bool  # the response ended with an end-of-turn token (not cut by max_tokens)
    tool_call_errors: list[str] = field(default_factory=list)  # malformed calls, one line each


def own_format_only(name: str, tool_format: str, own: str = "hermes") -> str:
    """The one-line refusal of a tool-call format by a renderer that speaks only its family's own."""
    return (
        f"the {name} renderer speaks only its family's own tool-call format: "
        f"use tool_format={own} (not tool_format={tool_format})"
    )


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:12]


def tool_call(name: str, arguments: dict | str, call_id: str | None = None) -> dict:
    """An OpenAI-style tool call; dict arguments are serialised to JSON, and an id is made when none is given."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id or _call_id(), "type": "function", "function": {"name": name, "arguments": args}}


def content_text(content: Any) -> str:
    """A message's content as text (OpenAI content parts joined; None is empty)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def call_arguments(call: dict) -> Any:
    """A tool call's arguments as a JSON value (a string that is not JSON stays a string)."""
    args = call["function"].get("arguments", "{}")
    if not isinstance(args, str):
        return args
    try:
        return json.loads(args)
    except json.JSONDecodeError:
        return args


class Renderer(ABC):
    """Messages <-> tokens for one chat format. Every caller (environments, the trainer, the servers)
    uses only these methods; a family implements the abstract ones.

    Attributes: `name` (the renderer's canonical name), `tokenizer` (callers decode with it: the
    model's HF tokenizer, or for tml-renderers families the tokenizer they bundle), `tool_format`
    ("hermes": the family's own tool-call format, Hermes JSON for ChatML models; "xml": R2E-Gym's
    `<function=NAME>` text format, where the family supports it), `default_system` (the system turn
    used when the messages have none).
    """

    name: str = ""
    tool_formats: tuple[str, ...] = TOOL_FORMATS
    keeps_history: bool = True  # past turns render as sampled, so an episode's prompts extend token for token

    def __init__(self, tokenizer, default_system: str | None = None, tool_format: str = "hermes"):
        self.tokenizer = tokenizer
        self.default_system = default_system
        self.tool_format = tool_format
        self._check_tool_format(tool_format)

    def _check_tool_format(self, tool_format: str) -> None:
        if tool_format not in self.tool_formats and len(self.tool_formats) == 1:
            raise ValueError(own_format_only(self.name or type(self).__name__, tool_format, self.tool_formats[0]))
        if tool_format not in self.tool_formats:
            raise ValueError(
                f"tool_format must be one of {', '.join(repr(f) for f in self.tool_formats)} for the "
                f"{self.name or type(self).__name__} renderer, got {tool_format!r}"
            )

    def with_tool_format(self, tool_format: str) -> Renderer:
        """This renderer speaking another tool-call format (itself when it already does)."""
        if tool_format == self.tool_format:
            return self
        self._check_tool_format(tool_format)
        other = copy.copy(self)
        other.tool_format = tool_format
        return other

    # -- turn ends ----------------------------------------------------------------------------------
    @abstractmethod
    def end_of_turn_tokens(self) -> list[int]:
        """The tokens that end a sampled assistant turn (the sampler stops at any of them)."""

    def close_turn_tokens(self) -> list[int]:
        """What closes an action cut by max_tokens before the next turn (forced, observation tokens)."""
        return self.end_of_turn_tokens()[:1]

    def stop_sequences(self) -> list[int]:
        """The sampler's stop condition: the end-of-turn token ids."""
        return self.end_of_turn_tokens()

    def stop_strings(self) -> list[str]:
        """The end-of-turn tokens as text, for samplers given string stops."""
        return [self.tokenizer.decode([t], skip_special_tokens=False) for t in self.end_of_turn_tokens()]

    def ends_turn(self, tokens: list[int]) -> bool:
        """Whether sampled tokens end with an end-of-turn token (the action ended cleanly)."""
        return bool(tokens) and tokens[-1] in self.end_of_turn_tokens()

    def turn_separator(self) -> list[int]:
        """Tokens the format puts between a closed turn and the next one (ChatML: a newline)."""
        return []

    def after_action(self, ended_cleanly: bool = True) -> list[int]:
        """Tokens between a sampled action and the next message: the closing token of a cut action, then
        the turn separator."""
        return ([] if ended_cleanly else self.close_turn_tokens()) + self.turn_separator()

    # -- rendering ----------------------------------------------------------------------------------
    @abstractmethod
    def render_messages(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """Tokens of whole turns from the start of a conversation (system turn, tools), no generation prompt."""

    @abstractmethod
    def render_messages_no_system(self, messages: list[Message]) -> list[int]:
        """Tokens of turns in the middle of a conversation (after a closed turn and its separator)."""

    @abstractmethod
    def generation_header(self) -> list[int]:
        """The tokens that open the assistant's turn after a user turn."""

    @abstractmethod
    def action_tokens(self, message: Message) -> list[int]:
        """The tokens a model samples for this assistant message, its end-of-turn token included."""

    def prompt_tokens(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """The generation prompt's token ids."""
        return self.render_messages(messages, tools) + self.generation_header()

    def build_generation_prompt(self, messages: list[Message], tools: list[dict] | None = None) -> tinker.ModelInput:
        """The prompt for the assistant's next turn, as the sampler takes it."""
        import tinker

        return tinker.ModelInput.from_ints(self.prompt_tokens(messages, tools))

    def continuation(self, new_messages: list[Message], action_ended_cleanly: bool = True) -> list[int]:
        """Tokens that follow a sampled assistant action to make the next prompt: the action's closing
        (a cut action is closed first; those tokens are observation, not action), the new turns, and
        the next assistant header."""
        return (
            self.after_action(action_ended_cleanly)
            + self.render_messages_no_system(new_messages)
            + self.generation_header()
        )

    def next_prompt(
        self,
        prompt: list[int],
        action: list[int],
        history: list[Message],
        new_messages: list[Message],
        tools: list[dict] | None = None,
        action_ended_cleanly: bool = True,
    ) -> list[int]:
        """The prompt after a sampled action. `history` is the conversation through the parsed action,
        `new_messages` what came back (tool results, a user turn). Here: `prompt + action +
        continuation(new_messages)`, the sampled tokens kept as sampled. A family that rewrites its past
        turns (thinking dropped from history) returns its own rendering of `history + new_messages`
        instead, which need not extend `prompt + action`: the episode then trains as several datums."""
        return list(prompt) + list(action) + self.continuation(new_messages, action_ended_cleanly)

    # -- parsing ------------------------------------------------------------------------------------
    def parse_response(self, tokens: list[int], tools: list[dict] | None = None) -> ParsedResponse:
        """Sampled tokens as an assistant message; malformed tool calls become errors, never exceptions.
        `tools` are the schemas the prompt declared: where a format writes arguments as untyped text, they
        give each argument its JSON type (a string "5" stays a string). Here: the reply's text, its tool
        calls as `parse_tool_calls` reads them."""
        text, ended = self.reply_text(tokens)
        content, calls, errors = self.parse_tool_calls(text)
        return ParsedResponse(assistant_message(content, calls), ended, errors)

    @abstractmethod
    def parse_tool_calls(self, text: str) -> tuple[str, list[dict], list[str]]:
        """Split reply text into (content without call markup, well-formed calls, errors for malformed ones)."""

    def reply_text(self, tokens: list[int]) -> tuple[str, bool]:
        """Sampled tokens as (their text, end-of-turn token left off and special tokens written out; whether
        the reply ended with it rather than being cut by max_tokens)."""
        ended = self.ends_turn(tokens)
        return self.tokenizer.decode(tokens[:-1] if ended else tokens, skip_special_tokens=False), ended

    def split_reasoning(self, text: str) -> tuple[str | None, str]:
        """Reply text as (its leading `<think>` reasoning or None, the rest)."""
        m = _THINK_SPLIT_RE.match(text)
        return (m.group(1).strip(), text[m.end() :]) if m else (None, text)

    def parse_text(self, text: str, tools: list[dict] | None = None) -> ParsedResponse:
        """Reply text (special tokens written out, end-of-turn token left off) parsed like sampled tokens:
        reasoning, content and tool calls (`tools` as for `parse_response`)."""
        reasoning, rest = self.split_reasoning(text)
        content, calls, errors = self.parse_tool_calls(rest)
        return ParsedResponse(assistant_message(content, calls, reasoning), True, errors)

    def tool_call_prefix(self, name: str | None = None) -> str:
        """Text that starts a tool call (to `name`, or to any function when None), for forcing one; empty
        when the family's calls cannot be forced by a text prefix."""
        return ""


# -- Hermes and R2E-XML tool calls, as text -----------------------------------------------------------
HERMES_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
HERMES_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call>"
)
_THINK_SPLIT_RE = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)
_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_XML_FUNC_RE = re.compile(r"<function\s*=\s*([^>]+)>(.*?)</function>", re.DOTALL)
_XML_PARAM_RE = re.compile(r"<parameter\s*=\s*([^>]+)>(.*?)</parameter>", re.DOTALL)


class TextToolCalls:
    """Tool calls written in a reply's text, for the hand-written families with no tool-call tokens of
    their own (ChatML, role_colon): Hermes `<tool_call>` JSON, or R2E-Gym's `<function=NAME>` text when
    `tool_format` is "xml". Mixed into a `Renderer`."""

    tool_format: str

    def tools_listing(self, tools: list[dict]) -> str:
        """The tool schemas and their call syntax, for the system turn."""
        return xml_tools_text(tools) if self.tool_format == "xml" else hermes_tools_text(tools)

    def with_calls(self, content: str, calls: list[dict]) -> str:
        """A reply's text with its calls written after it."""
        render = xml_call_text if self.tool_format == "xml" else hermes_call_text
        written = "\n".join(render(c) for c in calls)
        return f"{content}\n{written}" if content and written else content or written

    def parse_tool_calls(self, text: str) -> tuple[str, list[dict], list[str]]:
        """Split text into (content without call markup, well-formed calls, errors for malformed ones)."""
        return parse_text_calls(text, self.tool_format)

    def tool_call_prefix(self, name: str | None = None) -> str:
        """The text a call (to `name`, or any) starts with, for forcing one."""
        if self.tool_format == "xml":
            return "<function=" if name is None else f"<function={name}>\n"
        if name is None:
            return '<tool_call>\n{"name": "'
        return '<tool_call>\n{"name": ' + json.dumps(name) + ', "arguments": '


def parse_text_calls(text: str, tool_format: str) -> tuple[str, list[dict], list[str]]:
    """Tool calls written as text (`xml`: R2E-Gym's `<function=NAME>`, else Hermes `<tool_call>` JSON), split
    from the reply as (content, well-formed calls, errors); needs no tokenizer."""
    return parse_xml_calls(text) if tool_format == "xml" else parse_hermes_calls(text)


def assistant_message(content: str, calls: list[dict] | None = None, reasoning: str | None = None) -> Message:
    """A parsed reply as an assistant message; `reasoning_content` and `tool_calls` only when it has them."""
    msg: Message = {"role": "assistant", "content": content}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = calls
    return msg


def hermes_tools_text(tools: list[dict]) -> str:
    """Tool schemas as Qwen2.5/Qwen3 show them in the system turn."""
    return HERMES_TOOLS_INTRO + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + HERMES_TOOLS_OUTRO


def xml_tools_text(tools: list[dict]) -> str:
    """Tool schemas and the `<function=NAME>` call syntax (R2E-Gym's text format)."""
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


def hermes_call_text(call: dict) -> str:
    """One call in Hermes form: `<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`."""
    obj = {"name": call["function"]["name"], "arguments": call_arguments(call)}
    return "<tool_call>\n" + json.dumps(obj, ensure_ascii=False) + "\n</tool_call>"


def xml_call_text(call: dict) -> str:
    """One call in R2E-Gym's form: `<function=NAME>\\n<parameter=K>V</parameter>\\n</function>`."""
    args = call_arguments(call)
    params = args if isinstance(args, dict) else {"input": args}
    body = "".join(
        f"<parameter={k}>{v if isinstance(v, str) else json.dumps(v)}</parameter>\n" for k, v in params.items()
    )
    return f"<function={call['function']['name']}>\n{body}</function>"


def parse_xml_calls(text: str) -> tuple[str, list[dict], list[str]]:
    """`<function=NAME>` blocks out of text: (rest of the text, calls, errors)."""
    calls, errors = [], []
    for m in _XML_FUNC_RE.finditer(text):
        params = {k.strip(): v.strip() for k, v in _XML_PARAM_RE.findall(m.group(2))}
        calls.append(tool_call(m.group(1).strip(), params))
    content = _XML_FUNC_RE.sub("", text)
    if "<function=" in content:
        errors.append("a <function=...> block is not closed with </function>")
    return content.strip(), calls, errors


def call_from_json(raw: str, keys: tuple[str, ...] = ("arguments", "parameters")) -> tuple[dict | None, str | None]:
    """A tool call from a JSON object {"name": str, "arguments"|"parameters": object}: (call, None) or (None, error)."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        return None, f"tool call is not valid JSON ({e.msg} at char {e.pos}): {raw[:200]}"
    return call_from_object(obj, raw, keys)


def call_from_object(
    obj: Any, raw: str, keys: tuple[str, ...] = ("arguments", "parameters")
) -> tuple[dict | None, str | None]:
    """A tool call from a decoded JSON value; see call_from_json."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, f'tool call must be an object {{"name": str, "{keys[0]}": object}}: {raw[:200]}'
    args = next((obj[k] for k in keys if k in obj), {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None, f"arguments of {obj['name']!r} are not a JSON object: {args[:200]}"
    if not isinstance(args, dict):
        return None, f"arguments of {obj['name']!r} must be a JSON object, got {type(args).__name__}"
    return tool_call(obj["name"], args), None


def parse_hermes_calls(text: str) -> tuple[str, list[dict], list[str]]:
    """`<tool_call>` JSON blocks out of text: (rest of the text, calls, errors)."""
    calls, errors = [], []
    for m in _TOOL_CALL_RE.finditer(text):
        call, error = call_from_json(m.group(1))
        if call is not None:
            calls.append(call)
        else:
            errors.append(error)
    content = _TOOL_CALL_RE.sub("", text)
    if "<tool_call>" in content:
        errors.append("a <tool_call> block is not closed with </tool_call>")
        content = content.split("<tool_call>")[0]
    return content.strip(), calls, errors
