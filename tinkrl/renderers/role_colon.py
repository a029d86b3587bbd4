"""`role_colon`: the plain text format tinker-cookbook recommends for base models, written by hand
(tml-renderers has none):

    <BOS>System: {system}\\n\\nUser: {question}\\n\\nAssistant: {reply}\\n\\nUser: ...

Each turn is `Role:` then ` {content}\\n\\n`, each piece tokenized on its own, as the cookbook does;
the prompt ends with `Assistant:`. A reply ends where the model writes `\\n\\nUser:` (the sampler's
stop string), so the next user turn's `User:` is the end of the sampled action and the next prompt
goes on with that turn's content. A base model may also stop with its end-of-sequence token: that
reply is finished too, and the next prompt is the conversation rendered afresh (a new datum).

Tools are tinkrl's addition (the cookbook's role_colon has none): their schemas and the call syntax
(Hermes `<tool_call>` JSON, or R2E-Gym's `<function=NAME>` text with tool_format "xml") go into the
system turn, calls are read from the reply text, and results come back as the next user turn.
"""

from __future__ import annotations

from .base import Message, ParsedResponse, Renderer, TextToolCalls, assistant_message, content_text

STOP = "\n\nUser:"
_PREFIX, _SUFFIX = " ", "\n\n"


class RoleColonRenderer(TextToolCalls, Renderer):
    """`User:` / `Assistant:` text turns for base models (see the module docstring)."""

    name = "role_colon"

    def __init__(self, tokenizer, default_system: str | None = None, tool_format: str = "hermes"):
        super().__init__(tokenizer, default_system, tool_format)
        bos = getattr(tokenizer, "bos_token", None)
        self._bos = self._encode(bos) if bos else []
        self._eos = getattr(tokenizer, "eos_token_id", None)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    # -- turn ends ----------------------------------------------------------------------------------
    def end_of_turn_tokens(self) -> list[int]:
        """The end-of-sequence token, the one end of a reply that is a token (the other is the text `STOP`)."""
        return [self._eos] if self._eos is not None else []

    def stop_sequences(self) -> list[str]:
        return [STOP]

    def stop_strings(self) -> list[str]:
        return [STOP]

    def close_turn_tokens(self) -> list[int]:
        return self._encode(STOP)

    def _stopped(self, tokens: list[int]) -> bool:
        """Whether sampled tokens end with the stop string."""
        return self.tokenizer.decode(tokens[-8:], skip_special_tokens=False).endswith(STOP)

    def ends_turn(self, tokens: list[int]) -> bool:
        return bool(tokens) and (self._stopped(tokens) or tokens[-1] in self.end_of_turn_tokens())

    def after_action(self, ended_cleanly: bool = True) -> list[int]:
        return [] if ended_cleanly else self.close_turn_tokens()

    # -- rendering ----------------------------------------------------------------------------------
    def _body(self, msg: Message) -> str:
        content = content_text(msg.get("content"))
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            content = self.with_calls(content, msg["tool_calls"])
        if msg["role"] == "tool":
            content = f"<tool_response>\n{content}\n</tool_response>"
        return _PREFIX + content + _SUFFIX

    def _header(self, msg: Message) -> list[int]:
        role = "user" if msg["role"] == "tool" else msg["role"]
        return self._encode(role.capitalize() + ":")

    def render_messages(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        msgs = list(messages)
        if (not msgs or msgs[0]["role"] != "system") and (self.default_system is not None or tools):
            msgs.insert(0, {"role": "system", "content": self.default_system or ""})
        if tools:
            system = content_text(msgs[0].get("content"))
            msgs[0] = {"role": "system", "content": (system + "\n\n" if system else "") + self.tools_listing(tools)}
        return self._bos + self.render_messages_no_system(msgs)

    def render_messages_no_system(self, messages: list[Message]) -> list[int]:
        return [t for m in messages for t in self._header(m) + self._encode(self._body(m))]

    def generation_header(self) -> list[int]:
        return self._encode("Assistant:")

    def action_tokens(self, message: Message) -> list[int]:
        return self._encode(self._body(message)) + self._encode("User:")

    def continuation(self, new_messages: list[Message], action_ended_cleanly: bool = True) -> list[int]:
        """After a reply: its `\\n\\nUser:` (closed here when the reply was cut), the first new message's
        content (its `User:` is that close), the other messages as whole turns, and `Assistant:`."""
        if not new_messages:
            return self.after_action(action_ended_cleanly) + self.generation_header()
        first, rest = new_messages[0], list(new_messages[1:])
        return (
            self.after_action(action_ended_cleanly)
            + self._encode(self._body(first))
            + self.render_messages_no_system(rest)
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
        """Extends `prompt + action` unless the reply ended with the end-of-sequence token, after which
        the conversation is rendered afresh (see the module docstring)."""
        if action and action[-1] in self.end_of_turn_tokens():
            return self.prompt_tokens(list(history) + list(new_messages), tools)
        return list(prompt) + list(action) + self.continuation(new_messages, action_ended_cleanly)

    # -- parsing ------------------------------------------------------------------------------------
    def reply_text(self, tokens: list[int]) -> tuple[str, bool]:
        ended = self.ends_turn(tokens)
        if tokens and tokens[-1] in self.end_of_turn_tokens():
            tokens = tokens[:-1]
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        return text.split(STOP)[0], ended

    def parse_response(self, tokens: list[int], tools: list[dict] | None = None) -> ParsedResponse:
        text, ended = self.reply_text(list(tokens))
        content, calls, errors = self.parse_tool_calls(text.removeprefix(_PREFIX).removesuffix(_SUFFIX))
        return ParsedResponse(assistant_message(content, calls), ended, errors)
