"""Every family tml-renderers ships (Qwen3, Qwen3.5/3.6, Qwen3.8, DeepSeek V3.1 and V4.1, GLM-5.3,
gpt-oss, Kimi K2/K2.5/K2.6, Nemotron 3, TML v0) behind tinkrl's `Renderer` interface.

tml-renderers is Thinking Machines' own implementation, tokenizer included (built into the
package, so these renderers work offline). It renders a whole conversation
(`render_for_completion`), lays out what a model samples for a turn (`render_for_sft`, the
weighted tokens) and parses sampled tokens back into messages; this adapter turns those into the
interface's pieces:

- `prompt_tokens`: the family's rendering, token for token.
- `action_tokens`: what the model samples for an assistant message (end-of-turn token included),
  ended as the family ends a turn that something follows: GLM-5.3 ends it with the next turn's
  role token (`<|observation|>` before tool results, `<|user|>` before a user turn), as
  tml-renderers' whole-conversation layout and tinker-cookbook do, not with the `<|endoftext|>`
  that ends a conversation.
- `next_prompt`: the family's rendering of the episode so far. Where the family keeps past turns
  as they were sampled this extends the previous prompt + action token for token; where it
  rewrites them (past thinking dropped or emptied, harmony's past analysis dropped), or where the
  action ended with a stop token the family does not write there (GLM's `<|endoftext|>` before a
  next turn), it does not, and the trajectory trains as several datums (`rl/data.py`), as in
  tinker-cookbook.
- `parse_response(tokens, tools)`: tml-renderers' parser for a prompt declaring the episode's
  tools (made once per tool set), so arguments keep the types their schemas declare where the
  format writes them as text; what it still reads otherwise (Nemotron 3 reads a string "5" as 5,
  Qwen3.5 and Nemotron 3 write a bool as `True`) is typed by the schemas here.
- `continuation`: the tokens that follow a sampled action for new messages, by difference: an
  anchor conversation (a user turn and an assistant turn carrying the same tool-call ids) rendered
  with the new messages, less the anchor alone.

What tinkrl adds to tml-renderers 0.2.1, each for a name whose format it has no switch for:
- DeepSeek V3.1 declares no tools there: the V3.1 chat template's tool section is written into
  the system turn, and the end-of-sentence token tml-renderers puts between an assistant's text
  and its tool calls is taken out (the model, and the template, write the calls right after it).
- `gpt_oss_no_sysprompt` is `GptOss` without harmony's system message (model identity, date,
  reasoning effort), as tinker-cookbook renders it; with tools, that message keeps only its line
  about the tool channel.
- `deepseekv4_1_preserve_thinking` is `DeepSeekV41` with past assistant turns written as they
  were sampled, thinking included (`TmlBuild.keep_history`).
- `kimi_k26*` are `KimiK25` on Kimi K2.6's tokenizer, whose ids are K2.5's (as tinker-cookbook builds them).

Only the family's own tool-call format is offered (tool_format "hermes" means that); "xml" is refused.
"""

from __future__ import annotations

import functools
import json
import os
import re
from typing import Any

from .base import Message, ParsedResponse, Renderer, assistant_message, call_arguments, content_text, tool_call
from .bundled_tokenizers import BundledTokenizer
from .names import RendererSpec, TmlBuild

_PROBE = "·"  # a one-token message text for the probe conversations
_DEEPSEEK_TOOLS_INTRO = "\n\n## Tools\nYou have access to the following tools:\n"
_DEEPSEEK_TOOLS_OUTRO = (
    "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>"
    "{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\n"
    "Where:\n\n"
    "- `tool_call_name` must be an exact match to one of the available tools\n"
    "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
    "- For multiple tool calls, chain them directly without separators or spaces\n"
)
_TOOL_CHANNEL_LINE = "Calls to these tools must go to the commentary channel: 'functions'."


def deepseek_tools_text(tools: list[dict]) -> str:
    """The tool section DeepSeek V3.1's chat template appends to the system prompt."""
    text = _DEEPSEEK_TOOLS_INTRO
    for t in tools:
        fn = t.get("function", t)
        text += (
            f"\n### {fn['name']}\nDescription: {fn.get('description', '')}\n\n"
            f"Parameters: {json.dumps(fn.get('parameters', {}), ensure_ascii=False)}\n"
        )
    return text + _DEEPSEEK_TOOLS_OUTRO


@functools.cache
def build_tml(build: TmlBuild) -> Any:
    """The tml-renderers renderer object a `TmlBuild` describes (made once; it keeps no state between calls)."""
    try:
        from tml_renderers import renderers, tokenizers, v0
    except ImportError as e:  # a compiled extension: it needs torch>=2.10 beside it
        raise ImportError(f"this renderer needs tml-renderers (pip install tml-renderers): {e}") from e
    if build.cls == "v0":
        return v0.Renderer(tokenizers.O200kBaseChatTokenizer())
    cls = getattr(renderers, build.cls)
    return (getattr(cls, build.method) if build.method else cls)(**dict(build.kwargs))


@functools.cache
def bundled_tokenizer_of(build: TmlBuild) -> BundledTokenizer:
    """The tokenizer tml-renderers bundles for a `TmlBuild`, behind the HF tokenizer methods (made once)."""
    if build.tokenizer:
        from tml_renderers import tokenizers

        return BundledTokenizer(getattr(tokenizers, build.tokenizer)())
    return BundledTokenizer(build_tml(build).tokenizer)


def _flat(spans) -> list[int]:
    return [t for s in spans for t in s.span.tokens]


class TmlRenderer(Renderer):
    """A tml-renderers family behind the Renderer interface (see the module docstring)."""

    tool_formats = ("hermes",)

    def __init__(self, spec: RendererSpec, model_tokenizer: Any = None, tool_format: str = "hermes"):
        if spec.tml is None:
            raise ValueError(f"renderer {spec.name!r} is not a tml-renderers family")
        self.name = spec.name
        self.spec = spec
        self._build = spec.tml
        self._tml = build_tml(spec.tml)
        super().__init__(bundled_tokenizer_of(spec.tml), None, tool_format)
        from tml_renderers import chat

        self._chat = chat
        self._stops = [int(t) for t in self._tml.stop()]
        self._calls_begin = (
            self.tokenizer.specials.get("<｜tool▁calls▁begin｜>") if spec.tml.cls == "DeepSeekV31" else None
        )
        if model_tokenizer is not None:
            self._check_tokenizer(model_tokenizer)
        probe = self._render([{"role": "user", "content": _PROBE}])
        mark = self.tokenizer.encode(_PROBE)
        at = max(i for i in range(len(probe)) if probe[i : i + len(mark)] == mark) + len(mark)
        self._user_close = probe[at]  # what ends a user turn: a past turn's end where no stop token ends it
        ends = [i for i, t in enumerate(probe) if t in self._stops or t == self._user_close]
        self._header = probe[ends[-1] + 1 :] if ends else []
        self._parsers: dict[str, Any] = {}  # parse_response's parser, by the tools its prompt declares
        self._followed_end = {calls: self._end_when_followed(calls) for calls in (False, True)}
        self._close = self._turn_closing([{"role": "user", "content": _PROBE}])[0]
        self._call_markers = self._tool_call_markers()
        self._untyped_arguments = self._writes_arguments_as_text()
        self.keeps_history = self._writes_past_turns_as_sampled()

    def _probe_reply(self) -> Message:
        """A plain reply, with reasoning where the variant thinks."""
        reply: Message = {"role": "assistant", "content": _PROBE}
        if self.spec.thinks:
            reply["reasoning_content"] = _PROBE
        return reply

    def _end_when_followed(self, calls: bool) -> int | None:
        """The stop token that ends a reply (with tool calls, or plain) when a turn follows it, where tml-renderers
        writes another there than at a conversation's end (GLM: the next turn's role token, `<|observation|>`
        before tool results and `<|user|>` before a user turn, for `<|endoftext|>`); None where it does not."""
        user = {"role": "user", "content": _PROBE}
        reply = self._probe_reply()
        follower: Message = user
        if calls:
            reply = {**reply, "tool_calls": [tool_call("ls", {}, "call_0")]}
            follower = {"role": "tool", "tool_call_id": "call_0", "name": "ls", "content": _PROBE}
        last = self._sft_action([user, reply])
        example = self._sft_example([user, reply, follower])
        if example is None:
            return None
        tokens, weights = _flat(example.input_token_spans), list(example.per_token_loss_weight_unshifted)
        first = next((i for i, w in enumerate(weights) if w), len(weights))
        end = next((i for i in range(first, len(weights)) if not weights[i]), len(weights))
        run = tokens[first:end]  # the reply's weighted tokens, its end included
        if run and run[:-1] == last[:-1] and run[-1] in self._stops and run[-1] != last[-1]:
            return run[-1]
        return None

    def _writes_arguments_as_text(self) -> bool:
        """Whether the family writes tool-call arguments as untyped text (key/value formats: a string "5" and
        the number 5 read the same), so parsing needs the tools' schemas to give them their types."""
        call = tool_call("ls", {"path": "5"}, "call_0")
        parsed = self.parse_response(self.action_tokens({"role": "assistant", "content": "", "tool_calls": [call]}))
        got = parsed.message.get("tool_calls") or [call]
        return json.loads(got[0]["function"]["arguments"]) != {"path": "5"}

    def _writes_past_turns_as_sampled(self) -> bool:
        """Whether a reply (with its thinking, where the variant thinks) stays in the next prompt as sampled
        once a user turn follows it, its closing token aside (GLM closes a past turn with the next role
        token): then an episode's prompts extend token for token."""
        user, reply = {"role": "user", "content": _PROBE}, self._probe_reply()
        body = self.action_tokens(reply)[:-1]
        prompt = self.prompt_tokens([user])
        return self.prompt_tokens([user, reply, user])[: len(prompt) + len(body)] == prompt + body

    def _tool_call_markers(self) -> list[str]:
        """The special tokens (as text) a tool call is written with and a plain reply is not."""
        call = self.action_tokens({"role": "assistant", "content": "", "tool_calls": [tool_call("ls", {})]})
        plain = set(self.action_tokens(self._probe_reply()))
        special = set(self.tokenizer.all_special_ids) - plain - set(self._stops)
        return sorted({self.tokenizer.decode([t]) for t in call if t in special})

    def _check_tokenizer(self, model_tokenizer: Any) -> None:
        """The model's own tokenizer must give the family's stop tokens their ids (else it is another family)."""
        for tid in self._stops:
            text = self.tokenizer.decode([tid])
            got = model_tokenizer.convert_tokens_to_ids(text)
            if got != tid:
                raise ValueError(
                    f"the model's tokenizer does not match the {self.name} renderer: {text!r} is token {got} "
                    f"there, {tid} in the format (choose the model's renderer with renderer=NAME)"
                )

    # -- turn ends ----------------------------------------------------------------------------------
    def end_of_turn_tokens(self) -> list[int]:
        return list(self._stops)

    def close_turn_tokens(self) -> list[int]:
        return list(self._close)

    def generation_header(self) -> list[int]:
        return list(self._header)

    # -- messages to tml-renderers --------------------------------------------------------------------
    def _tml_message(self, m: Message) -> dict:
        role = m["role"]
        text = content_text(m.get("content"))
        if role == "assistant":
            out: dict[str, Any] = {"role": "assistant"}
            reasoning = m.get("reasoning_content")
            if reasoning:
                out["content"] = [{"type": "thinking", "thinking": reasoning}] + (
                    [{"type": "text", "text": text}] if text else []
                )
            else:
                out["content"] = text
            if m.get("tool_calls"):
                out["tool_calls"] = [
                    {
                        "id": c.get("id") or f"call_{i}",
                        "type": "function",
                        "function": {"name": c["function"]["name"], "arguments": _arguments_json(c)},
                    }
                    for i, c in enumerate(m["tool_calls"])
                ]
            return out
        if role == "tool":
            if not m.get("tool_call_id"):  # a result no call asked for (e.g. a malformed-call notice)
                return {"role": "user", "content": text}
            out = {"role": "tool", "tool_call_id": m["tool_call_id"], "content": text}
            if m.get("name"):
                out["name"] = m["name"]
            return out
        return {"role": role, "content": text}

    def _to_tml(self, messages: list[Message], tools: list[dict] | None) -> list[dict]:
        msgs = list(messages)
        system = None
        if msgs and msgs[0]["role"] == "system":
            system = content_text(msgs.pop(0).get("content"))
        declare = []
        if tools and self._calls_begin is not None:  # DeepSeek V3.1: the template's tool section
            system = (system or "") + deepseek_tools_text(tools)
        elif tools:
            declare = [{"role": "tool_declare", "content": json.dumps(tools, ensure_ascii=False)}]
        head = [] if system is None else [{"role": "system", "content": system}]
        return head + declare + [self._tml_message(m) for m in msgs]

    def _render(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """tml-renderers' completion prompt for OpenAI-style messages, with the adjustments of the module docstring."""
        oss = self._chat.OpenAIMessage.from_oss_messages(self._to_tml(messages, tools))
        tokens = self._without_eos_before_calls(_flat(self._tml.render_for_completion(oss)[0]))
        if self._build.no_system:
            tokens = self._without_system_message(tokens)
        return tokens

    def _without_system_message(self, tokens: list[int]) -> list[int]:
        """Harmony tokens with the leading system message dropped (its tool-channel line kept, when tools)."""
        t = self.tokenizer.specials
        start, end = t["<|start|>"], t["<|end|>"]
        head = [start] + self.tokenizer.encode("system") + [t["<|message|>"]]
        if tokens[: len(head)] != head:
            return tokens
        stop = tokens.index(end)
        body = self.tokenizer.decode(tokens[len(head) : stop])
        kept = head + self.tokenizer.encode(_TOOL_CHANNEL_LINE) + [end] if _TOOL_CHANNEL_LINE in body else []
        return kept + tokens[stop + 1 :]

    # -- rendering ----------------------------------------------------------------------------------
    def prompt_tokens(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        if self._build.keep_history and any(m["role"] == "assistant" for m in messages):
            return self._render_as_sampled(list(messages), tools)
        return self._render(messages, tools)

    def _render_as_sampled(self, messages: list[Message], tools: list[dict] | None) -> list[int]:
        """The prompt with every past assistant turn written as sampled (thinking kept): the first turns as
        the family renders them, then each assistant turn's action tokens and the continuation after it."""
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        tokens = self._render(messages[:first], tools)
        i = first
        while i < len(messages):
            j = next((k for k in range(i + 1, len(messages)) if messages[k]["role"] == "assistant"), len(messages))
            tokens += self.action_tokens(messages[i]) + self._turn_closing(messages[i + 1 : j])[1]
            i = j
        return tokens

    def next_prompt(
        self,
        prompt: list[int],
        action: list[int],
        history: list[Message],
        new_messages: list[Message],
        tools: list[dict] | None = None,
        action_ended_cleanly: bool = True,
    ) -> list[int]:
        """The family's rendering of the episode so far when it extends `prompt + action`, or when the family
        rewrites past turns, or when the action ended with a stop token the family does not write there (GLM
        writes the next turn's role token where the model may sample `<|endoftext|>`): then a new datum
        starts. Otherwise a family that keeps past turns as sampled keeps the sampled tokens (re-tokenised
        text, or a reply a client sent back without its thinking, would differ): `prompt + action +
        continuation`."""
        rendered = self.prompt_tokens(list(history) + list(new_messages), tools)
        sampled = list(prompt) + list(action)
        if rendered[: len(sampled)] == sampled or not self.keeps_history:
            return rendered
        close, after = self._turn_closing(new_messages)
        if action_ended_cleanly and close[-1:] != action[-1:] and close[-1] in self._stops:
            return rendered
        return sampled + (after if action_ended_cleanly else close + after)

    def _strip_header(self, tokens: list[int]) -> list[int]:
        n = len(self._header)
        return tokens[:-n] if n and tokens[-n:] == self._header else tokens

    def render_messages(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        return self._strip_header(self.prompt_tokens(messages, tools))

    def _anchor(self, new_messages: list[Message]) -> list[Message]:
        """A user turn and an assistant turn that the new messages may follow (carrying their tool-call ids)."""
        calls = []
        for m in new_messages:
            if m["role"] != "tool":
                break
            if m.get("tool_call_id"):
                calls.append(tool_call(m.get("name") or "tool", {}, m["tool_call_id"]))
        assistant: Message = {"role": "assistant", "content": "" if calls else _PROBE}
        if calls:
            assistant["tool_calls"] = calls
        return [{"role": "user", "content": _PROBE}, assistant]

    def _turn_closing(self, new_messages: list[Message]) -> tuple[list[int], list[int]]:
        """(the token that ends the anchor's assistant turn in the family's rendering, the tokens after it) for
        the anchor followed by `new_messages`. Where history writes the turn otherwise than sampled, that is
        the first stop token after the point where the two differ (or, where none is, the token that closes a
        user turn: harmony's `<|end|>` for a sampled `<|return|>`)."""
        anchor = self._anchor(new_messages)
        prompt = self._render(anchor[:1])
        action = self.action_tokens(anchor[1])
        full = self._render(anchor + list(new_messages))
        if full[: len(prompt) + len(action)] == prompt + action:  # the family keeps the turn as sampled
            return action[-1:], full[len(prompt) + len(action) :]
        start = len(os.path.commonprefix([full, prompt + action]))
        ends = [i for i in range(start, len(full)) if full[i] in self._stops]
        ends = ends or [i for i in range(start, len(full)) if full[i] == self._user_close]
        if not ends:
            raise RuntimeError(f"tml-renderers' {self.name}: no end of the assistant turn in {full[start:]}")
        j = ends[0]
        return [full[j]], full[j + 1 :]

    def render_messages_no_system(self, messages: list[Message]) -> list[int]:
        return self._strip_header(self._turn_closing(messages)[1])

    def continuation(self, new_messages: list[Message], action_ended_cleanly: bool = True) -> list[int]:
        close, after = self._turn_closing(new_messages)
        return after if action_ended_cleanly else close + after

    def action_tokens(self, message: Message) -> list[int]:
        """What the model samples for `message` after a user turn: tml-renderers' trained (weighted) tokens, ended
        as the family ends a turn that something follows (tool results after calls, else a user turn)."""
        action = self._sft_action([{"role": "user", "content": _PROBE}, message])
        end = self._followed_end[bool(message.get("tool_calls"))]
        return action if end is None else action[:-1] + [end]

    def _sft_example(self, messages: list[Message]) -> Any:
        """tml-renderers' last training example for `messages` (None when it makes none: Kimi K2 makes none for a
        conversation that does not end with an assistant turn)."""
        oss = self._chat.OpenAIMessage.from_oss_messages(self._to_tml(messages, None))
        examples = self._tml.render_for_sft(oss)
        return examples[-1] if examples else None

    def _sft_action(self, messages: list[Message]) -> list[int]:
        """The weighted tokens of tml-renderers' layout of `messages`, which end with the assistant turn."""
        example = self._sft_example(messages)
        tokens = _flat(example.input_token_spans)
        weights = list(example.per_token_loss_weight_unshifted)
        first = weights.index(next(w for w in weights if w))
        return self._without_eos_before_calls(tokens[first:])

    def _without_eos_before_calls(self, tokens: list[int]) -> list[int]:
        """DeepSeek V3.1's tokens without the end-of-sentence token tml-renderers writes before tool calls
        (unchanged for other families)."""
        if self._calls_begin is None:
            return tokens
        eos = self._stops[0]
        return [t for i, t in enumerate(tokens) if not (t == eos and tokens[i + 1 : i + 2] == [self._calls_begin])]

    # -- parsing ------------------------------------------------------------------------------------
    def _parser(self, tools: list[dict] | None) -> Any:
        """tml-renderers' parser for replies to a prompt declaring `tools`: it reads a call's arguments by their
        schemas where the format writes them as text (a string "5" stays a string). Made once per tool set
        (a parser keeps no state between replies)."""
        key = json.dumps(tools, sort_keys=True) if tools else ""
        if key not in self._parsers:
            if len(self._parsers) >= 64:
                self._parsers.clear()
            oss = self._chat.OpenAIMessage.from_oss_messages(self._to_tml([{"role": "user", "content": _PROBE}], tools))
            self._parsers[key] = self._tml.render_for_completion(oss)[1]
        return self._parsers[key]

    def parse_response(self, tokens: list[int], tools: list[dict] | None = None) -> ParsedResponse:
        tokens = list(tokens)
        ended = self.ends_turn(tokens)
        try:
            parsed = self._parser(tools).parse_tokens(tokens)
        except ValueError as e:
            text, _ = self.reply_text(tokens)
            if not ended:  # cut by max_tokens: unfinished, not malformed
                return ParsedResponse({"role": "assistant", "content": text}, False)
            detail = " | ".join(line.strip() for line in str(e).splitlines() if line.strip())[:300]
            return ParsedResponse(
                {"role": "assistant", "content": text}, True, [f"could not parse the reply: {detail}"]
            )
        oss = self._chat.OpenAIMessage.to_oss_messages(self._chat.OpenAIMessage.from_messages(parsed))
        texts, thoughts, calls = [], [], []
        for m in oss:
            content = m.get("content")
            for part in content if isinstance(content, list) else [{"type": "text", "text": content or ""}]:
                if part.get("type") == "thinking":
                    thoughts.append(part.get("thinking", ""))
                elif part.get("type") == "text":
                    texts.append(part.get("text", ""))
            for c in m.get("tool_calls") or []:
                calls.append(tool_call(c["function"]["name"], c["function"].get("arguments") or "{}", c.get("id")))
        reasoning = "".join(thoughts) if thoughts else None
        if calls and tools and self._untyped_arguments:
            calls = self._typed_calls(calls, tools, tokens, reasoning)
        errors = [] if calls else self._unread_calls(tokens, reasoning)
        return ParsedResponse(assistant_message("".join(texts).strip(), calls, reasoning), ended, errors)

    def _typed_calls(
        self, calls: list[dict], tools: list[dict], tokens: list[int], reasoning: str | None
    ) -> list[dict]:
        """Calls whose arguments have the JSON types their schemas declare, where the parser left one as it read
        the text (Nemotron 3 reads a string "5" as 5; Qwen3.5 and Nemotron 3 write a bool as `True` and null as
        `None`, as their chat templates do): a string takes the text the reply wrote for it."""
        text = self._text_outside_reasoning(tokens, reasoning)
        written = _written_arguments(text)
        out = []
        for i, call in enumerate(calls):
            name, args = call["function"]["name"], call_arguments(call)
            raw = written[i][1] if i < len(written) and written[i][0] == name else {}
            types = _declared_types(tools, name)
            if isinstance(args, dict) and types:
                args = {k: _typed(v, types.get(k, []), raw.get(k)) for k, v in args.items()}
                call = tool_call(name, args, call["id"])
            out.append(call)
        return out

    def _unread_calls(self, tokens: list[int], reasoning: str | None) -> list[str]:
        """An error when a reply without a well-formed call still writes tool-call markup outside its
        reasoning (the parser let the broken call through as text, or dropped it)."""
        text = self._text_outside_reasoning(tokens, reasoning)
        found = [m for m in self._call_markers if m in text]
        if not found:
            return []
        return [f"the reply writes a tool call ({found[0]}) that is not well formed: {text.strip()[:200]}"]

    def _text_outside_reasoning(self, tokens: list[int], reasoning: str | None) -> str:
        """The reply's text with its reasoning (the first time it appears) taken out."""
        text, _ = self.reply_text(tokens)
        return text.replace(reasoning, "", 1) if reasoning else text

    def parse_text(self, text: str, tools: list[dict] | None = None) -> ParsedResponse:
        """Reply text (special tokens written out) parsed as the family's tokens would be."""
        return self.parse_response(self.tokenizer.encode(text) + self._stops[:1], tools)

    def parse_tool_calls(self, text: str, tools: list[dict] | None = None) -> tuple[str, list[dict], list[str]]:
        parsed = self.parse_text(text, tools)
        return parsed.message["content"], parsed.message.get("tool_calls", []), parsed.tool_call_errors

    def split_reasoning(self, text: str) -> tuple[str | None, str]:
        parsed = self.parse_text(text)
        return parsed.message.get("reasoning_content"), parsed.message["content"]


# a call's arguments as key/value formats write them: Qwen3.5/3.8 and Nemotron 3, and GLM-5.3
_CALL_BLOCK_RE = re.compile(r"<function=([^>\n]+)>(.*?)</function>|<tool_call>([^<\s]+)(.*?)</tool_call>", re.DOTALL)
_PARAMETER_RE = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_ARG_PAIR_RE = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _written_arguments(text: str) -> list[tuple[str, dict[str, str]]]:
    """Each call a reply writes in a key/value format, in order: (its name, each argument's text as written)."""
    out = []
    for m in _CALL_BLOCK_RE.finditer(text):
        name, body = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
        pairs = _PARAMETER_RE.findall(body) or _ARG_PAIR_RE.findall(body)
        out.append((name.strip(), {k.strip(): v for k, v in pairs}))
    return out


def _declared_types(tools: list[dict], name: str) -> dict[str, list[str]]:
    """The JSON types the schema of tool `name` declares for each of its arguments (those that declare one)."""
    for tool in tools:
        fn = tool.get("function", tool)
        if fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties") or {}
            declared = {k: v.get("type") for k, v in props.items() if isinstance(v, dict)}
            return {k: kind if isinstance(kind, list) else [kind] for k, kind in declared.items() if kind}
    return {}


def _is_json_type(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    kinds = {"string": str, "boolean": bool, "object": dict, "array": list, "null": type(None)}
    return name in kinds and isinstance(value, kinds[name])


def _typed(value: Any, types: list[str], written: str | None) -> Any:
    """`value` as the first of `types` its text reads as (unchanged when it has one of them already, or reads
    as none): a key/value format writes every argument as text, so only the schema tells "5" from 5."""
    if not types or any(_is_json_type(value, t) for t in types):
        return value
    text = written if written is not None else value if isinstance(value, str) else json.dumps(value)
    for t in types:
        if t == "string":
            return text
        if t == "boolean" and text.strip().lower() in ("true", "false"):  # Python's `True` as JSON's `true`
            return text.strip().lower() == "true"
        if t == "null" and text.strip() in ("null", "None"):
            return None
        try:
            read = json.loads(text)
        except ValueError:
            continue
        if _is_json_type(read, t):
            return read
    return value


def _arguments_json(call: dict) -> str:
    args = call["function"].get("arguments", "{}")
    return args if isinstance(args, str) else json.dumps(args)
