"""Remote environments over the Open Reward Standard (ORS), through the `openreward` SDK.

An ORS server exposes tasks in splits, a prompt per task and tools; a session is one
episode, and each tool call may return a reward and a `finished` flag. Here one session is
one token-level `Env`: the server's prompt and tools are rendered with the run's renderer,
each sampled action is parsed for tool calls, the calls go to the server, and the results
come back as tool turns that extend the previous tokens. The episode reward is the
`reward_reduction` (sum/mean/max/min) of the rewards its calls returned, with
`nonterminal_reward` added to them when the episode never finished (turn or token limit).

What is unusual:
- Failures are split by cause. A malformed or unknown tool call is the policy's doing: it
  goes back to the model as an error result. A dead server, a lost session, a tool that
  raised on the server, or a transport error is `InfraFailure`: recorded, left out of the
  group. The SDK retries 429/502/503/504 and connection errors; opening a session is
  retried on top of that (`session_retries`).
- Sessions are always closed: `Env.close()` (which the rollout code calls once, also on
  errors and cancellation), eagerly when the episode ends, and at interpreter exit a
  synchronous `/delete` for any session still registered (Ctrl-C).
- The SDK's aiohttp clients belong to one event loop, so each episode makes and closes its own.
- The OpenReward API key is sent only to OpenReward's hosted service, never to a
  self-hosted `base_url`. The SDK's PyPI update check is turned off (no network at run
  time beyond the servers a user configures).

`upload_rollouts` sends finished ORS trajectories to OpenReward's rollout API
(`OPENREWARD_API_KEY` and `openreward.upload: true`).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import os
import random
import threading
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlparse

import tinker
from pydantic import BaseModel, ConfigDict, Field

from tinkrl.errors import ConfigError, InfraFailure
from tinkrl.rl.types import Action, Env, EnvGroupBuilder, Metrics, RLDataset, StepResult, StopCondition

if TYPE_CHECKING:
    from tinkrl.envs import EnvContext, EnvDatasets

os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")

HOSTED_URL = "https://openreward.ai"
EVAL_SPLIT_NAMES = ("test", "validation", "eval")
LOG_KEY = "openreward.rollout"  # key of the final step's logs holding the transcript (for upload)
_OPEN_TIMEOUT_S = 120.0
_CLOSE_TIMEOUT_S = 15.0


class OpenRewardEnvConfig(BaseModel):
    """Fields under `env:` of a remote ORS environment (`environments: {Owner/Env: {env: {...}}}`)."""

    model_config = ConfigDict(extra="forbid")

    variant: str | None = None
    """Environment on the server: a hosted variant, or a self-hosted server's environment
    (its lower-cased class name). Default for a self-hosted server: the entry's name if the
    server serves it, else the server's only/default environment."""
    max_turns: int = Field(8, ge=1)
    """Assistant turns per episode; an episode that has not finished by then is non-terminal."""
    max_tool_calls_per_turn: int = Field(4, ge=1)
    """Tool calls run per assistant turn; further calls are answered with an error."""
    max_total_tokens: int | None = Field(None, ge=32)
    """Prompt + all turns must fit in this many tokens (None: no limit beyond max_turns)."""
    system_prompt: str | None = None
    """Text put before the tool list in the system turn (default: the model family's)."""
    no_tool_call_message: str = (
        'No tool call found. Call one of the tools with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.'
    )
    """Sent back when a turn has no tool call (environments without a terminal tool)."""
    secrets: dict[str, str | None] = Field(default_factory=dict)
    """Secrets for the environment's sessions; null takes the value of the same-named env var."""
    session_retries: int = Field(2, ge=0)
    """Extra attempts to open a session after a transport failure."""
    call_timeout_s: float = Field(600.0, gt=0)
    """Wall-clock limit of one server request (a tool call included); past it: infra failure."""
    api_key_env: str = "OPENREWARD_API_KEY"
    """Environment variable holding the OpenReward API key (hosted environments only)."""

    def build(self, ctx: EnvContext) -> EnvDatasets:
        return build_datasets(self, ctx)


# ---------------------------------------------------------------------------------------------
# Client: one remote environment, usable from any event loop.


def _is_hosted(base_url: str | None) -> bool:
    if base_url is None:
        return True
    host = urlparse(base_url).hostname or ""
    return host == "openreward.ai" or host.endswith(".openreward.ai")


class ORSClient:
    """How to reach one remote environment: server, environment name/variant, credentials."""

    def __init__(self, name: str, base_url: str | None, variant: str | None, api_key: str | None):
        self.name, self.base_url, self.variant = name, base_url, variant
        # Never hand the OpenReward key to a server the user points us at.
        self.api_key = api_key if _is_hosted(base_url) else ("" if "/" in name else None)

    @property
    def where(self) -> str:
        return self.base_url or HOSTED_URL

    def connect(self) -> tuple[Any, Any]:
        """(SDK environments API, environment handle) bound to the running loop; `await api.aclose()` after.

        The SDK's aiohttp clients belong to the loop they were made in, so every user (an
        episode, a survey at build time) makes its own and closes it: nothing leaks when the
        trainer's loops come and go.
        """
        if self.base_url is None:
            from openreward import AsyncOpenReward

            api = AsyncOpenReward(api_key=self.api_key or "").environments
        else:
            from openreward.api.environments.client import AsyncEnvironmentsAPI

            api = AsyncEnvironmentsAPI(base_url=self.base_url, api_key=self.api_key)  # type: ignore[arg-type]
        return api, api.get(self.name, variant=self.variant, base_url=self.base_url)


def _failure(e: BaseException, what: str) -> InfraFailure:
    """Map an SDK/transport exception to a recorded infrastructure failure."""
    from openreward.api.errors import SessionTerminatedError, ToolFailed, TransportError

    if isinstance(e, InfraFailure):
        return e
    if isinstance(e, ToolFailed):
        mode = "env_tool_raised"
    elif isinstance(e, SessionTerminatedError):
        mode = "env_session_lost"
    elif isinstance(e, (asyncio.TimeoutError, TimeoutError)):
        mode = "env_timeout"
    elif isinstance(e, TransportError) or isinstance(e, (ConnectionError, OSError)):
        mode = "env_unreachable"
    else:
        import aiohttp

        if isinstance(e, aiohttp.ClientResponseError):
            mode = "env_http_error"
        elif isinstance(e, aiohttp.ClientError):
            mode = "env_unreachable"
        else:
            mode = "env_server_error"
    detail = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
    return InfraFailure(f"{what}: {type(e).__name__}: {detail}", failure_mode=mode)


# Sessions opened and not yet closed: sid -> (server url, deployment header, api key).
# At exit, any left (an interrupted run) get a synchronous /delete so servers free them.
_OPEN_SESSIONS: dict[str, tuple[str, str, str | None]] = {}
_OPEN_LOCK = threading.Lock()


def _delete_leftover_sessions() -> None:
    with _OPEN_LOCK:
        left = list(_OPEN_SESSIONS.items())
        _OPEN_SESSIONS.clear()
    for sid, (url, deployment, key) in left:
        for path in ("/delete", "/delete_session"):
            headers = {"X-Session-ID": sid, "X-Deployment": deployment, "Content-Type": "application/json"}
            if key is not None:
                headers["X-API-Key"] = key
            try:
                req = urllib.request.Request(url.rstrip("/") + path, data=b"{}", headers=headers, method="POST")
                urllib.request.urlopen(req, timeout=2).close()
            except Exception:
                pass


atexit.register(_delete_leftover_sessions)


def open_session_count() -> int:
    """Sessions this process opened and has not closed yet (for tests and shutdown checks)."""
    with _OPEN_LOCK:
        return len(_OPEN_SESSIONS)


class ORSSession:
    """One episode's session: opened with retries, closed exactly once whatever happens."""

    def __init__(
        self, client: ORSClient, split: str, index: int, secrets: dict[str, str], retries: int, timeout_s: float
    ):
        self.client, self.split, self.index = client, split, index
        self.secrets, self.retries, self.timeout_s = secrets, retries, timeout_s
        self._session: Any = None
        self._api: Any = None
        self._closed = False

    async def open(self) -> Any:
        last: BaseException | None = None
        self._api, env = self.client.connect()
        for attempt in range(self.retries + 1):
            session = env.session(split=self.split, index=self.index, secrets=self.secrets or None)
            try:
                await asyncio.wait_for(session.__aenter__(), timeout=min(self.timeout_s, _OPEN_TIMEOUT_S))
            except Exception as e:  # the half-made session (sid but no env) is released before retrying
                last = e
                await self._exit(session)
                if not _retryable_open_error(e) or attempt == self.retries:
                    break
                await asyncio.sleep(min(8.0, 0.5 * 2**attempt) * (0.5 + random.random()))
                continue
            self._session = session
            with _OPEN_LOCK:
                _OPEN_SESSIONS[session.sid] = (str(session.base_url), session.deployment or "", session.api_key)
            return session
        assert last is not None
        raise _failure(last, f"opening a session on {self.client.where} ({self.split}[{self.index}])")

    async def call(self, coro_fn, what: str):
        """Run one session request with the per-request time limit; transport problems -> InfraFailure."""
        from openreward.api.errors import ToolCallError

        try:
            return await asyncio.wait_for(coro_fn(self._session), timeout=self.timeout_s)
        except ToolCallError:
            raise
        except Exception as e:
            raise _failure(e, what) from None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        session, self._session = self._session, None
        api, self._api = self._api, None
        try:
            if session is not None and await self._exit(session):
                with _OPEN_LOCK:  # else left for the synchronous delete at exit
                    _OPEN_SESSIONS.pop(session.sid, None)
        finally:
            if api is not None:
                await _shielded(api.aclose())

    @staticmethod
    async def _exit(session: Any) -> bool:
        return await _shielded(session.__aexit__(None, None, None))


async def _shielded(coro) -> bool:
    """Run cleanup to completion (bounded) even if the caller is being cancelled (Ctrl-C, timeout).

    True when it completed. A cancellation that arrives meanwhile is absorbed: this is the
    last thing an episode does.
    """
    task = asyncio.ensure_future(coro)
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout=_CLOSE_TIMEOUT_S)
        return True
    except (asyncio.CancelledError, Exception):
        return False


def _retryable_open_error(e: BaseException) -> bool:
    import aiohttp

    if isinstance(e, aiohttp.ClientResponseError):
        return e.status == 429 or e.status >= 500
    return True  # transport errors, timeouts, SDK retry exhaustion


# ---------------------------------------------------------------------------------------------
# The episode.


def reduce_rewards(
    rewards: Sequence[float], finished: bool, reduction: Literal["sum", "mean", "max", "min"], nonterminal_reward: float
) -> float:
    """The episode reward: tool-call rewards (+ nonterminal_reward if never finished), reduced."""
    values = list(rewards) + ([] if finished else [nonterminal_reward])
    if not values:
        return 0.0
    if reduction == "sum":
        return float(sum(values))
    if reduction == "mean":
        return float(sum(values) / len(values))
    if reduction == "max":
        return float(max(values))
    return float(min(values))


def chat_tool(spec: Any) -> dict:
    """An ORS ToolSpec as a Chat Completions tool (what the renderer shows the model)."""
    from openreward.api.environments.client import sanitize_tool_schema

    params = (
        sanitize_tool_schema(spec.input_schema, "openai") if spec.input_schema else {"type": "object", "properties": {}}
    )
    return {
        "type": "function",
        "function": {"name": spec.name, "description": spec.description or "", "parameters": params},
    }


def blocks_text(blocks: Sequence[Any]) -> str:
    parts = []
    for b in blocks:
        text = getattr(b, "text", None)
        parts.append(text if text is not None else f"[{getattr(b, 'type', 'block')} omitted]")
    return "\n".join(parts)


@dataclass
class RemoteEnvSpec:
    """Everything the episodes of one `environments:` entry share."""

    key: str
    client: ORSClient
    renderer: Any
    cfg: OpenRewardEnvConfig
    reward_reduction: Literal["sum", "mean", "max", "min"] = "sum"
    nonterminal_reward: float = 0.0
    secrets: dict[str, str] = field(default_factory=dict)


class OpenRewardEnv(Env):
    """One ORS session driven as a multi-turn tool-calling episode."""

    def __init__(self, spec: RemoteEnvSpec, split: str, index: int):
        self.spec, self.split, self.index = spec, split, index
        self.session = ORSSession(
            spec.client, split, index, spec.secrets, spec.cfg.session_retries, spec.cfg.call_timeout_s
        )
        self.tokens: list[int] = []
        self.messages: list[dict] = []
        self.tools: list[dict] = []
        self.terminal: Any = None
        self.rewards: list[float] = []
        self.finished = False
        self.turns = self.tool_calls = self.tool_errors = 0

    @property
    def where(self) -> str:
        return f"{self.spec.key} {self.split}[{self.index}]"

    async def initial_observation(self) -> tuple[tinker.ModelInput, StopCondition]:
        await self.session.open()
        messages = await self.session.call(lambda s: s.get_messages(format="openai"), f"{self.where}: prompt")
        specs = await self.session.call(lambda s: s.list_tools(), f"{self.where}: tools")
        self.terminal = await self.session.call(lambda s: s.terminal_tool(), f"{self.where}: tools")
        self.tools = [chat_tool(s) for s in specs]
        system = self.spec.cfg.system_prompt
        if system is not None and not (messages and messages[0].get("role") == "system"):
            messages = [{"role": "system", "content": system}] + list(messages)
        self.messages = [dict(m) for m in messages]
        prompt = self.spec.renderer.build_generation_prompt(self.messages, self.tools or None)
        self.tokens = prompt.to_ints()
        return prompt, self.spec.renderer.stop_sequences()

    def max_tokens(self, default: int) -> int:
        budget = self.spec.cfg.max_total_tokens
        return default if budget is None else max(1, min(default, budget - len(self.tokens)))

    async def _run_tool(self, name: str, args: dict) -> tuple[str, bool]:
        """Call one tool. Returns (result text, whether it was an error the model made)."""
        from openreward.api.errors import ToolCallError

        self.tool_calls += 1
        try:
            out = await self.session.call(lambda s: s.call_tool(name, args), f"{self.where}: tool {name!r}")
        except ToolCallError as e:
            if e.reason == "episode_finished":
                self.finished = True
            self.tool_errors += 1
            return f"Error ({e.reason}): {e.detail}", True
        if out.reward is not None:
            self.rewards.append(float(out.reward))
        if out.finished:
            self.finished = True
        return blocks_text(out.blocks), False

    async def step(self, action: Action, *, stop_reason: str = "stop") -> StepResult:
        renderer, cfg = self.spec.renderer, self.spec.cfg
        parsed = renderer.parse_response(action)
        self.turns += 1
        self.messages.append(parsed.message)
        new_messages: list[dict] = []
        calls = parsed.message.get("tool_calls") or []
        for i, call in enumerate(calls):
            fn = call["function"]
            if self.finished:
                text = "Not run: the episode has already finished."
            elif i >= cfg.max_tool_calls_per_turn:
                text = f"Not run: at most {cfg.max_tool_calls_per_turn} tool calls per turn."
                self.tool_errors += 1
            else:
                text, _ = await self._run_tool(fn["name"], json.loads(fn["arguments"] or "{}"))
            new_messages.append({"role": "tool", "tool_call_id": call["id"], "name": fn["name"], "content": text})
        for err in parsed.tool_call_errors:
            self.tool_errors += 1
            new_messages.append({"role": "tool", "content": f"Error: {err}"})
        if not calls and not parsed.tool_call_errors and not self.finished:
            if self.terminal is not None:  # the plain answer goes to the environment's terminal tool
                text, _ = await self._run_tool(
                    self.terminal.name,
                    {} if self.terminal.arg is None else {self.terminal.arg: parsed.message.get("content") or ""},
                )
                new_messages.append({"role": "tool", "content": text})
            else:
                new_messages.append({"role": "user", "content": cfg.no_tool_call_message})
        self.messages += new_messages

        done = self.finished or self.turns >= cfg.max_turns
        if not done:
            next_tokens = self.tokens + list(action) + renderer.continuation(new_messages, parsed.ended_cleanly)
            if cfg.max_total_tokens is not None and len(next_tokens) + 8 > cfg.max_total_tokens:
                done = True  # no room left for a meaningful next action
            else:
                self.tokens = next_tokens
                return StepResult(0.0, False, tinker.ModelInput.from_ints(next_tokens), renderer.stop_sequences())
        await self.session.close()
        reward = reduce_rewards(self.rewards, self.finished, self.spec.reward_reduction, self.spec.nonterminal_reward)
        metrics: Metrics = {
            "finished": float(self.finished),
            "turns": float(self.turns),
            "tool_calls": float(self.tool_calls),
            "tool_errors": float(self.tool_errors),
            "num_rewards": float(len(self.rewards)),
        }
        record = {
            "env": self.spec.key,
            "name": self.spec.client.name,
            "variant": self.spec.client.variant,
            "split": self.split,
            "index": self.index,
            "messages": self.messages,
            "rewards": self.rewards,
            "reward": reward,
            "finished": self.finished,
        }
        return StepResult(
            reward,
            True,
            tinker.ModelInput.empty(),
            renderer.stop_sequences(),
            metrics=metrics,
            logs={LOG_KEY: json.dumps(record, ensure_ascii=False)},
        )

    async def close(self) -> None:
        await self.session.close()


class OpenRewardGroupBuilder(EnvGroupBuilder):
    """`group_size` sessions on one task of a remote environment."""

    def __init__(
        self,
        spec: RemoteEnvSpec,
        split: str,
        index: int,
        group_size: int,
        temperature: float | None,
        max_failing_rollouts: int,
    ):
        self.spec, self.split, self.index, self.group_size = spec, split, index, group_size
        self.temperature = temperature
        self.max_failing_rollouts = max_failing_rollouts

    async def make_envs(self) -> Sequence[Env]:
        return [OpenRewardEnv(self.spec, self.split, self.index) for _ in range(self.group_size)]

    def logging_tags(self) -> list[str]:
        return [self.spec.key]


class OpenRewardDataset(RLDataset):
    """Batches of groups over a list of (split, task index); later epochs reshuffle when asked to."""

    def __init__(
        self,
        spec: RemoteEnvSpec,
        items: list[tuple[str, int]],
        group_size: int,
        groups_per_batch: int,
        shuffle: bool,
        seed: int,
        temperature: float | None,
        max_failing_rollouts: int,
        wrap: bool = True,
    ):
        if not items:
            raise ConfigError(f"environments.{spec.key}: the selected splits have no tasks")
        self.spec, self.items, self.group_size = spec, items, group_size
        self.groups_per_batch, self.shuffle, self.seed, self.wrap = groups_per_batch, shuffle, seed, wrap
        self.temperature, self.max_failing_rollouts = temperature, max_failing_rollouts
        self._epochs: dict[int, list[tuple[str, int]]] = {}

    def _epoch(self, e: int) -> list[tuple[str, int]]:
        if e not in self._epochs:
            order = list(self.items)
            if self.shuffle and e > 0:  # epoch 0 keeps the order the splits were sampled in
                random.Random(f"{self.seed}/{e}").shuffle(order)
            self._epochs = {e: order}
        return self._epochs[e]

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        n = len(self.items)
        start = index * self.groups_per_batch
        if not self.wrap:
            picks = [self.items[i] for i in range(start, min(n, start + self.groups_per_batch))]
        else:
            picks = [self._epoch(p // n)[p % n] for p in range(start, start + self.groups_per_batch)]
        return [
            OpenRewardGroupBuilder(self.spec, split, idx, self.group_size, self.temperature, self.max_failing_rollouts)
            for split, idx in picks
        ]

    def __len__(self) -> int:
        return max(1, -(-len(self.items) // self.groups_per_batch))


# ---------------------------------------------------------------------------------------------
# Building the datasets of one `environments:` entry.


def _run_sync(coro_factory):
    """Run a coroutine to completion on a fresh loop in a worker thread (safe inside a running loop)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro_factory()).result()


def _list_self_hosted(base_url: str) -> list[str]:
    with urllib.request.urlopen(base_url.rstrip("/") + "/list_environments", timeout=30) as resp:
        return [str(x) for x in json.loads(resp.read())]


def resolve_client(key: str, name: str, base_url: str | None, cfg: OpenRewardEnvConfig) -> ORSClient:
    """The client for an entry, checking that the server answers and serves the environment."""
    api_key = os.environ.get(cfg.api_key_env) or None
    variant = cfg.variant
    if base_url is None:
        if "/" not in name:
            raise ConfigError(
                f"environments.{key}: hosted OpenReward environments are named Owner/Env; "
                f"give base_url for a self-hosted server"
            )
        if not api_key:
            raise ConfigError(
                f"environments.{key}: {cfg.api_key_env} is not set (needed for hosted "
                f"OpenReward environments; a self-hosted server takes base_url)"
            )
    else:
        try:
            served = _list_self_hosted(base_url)
        except Exception as e:
            raise ConfigError(f"environments.{key}: cannot reach the ORS server at {base_url}: {e}") from None
        if variant is None:
            wanted = name.split("/")[-1].lower()
            if wanted in served:
                variant = wanted
            elif len(served) != 1:
                raise ConfigError(
                    f"environments.{key}: the server at {base_url} serves "
                    f"{', '.join(served)}; pick one with env.variant or name"
                )
        elif variant.lower() not in served:
            raise ConfigError(
                f"environments.{key}.env.variant: {variant!r} is not served at {base_url} "
                f"(it serves {', '.join(served)})"
            )
    return ORSClient(name, base_url, variant, api_key)


def build_datasets(cfg: OpenRewardEnvConfig, ctx: EnvContext) -> EnvDatasets:
    from tinkrl.envs import EnvDatasets

    entry = ctx.entry
    name = entry.name or ctx.key
    client = resolve_client(ctx.key, name, entry.base_url, cfg)
    secrets = {}
    for k, v in cfg.secrets.items():
        value = v if v is not None else os.environ.get(k)
        if value is None:
            raise ConfigError(f"environments.{ctx.key}.env.secrets.{k}: null means 'from ${k}', which is not set")
        secrets[k] = value

    async def survey() -> tuple[list[str], dict[str, int]]:
        api, env = client.connect()
        try:
            splits = await env.list_splits()
            counts = {s: await env.num_tasks(s) for s in entry.splits if s in splits}
            return splits, counts
        except Exception as e:
            raise ConfigError(
                f"environments.{ctx.key}: listing {name} at {client.where} failed: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            ) from None
        finally:
            await api.aclose()

    splits, counts = _run_sync(survey)
    missing = [s for s in entry.splits if s not in splits]
    if missing:
        raise ConfigError(
            f"environments.{ctx.key}.splits: {', '.join(missing)} not offered by {name} (it has {', '.join(splits)})"
        )
    spec = RemoteEnvSpec(ctx.key, client, ctx.renderer, cfg, entry.reward_reduction, entry.nonterminal_reward, secrets)

    def pick(split: str, limit: int | None) -> list[tuple[str, int]]:
        sc = entry.splits[split]
        idx = list(range(counts[split]))
        if sc.shuffle:
            random.Random(f"{ctx.seed}/{ctx.key}/{split}").shuffle(idx)
        n = sc.num_samples if sc.num_samples is not None else limit
        return [(split, i) for i in (idx[:n] if n is not None else idx)]

    eval_split = next((s for s in EVAL_SPLIT_NAMES if s in entry.splits), None)
    train_items = [it for s in entry.splits if s != eval_split for it in pick(s, None)]
    if not train_items:
        raise ConfigError(f"environments.{ctx.key}.splits: no training split (only {eval_split!r})")
    shuffle = any(entry.splits[s].shuffle for s in entry.splits if s != eval_split)
    train = OpenRewardDataset(
        spec,
        train_items,
        ctx.group_size,
        ctx.groups_per_batch,
        shuffle,
        ctx.seed,
        entry.temperature,
        entry.max_failing_rollouts,
    )
    test = None
    if eval_split is not None:  # one batch of every eval task, one rollout each (the trainer's eval)
        items = pick(eval_split, ctx.eval_problems)
        test = OpenRewardDataset(spec, items, 1, max(1, len(items)), False, ctx.seed, entry.temperature, 0, wrap=False)
    return EnvDatasets(train=train, test=test)


# ---------------------------------------------------------------------------------------------
# Upload of finished trajectories to OpenReward's rollout API.


def _upload_events(messages: list[dict]) -> list[Any]:
    """OpenAI-style transcript -> the SDK's upload message types (every tool call kept)."""
    from openreward.api.rollouts.serializers.base import (
        AssistantMessage,
        SystemMessage,
        ToolCall,
        ToolResult,
        UserMessage,
    )

    out: list[Any] = []
    for m in messages:
        content = m.get("content") or ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        role = m.get("role")
        if role == "system":
            out.append(SystemMessage(content))
        elif role == "user":
            out.append(UserMessage(content))
        elif role == "assistant":
            if content:
                out.append(AssistantMessage(content))
            for c in m.get("tool_calls") or []:
                out.append(ToolCall(c["function"]["name"], c["function"].get("arguments") or "{}", c.get("id") or ""))
        elif role == "tool":
            out.append(ToolResult(content, m.get("tool_call_id") or ""))
    return out


class RolloutUploader:
    """Sends each finished ORS episode of a step to OpenReward as one rollout of run `run_name`.

    Uploads run on worker threads (the SDK's `create` is a blocking POST) so training does not
    wait; failures are logged and counted, never raised. `close()` waits for what is queued.
    """

    def __init__(
        self,
        run_name: str,
        model_name: str,
        api_key: str | None = None,
        *,
        lora_rank: int | None = None,
        batch_size: int | None = None,
        lr: float | None = None,
    ):
        from openreward import OpenReward
        from openreward.models import RunInfo

        key = api_key or os.environ.get("OPENREWARD_API_KEY")
        if not key:
            raise ConfigError("openreward.upload: OPENREWARD_API_KEY is not set")
        self.run_name = run_name
        info = RunInfo(
            model_name=model_name,
            run_type="train",
            training_stage="rl",
            peft_type="lora",
            peft_rank=lora_rank,
            batch_size=batch_size,
            lr=lr,
            rl_algorithm="grpo",
            framework="tinkrl",
        )
        self.client = OpenReward(api_key=key, run_info=info)
        self.pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="openreward-upload")
        self.futures: list[concurrent.futures.Future] = []
        self.uploaded = self.errors = 0
        self._lock = threading.Lock()

    def submit(self, keyed_groups: Sequence[tuple[str, Any]], step: int) -> int:
        """Queue every ORS trajectory of the step's groups; returns how many were queued."""
        n = 0
        for _, group in keyed_groups:
            for i, traj in enumerate(group.trajectories_G):
                raw = traj.transitions[-1].logs.get(LOG_KEY) if traj.transitions else None
                if raw:
                    self.futures.append(self.pool.submit(self._upload, json.loads(raw), step, i))
                    n += 1
        return n

    def _upload(self, record: dict, step: int, i: int) -> None:
        try:
            name = record["name"]
            rollout = self.client.rollout.create(
                self.run_name,
                rollout_name=f"{record['env']}-{record['split']}-{record['index']}-step{step}-r{i}",
                environment=name if "/" in name else None,
                variant=record.get("variant"),
                split=record["split"],
                metadata={
                    "step": step,
                    "env": record["env"],
                    "task_index": record["index"],
                    "rollout": i,
                    "reward": record["reward"],
                    "tool_rewards": record["rewards"],
                    "finished": record["finished"],
                },
            )
            events = _upload_events(record["messages"])
            for j, ev in enumerate(events):
                last = j == len(events) - 1
                rollout.log(ev, reward=record["reward"] if last else None, is_finished=last and record["finished"])
            with self._lock:
                self.uploaded += 1
        except Exception as e:  # an upload problem must never stop training
            import logging

            logging.getLogger(__name__).warning("rollout upload failed: %s: %s", type(e).__name__, e)
            with self._lock:
                self.errors += 1

    def metrics(self) -> Metrics:
        with self._lock:
            return {"openreward/uploaded": float(self.uploaded), "openreward/upload_errors": float(self.errors)}

    def close(self) -> None:
        """Wait for queued uploads and flush the SDK's background sender."""
        self.pool.shutdown(wait=True)
        self.client.rollout.close()


_UPLOADER: RolloutUploader | None = None


def upload_rollouts(
    keyed_groups: Sequence[tuple[str, Any]], *, step: int, run_name: str, model_name: str, **run_info: Any
) -> Metrics:
    """The trainer's per-step hook (`openreward.upload: true`): queue the step's ORS trajectories.

    `keyed_groups` is the step's [(env key, TrajectoryGroup)]; `run_info` may carry lora_rank,
    batch_size, lr. Returns cumulative upload metrics. Call `close_uploads()` when the run ends.
    """
    global _UPLOADER
    if _UPLOADER is None or _UPLOADER.run_name != run_name:
        _UPLOADER = RolloutUploader(run_name, model_name, **run_info)
    _UPLOADER.submit(keyed_groups, step)
    return _UPLOADER.metrics()


def close_uploads() -> Metrics:
    """Flush and stop the uploader (no-op when nothing was uploaded); returns the final counts."""
    global _UPLOADER
    if _UPLOADER is None:
        return {}
    uploader, _UPLOADER = _UPLOADER, None
    uploader.close()
    return uploader.metrics()
