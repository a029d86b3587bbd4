"""One agent turn, written once: sampled tokens in, the session's observations and the next prompt out.

A session (`MessageSession`: a task in a sandbox, an ORS environment's tools) speaks chat messages:
it opens with the first messages, acts on one parsed assistant reply at a time, and is graded at the
end. `SessionEnv` is the one bridge between such a session and tokens. Each turn it:

1. parses the sampled tokens with the renderer in the episode's action format (`parse_reply`: JSON
   tool calls in the renderer's own format, or one ```bash block), chosen once per episode;
2. hands the `Reply` to the session, which runs its calls and answers with observation messages;
3. lays out the next prompt with `renderer.next_prompt`: the previous prompt + action, token for
   token, with the rendered observations where the family keeps its past turns as sampled, the
   family's own rendering of the conversation where it rewrites them;
4. ends the episode when the session says so or when the next prompt leaves no room to act.

Training and `tinkrl eval` with a sampling client use it as an `Env` (the rollout loop samples and
calls `step`); a harness agent (Harbor, terminal-bench) samples itself and calls `turn`, which never
grades. The OpenAI-endpoint driver talks to the same sessions with messages, without tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import tinker

from tinkrl.agents.shell_actions import parse_shell_reply
from tinkrl.errors import InfraFailure
from tinkrl.rl.types import Action, Env, Metrics, StepResult, StopCondition

Message = dict[str, Any]
MIN_ACTION_TOKENS = 16  # a next prompt that leaves less room than this overflows the context


@dataclass
class Reply:
    """One assistant turn as a session acts on it.

    `transcript` is the turn as the transcript keeps it (the text as sampled); `message` the turn as the
    renderer parsed it (what later prompts render; the transcript message when nothing parsed it);
    `calls` its well-formed tool calls (OpenAI-style), `errors` one line per malformed one, `notes`
    further lines for the model."""

    transcript: Message
    calls: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    truncated: bool = False
    sampled_tokens: int = 0
    message: Message = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.message = self.message or self.transcript

    @property
    def text(self) -> str:
        """The reply's text as the transcript keeps it."""
        return str(self.transcript.get("content") or "")


def shell_reply(text: str, truncated: bool = False, sampled_tokens: int = 0, visible: str | None = None) -> Reply:
    """A reply in the shell action format; commands are read from `visible` (the text without its
    reasoning), by default all of it."""
    calls, errors, notes = parse_shell_reply(text if visible is None else visible)
    return Reply({"role": "assistant", "content": text}, calls, errors, notes, truncated, sampled_tokens)


def parse_reply(renderer: Any, action: Action, tools: list[dict] | None, action_format: str) -> Reply:
    """The sampled `action` as a Reply in `action_format` ("tools" or "shell"), parsed by the renderer."""
    action = list(action)
    parsed = renderer.parse_response(action, tools)
    ended = parsed.ended_cleanly
    if action_format == "shell":
        text, _ = renderer.reply_text(action)
        _, visible = renderer.split_reasoning(text)
        reply = shell_reply(text, not ended, len(action), visible)
        reply.message = {k: v for k, v in parsed.message.items() if k != "tool_calls"}
        return reply
    raw = renderer.tokenizer.decode(action[:-1] if ended else action, skip_special_tokens=False)
    calls = parsed.message.get("tool_calls") or []
    errors = list(parsed.tool_call_errors)
    return Reply({"role": "assistant", "content": raw}, calls, errors, [], not ended, len(action), parsed.message)


class MessageSession(Protocol):
    """An episode on chat messages, as `SessionEnv` drives it."""

    label: str  # names the episode in errors, e.g. "task hello-file"
    action_format: str  # "tools" | "shell"
    max_context_tokens: int | None  # prompt + turns must fit (None: no bound)

    @property
    def tools(self) -> list[dict] | None: ...

    @property
    def done(self) -> bool: ...

    async def start(self) -> list[Message]:
        """Open the episode; the first messages (system, user)."""

    async def act(self, reply: Reply) -> tuple[list[Message], bool]:
        """Act on one reply: the observation messages, and whether the episode ended."""

    def overflow(self) -> None:
        """The next prompt does not fit the context: the episode ends."""

    async def finish(self) -> float:
        """Grade the ended episode: its reward."""

    def metrics(self) -> Metrics: ...

    def logs(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


@dataclass
class TurnResult:
    """What one turn gave: the parsed reply, the session's observations, and whether the episode ended."""

    reply: Reply
    observations: list[Message]
    done: bool


class SessionEnv(Env):
    """A `MessageSession` driven by sampled tokens; each observation is the renderer's `next_prompt`."""

    def __init__(self, session: MessageSession, renderer: Any, max_tokens_per_turn: int | None = None):
        self.session, self.renderer, self.max_tokens_per_turn = session, renderer, max_tokens_per_turn
        self.tokens: list[int] = []  # the current prompt
        self.history: list[Message] = []  # the conversation it renders: replies as parsed, observations
        self.stop: StopCondition = renderer.stop_sequences()

    def fits(self, tokens: list[int]) -> bool:
        """Whether `tokens` leave room for an action in the session's context."""
        bound = self.session.max_context_tokens
        return bound is None or len(tokens) + MIN_ACTION_TOKENS <= bound

    async def begin(self) -> list[int]:
        """Start the session; the first prompt's tokens."""
        messages = await self.session.start()
        self.history = list(messages)
        self.tokens = self.renderer.build_generation_prompt(messages, self.session.tools).to_ints()
        return self.tokens

    async def initial_observation(self) -> tuple[tinker.ModelInput, StopCondition]:
        tokens = await self.begin()
        if not self.fits(tokens):
            raise InfraFailure(
                f"{self.session.label}: the first prompt ({len(tokens)} tokens) does not "
                f"fit max_context_tokens={self.session.max_context_tokens}",
                "context_too_small",
            )
        return tinker.ModelInput.from_ints(tokens), self.stop

    def max_tokens(self, default: int) -> int:
        bound = self.session.max_context_tokens
        wanted = self.max_tokens_per_turn or default
        return wanted if bound is None else max(1, min(wanted, bound - len(self.tokens)))

    async def turn(self, action: Action) -> TurnResult:
        """Parse `action`, let the session act on it, and lay out the next prompt (`self.tokens`); the
        episode ends when the session ends it or the next prompt leaves no room. Never grades."""
        action = list(action)
        reply = parse_reply(self.renderer, action, self.session.tools, self.session.action_format)
        observations, done = await self.session.act(reply)
        if not done:
            self.history.append(reply.message)
            nxt = self.renderer.next_prompt(
                self.tokens, action, self.history, observations, self.session.tools, not reply.truncated
            )
            self.history += observations
            if self.fits(nxt):
                self.tokens = nxt
            else:
                self.session.overflow()
                done = True
        return TurnResult(reply, observations, done)

    async def step(self, action: Action, *, stop_reason: str = "stop") -> StepResult:
        result = await self.turn(action)
        if not result.done:
            return StepResult(0.0, False, tinker.ModelInput.from_ints(self.tokens), self.stop, metrics={}, logs={})
        reward = await self.session.finish()
        metrics, logs = self.session.metrics(), self.session.logs()
        return StepResult(reward, True, tinker.ModelInput.empty(), self.stop, metrics=metrics, logs=logs)

    async def close(self) -> None:
        await self.session.close()
