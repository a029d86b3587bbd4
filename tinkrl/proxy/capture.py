"""Token capture: what the OpenAI-compatible server sampled, kept per rollout, turned into Trajectories.

Every completion the server makes is recorded as a `CapturedCall`: the exact prompt tokens
the sampler saw and, per choice, the sampled tokens, their logprobs and the stop reason.
Calls are grouped by rollout id; the trainer pops a rollout's calls when its agent is done.

Agents send the conversation back as text: tool-call arguments re-serialised, reasoning
stripped, content trimmed. Re-tokenising that text would not reproduce the sampled tokens,
so consecutive calls would not extend each other and a 20-turn episode would become 20
datums with re-encoded, never-sampled history. So the store also remembers, for every
assistant message the server returned, the exact tokens behind it (`AssistantTokens`),
keyed by a normalised form of the message (`assistant_key`); the prompt builder splices
those tokens back in. `MergeStats` reports how often that worked.

Chains: a call "extends" an earlier one when its prompt starts with that call's prompt +
sampled tokens. `captured_to_trajectory` lays calls out chain by chain, so the trainer's
datum builder (`tinkrl.rl.data`) merges every chain into one datum.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import tinker

from tinkrl.rl.types import Trajectory, Transition

_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)
# Assistant messages remembered without a rollout id (bounded; oldest dropped first).
GLOBAL_ASSISTANT_ENTRIES = 20_000
# Rollouts kept before the oldest unfetched one is dropped (a fleet that never fetches).
MAX_ROLLOUTS = 10_000


@dataclass
class CapturedSample:
    """One sampled choice: its tokens and logprobs, the sampler's stop reason and the client's finish reason."""

    tokens: list[int]  # exactly as sampled (may end with the stop token)
    logprobs: list[float]  # the policy's own logprob of each sampled token
    stop_reason: str  # the sampler's: "stop" | "length"
    finish_reason: str  # what the client was told: "stop" | "length" | "tool_calls"


@dataclass
class CapturedCall:
    """One completion the server made: the prompt tokens the sampler saw, each choice sampled, the policy version."""

    call_id: str
    endpoint: str  # "chat" | "completions"
    prompt_tokens: list[int]  # what the sampler saw, forced prefix (tool_choice) included
    samples: list[CapturedSample]
    policy_version: int  # bumps on every weight swap; tells the trainer how stale a call is
    created: float = field(default_factory=time.time)
    assistant_messages: int = 0  # assistant messages in the request's history
    spliced_messages: int = 0  # of those, mapped back to the exact tokens sampled

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.call_id,
            "endpoint": self.endpoint,
            "prompt_tokens": self.prompt_tokens,
            "samples": [
                {
                    "tokens": s.tokens,
                    "logprobs": s.logprobs,
                    "stop_reason": s.stop_reason,
                    "finish_reason": s.finish_reason,
                }
                for s in self.samples
            ],
            "policy_version": self.policy_version,
            "created": self.created,
            "assistant_messages": self.assistant_messages,
            "spliced_messages": self.spliced_messages,
        }


@dataclass
class AssistantTokens:
    """The tokens behind one returned assistant message: everything after the generation header."""

    tokens: list[int]  # forced prefix (if any) + sampled tokens
    ended_cleanly: bool  # ends with the end-of-turn token (else the renderer closes the turn)


@dataclass
class MergeStats:
    """How a rollout's calls merged into datums, and how much assistant history was spliced back to sampled tokens."""

    calls: int = 0
    merged_calls: int = 0  # calls whose prompt extends an earlier call's prompt + sampled tokens
    chains: int = 0  # datums the trajectory becomes
    assistant_messages: int = 0
    spliced_messages: int = 0

    @property
    def merge_rate(self) -> float:
        """Fraction of calls after the first that extend an earlier one (1.0 when < 2 calls)."""
        return self.merged_calls / (self.calls - 1) if self.calls > 1 else 1.0

    @property
    def splice_rate(self) -> float:
        """Fraction of assistant history messages mapped back to their sampled tokens."""
        return self.spliced_messages / self.assistant_messages if self.assistant_messages else 1.0

    def __add__(self, other: MergeStats) -> MergeStats:
        return MergeStats(
            self.calls + other.calls,
            self.merged_calls + other.merged_calls,
            self.chains + other.chains,
            self.assistant_messages + other.assistant_messages,
            self.spliced_messages + other.spliced_messages,
        )

    def to_metrics(self, prefix: str = "proxy/") -> dict[str, float]:
        return {
            f"{prefix}calls": float(self.calls),
            f"{prefix}merge_rate": self.merge_rate,
            f"{prefix}datums": float(self.chains),
            f"{prefix}splice_rate": self.splice_rate,
        }


# -- normalising assistant messages ------------------------------------------------------------
def message_text(content: Any) -> str:
    """The text of a message's content: the string, or the text parts joined."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _canonical_arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments.strip()
    return arguments


def assistant_key(message: dict[str, Any]) -> str:
    """A form of an assistant message that survives what clients do to it on the way back.

    Reasoning (`<think>…</think>`, `reasoning_content`) is dropped, whitespace around content
    trimmed, tool-call arguments compared as parsed JSON; tool-call ids are ignored (some
    clients renumber them).
    """
    content = _THINK_RE.sub("", message_text(message.get("content"))).strip()
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        calls.append([fn.get("name"), _canonical_arguments(fn.get("arguments", "{}"))])
    return json.dumps([content, calls], sort_keys=True, ensure_ascii=False)


# -- the store -----------------------------------------------------------------------------------
class CaptureStore:
    """Captured calls per rollout and the assistant-message → tokens map. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: OrderedDict[str, list[CapturedCall]] = OrderedDict()
        self._assistant: dict[str, dict[str, AssistantTokens]] = {}
        self._global: OrderedDict[str, AssistantTokens] = OrderedDict()

    def record(
        self, rollout_id: str | None, call: CapturedCall, returned: list[tuple[dict[str, Any], AssistantTokens]]
    ) -> None:
        """Remember a call (under its rollout, if any) and the tokens behind each returned message."""
        with self._lock:
            for message, tokens in returned:
                key = assistant_key(message)
                self._global[key] = tokens
                self._global.move_to_end(key)
                if rollout_id is not None:
                    self._assistant.setdefault(rollout_id, {})[key] = tokens
            while len(self._global) > GLOBAL_ASSISTANT_ENTRIES:
                self._global.popitem(last=False)
            if rollout_id is None:
                return
            self._calls.setdefault(rollout_id, []).append(call)
            while len(self._calls) > MAX_ROLLOUTS:
                old, _ = self._calls.popitem(last=False)
                self._assistant.pop(old, None)

    def lookup(self, rollout_id: str | None, message: dict[str, Any]) -> AssistantTokens | None:
        key = assistant_key(message)
        with self._lock:
            if rollout_id is not None:
                hit = self._assistant.get(rollout_id, {}).get(key)
                if hit is not None:
                    return hit
            return self._global.get(key)

    def calls(self, rollout_id: str) -> list[CapturedCall]:
        with self._lock:
            return list(self._calls.get(rollout_id, []))

    def pop(self, rollout_id: str) -> list[CapturedCall]:
        """The rollout's calls, forgotten by the store (the trainer owns them now)."""
        with self._lock:
            self._assistant.pop(rollout_id, None)
            return self._calls.pop(rollout_id, [])


# -- calls -> trajectory ---------------------------------------------------------------------------
def _extends(prompt: list[int], prefix: list[int]) -> bool:
    return len(prompt) >= len(prefix) and prompt[: len(prefix)] == prefix


def chain_calls(calls: list[CapturedCall]) -> tuple[list[list[tuple[CapturedCall, int]]], MergeStats]:
    """Group calls into chains of (call, chosen sample) where each prompt extends the previous.

    A call joins the most recent chain whose last call's prompt + one of its samples is a
    prefix of the new prompt; that sample becomes the chosen one (the agent continued with
    it). Otherwise the call starts a new chain. Chain ends keep sample 0.
    """
    chains: list[list[tuple[CapturedCall, int]]] = []
    stats = MergeStats(calls=len(calls))
    for call in calls:
        stats.assistant_messages += call.assistant_messages
        stats.spliced_messages += call.spliced_messages
        placed = False
        for chain in reversed(chains):
            tail = chain[-1][0]
            for s, sample in enumerate(tail.samples):
                if _extends(call.prompt_tokens, tail.prompt_tokens + sample.tokens):
                    chain[-1] = (tail, s)
                    chain.append((call, 0))
                    placed = True
                    break
            if placed:
                break
        if placed:
            stats.merged_calls += 1
        else:
            chains.append([(call, 0)])
    stats.chains = len(chains)
    return chains, stats


def captured_to_trajectory(calls: list[CapturedCall], reward: float) -> tuple[Trajectory, MergeStats]:
    """One Trajectory from a rollout's calls: transitions chain by chain, the reward on the last."""
    chains, stats = chain_calls(calls)
    transitions: list[Transition] = []
    for chain in chains:
        for call, s in chain:
            sample = call.samples[s]
            transitions.append(
                Transition(
                    ob=tinker.ModelInput.from_ints(call.prompt_tokens),
                    ac_tokens=list(sample.tokens),
                    ac_logprobs=list(sample.logprobs),
                    reward=0.0,
                    episode_done=False,
                    stop_reason=sample.stop_reason,
                    metrics={"policy_version": float(call.policy_version)},
                )
            )
    if transitions:
        transitions[-1].reward = reward
        transitions[-1].episode_done = True
    return Trajectory(transitions=transitions), stats
