"""ChatML (`<|im_start|>role\\n…<|im_end|>\\n`) for SmolLM2, Qwen2.5 and any ChatML model, written by
hand (tml-renderers has no ChatML family of its own; Qwen3 and later are tml-renderers' `tml.py`).

Tools as Qwen2.5 renders them (Hermes): schemas in the system turn inside `<tools></tools>`, calls
as `<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`, results as one user turn of
`<tool_response>` blocks. SmolLM2's own template has no tool syntax; it gets this one. `xml` tool
calls (R2E-Gym's `<function=NAME>` text) work for every ChatML model. Past turns render as they
were sampled, so an episode extends token for token.
"""

from __future__ import annotations

from .base import Message, Renderer, TextToolCalls, content_text


class ChatMLRenderer(TextToolCalls, Renderer):
    """ChatML chat format (SmolLM2, Qwen2.5, any ChatML model) with Hermes or R2E-XML tool calls."""

    def __init__(
        self, tokenizer, default_system: str | None = None, tool_format: str = "hermes", *, name: str = "chatml"
    ):
        self.name = name
        super().__init__(tokenizer, default_system, tool_format)
        self.im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if self.im_end is None or self.im_end == tokenizer.unk_token_id:
            raise ValueError("tokenizer has no <|im_end|> token: not a ChatML model")

    # -- encoding ---------------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def end_of_turn_tokens(self) -> list[int]:
        return [self.im_end]

    def turn_separator(self) -> list[int]:
        return self._encode("\n")

    def message_text(self, msg: Message) -> tuple[str, str]:
        """(role used in the template, body text) for one message."""
        role, content = msg["role"], content_text(msg.get("content"))
        if role == "assistant" and msg.get("tool_calls"):
            content = self.with_calls(content, msg["tool_calls"])
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
                body = (body + "\n\n" if body else "") + self.tools_listing(tools)
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

    def render_messages_no_system(self, messages: list[Message]) -> list[int]:
        return self._turns(list(messages))

    def action_tokens(self, message: Message) -> list[int]:
        return self._encode(self.message_text(message)[1]) + [self.im_end]
