"""Remote environments over the Open Reward Standard (ORS), through the `openreward` SDK.

An ORS server exposes tasks in splits, a prompt per task and tools; a session is one
episode, and each tool call may return a reward and a `finished` flag. Here one session is
one `ORSToolSession` (a message session) driven by the token bridge
(`tinkrl.agents.episode.SessionEnv`): the server's prompt and tools are rendered with the run's
renderer, each sampled action is parsed for tool calls, the calls go to the server, and the
results come back as tool turns that extend the previous tokens. The episode reward is the
`reward_reduction` (sum/mean/max/min) of the rewards its calls returned, with
`nonterminal_reward` added to them when the episode never finished (turn or token limit).

What is unusual:
- Failures are split by cause. A malformed or unknown tool call is the policy's doing: it
  goes back to the model as an error result. A dead server, a lost session, a tool that
  raised on the server, or a transport error is `InfraFailure` (see `client.py`): recorded,
  left out of the group; opening a session is retried (`session_retries`).
- Sessions are always closed: `Env.close()` (which the rollout code calls once, also on
  errors and cancellation), eagerly when the episode ends, and at interpreter exit (`client.py`).
- The episode's transcript goes into the final step's logs under `LOG_KEY`, which is what
  `upload.py` sends to OpenReward's rollout API (`openreward.upload: true`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import random
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tinkrl.agents.episode import Reply, SessionEnv
from tinkrl.envs.ors.client import ORSClient, ORSSession
from tinkrl.envs.ors.config import OpenRewardEnvConfig
from tinkrl.envs.ors.upload import LOG_KEY, RolloutUploader
from tinkrl.errors import ConfigError
from tinkrl.rl.types import Env, EnvDatasets, EnvGroupBuilder, Metrics, RLDataset

if TYPE_CHECKING:
    from tinkrl.envs import EnvContext

EVAL_SPLIT_NAMES = ("test", "validation", "eval")


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
    """The text of ORS content blocks, one per line; a block without text shows as a placeholder."""
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


class ORSToolSession:
    """One ORS session as a `MessageSession`: the server's prompt and tools, each reply's tool calls
    run on the server, the episode reward reduced from the rewards the calls returned."""

    action_format = "tools"

    def __init__(self, spec: RemoteEnvSpec, split: str, index: int):
        self.spec, self.split, self.index = spec, split, index
        self.session = ORSSession(
            spec.client, split, index, spec.secrets, spec.cfg.session_retries, spec.cfg.call_timeout_s
        )
        self.max_context_tokens = spec.cfg.max_total_tokens
        self.messages: list[dict] = []
        self.tools: list[dict] | None = None
        self.terminal: Any = None
        self.rewards: list[float] = []
        self.finished = self.done = False
        self.turns = self.tool_calls = self.tool_errors = 0
        self.reward = 0.0

    @property
    def label(self) -> str:
        return f"{self.spec.key} {self.split}[{self.index}]"

    async def start(self) -> list[dict]:
        await self.session.open()
        messages = await self.session.call(lambda s: s.get_messages(format="openai"), f"{self.label}: prompt")
        specs = await self.session.call(lambda s: s.list_tools(), f"{self.label}: tools")
        self.terminal = await self.session.call(lambda s: s.terminal_tool(), f"{self.label}: tools")
        self.tools = [chat_tool(s) for s in specs] or None
        system = self.spec.cfg.system_prompt
        if system is not None and not (messages and messages[0].get("role") == "system"):
            messages = [{"role": "system", "content": system}] + list(messages)
        self.messages = [dict(m) for m in messages]
        return list(self.messages)

    async def _run_tool(self, name: str, args: dict) -> str:
        """Call one tool; its result text (a tool error the model made comes back as text)."""
        from openreward.api.errors import ToolCallError

        self.tool_calls += 1
        try:
            out = await self.session.call(lambda s: s.call_tool(name, args), f"{self.label}: tool {name!r}")
        except ToolCallError as e:
            if e.reason == "episode_finished":
                self.finished = True
            self.tool_errors += 1
            return f"Error ({e.reason}): {e.detail}"
        if out.reward is not None:
            self.rewards.append(float(out.reward))
        if out.finished:
            self.finished = True
        return blocks_text(out.blocks)

    async def act(self, reply: Reply) -> tuple[list[dict], bool]:
        cfg = self.spec.cfg
        self.turns += 1
        self.messages.append(reply.message)
        observations: list[dict] = []
        for i, call in enumerate(reply.calls):
            fn = call["function"]
            if self.finished:
                text = "Not run: the episode has already finished."
            elif i >= cfg.max_tool_calls_per_turn:
                text = f"Not run: at most {cfg.max_tool_calls_per_turn} tool calls per turn."
                self.tool_errors += 1
            else:
                text = await self._run_tool(fn["name"], json.loads(fn["arguments"] or "{}"))
            observations.append({"role": "tool", "tool_call_id": call["id"], "name": fn["name"], "content": text})
        for err in reply.errors:
            self.tool_errors += 1
            observations.append({"role": "tool", "content": f"Error: {err}"})
        if not reply.calls and not reply.errors and not self.finished:
            if self.terminal is not None:  # the plain answer goes to the environment's terminal tool
                content = reply.message.get("content") or ""
                args = {} if self.terminal.arg is None else {self.terminal.arg: content}
                observations.append({"role": "tool", "content": await self._run_tool(self.terminal.name, args)})
            else:
                observations.append({"role": "user", "content": cfg.no_tool_call_message})
        self.messages += observations
        self.done = self.finished or self.turns >= cfg.max_turns
        return observations, self.done

    def overflow(self) -> None:
        """No room left for a meaningful next action: the episode ends, its rewards reduced as they stand."""
        self.done = True

    async def finish(self) -> float:
        await self.session.close()
        self.reward = reduce_rewards(
            self.rewards, self.finished, self.spec.reward_reduction, self.spec.nonterminal_reward
        )
        return self.reward

    def metrics(self) -> Metrics:
        return {
            "finished": float(self.finished),
            "turns": float(self.turns),
            "tool_calls": float(self.tool_calls),
            "tool_errors": float(self.tool_errors),
            "num_rewards": float(len(self.rewards)),
        }

    def logs(self) -> dict[str, Any]:
        """The episode's record under `LOG_KEY`, which `upload.py` sends to OpenReward's rollout API."""
        record = {
            "env": self.spec.key,
            "name": self.spec.client.name,
            "variant": self.spec.client.variant,
            "split": self.split,
            "index": self.index,
            "messages": self.messages,
            "rewards": self.rewards,
            "reward": self.reward,
            "finished": self.finished,
        }
        return {LOG_KEY: json.dumps(record, ensure_ascii=False)}

    async def close(self) -> None:
        await self.session.close()


class OpenRewardEnv(SessionEnv):
    """One ORS session driven as a multi-turn tool-calling episode: the token bridge over an `ORSToolSession`."""

    def __init__(self, spec: RemoteEnvSpec, split: str, index: int):
        super().__init__(ORSToolSession(spec, split, index), spec.renderer)


class OpenRewardGroupBuilder(EnvGroupBuilder):
    """`group_size` sessions on one task of a remote environment."""

    def __init__(
        self,
        spec: RemoteEnvSpec,
        split: str,
        index: int,
        group_size: int,
    ):
        self.spec, self.split, self.index, self.group_size = spec, split, index, group_size

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
        wrap: bool = True,
    ):
        if not items:
            raise ConfigError(f"environments.{spec.key}: the selected splits have no tasks")
        self.spec, self.items, self.group_size = spec, items, group_size
        self.groups_per_batch, self.shuffle, self.seed, self.wrap = groups_per_batch, shuffle, seed, wrap
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
        return [OpenRewardGroupBuilder(self.spec, split, idx, self.group_size) for split, idx in picks]

    def __len__(self) -> int:
        return max(1, -(-len(self.items) // self.groups_per_batch))


# ---------------------------------------------------------------------------------------------
# Building the datasets of one `environments:` entry.


def _run_sync(coro_factory):
    """Run a coroutine to completion on a fresh loop in a worker thread (safe inside a running loop)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro_factory()).result()


def _list_self_hosted(base_url: str, server_key: str | None) -> list[str]:
    request = urllib.request.Request(base_url.rstrip("/") + "/list_environments")
    if server_key:
        request.add_header("X-API-Key", server_key)
    with urllib.request.urlopen(request, timeout=30) as resp:
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
        server_key = os.environ.get(cfg.server_key_env) if cfg.server_key_env else None
        if cfg.server_key_env and not server_key:
            raise ConfigError(f"environments.{key}.env.server_key_env: ${cfg.server_key_env} is not set")
        try:
            served = _list_self_hosted(base_url, server_key)
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
        return ORSClient(name, base_url, variant, api_key, server_key)
    return ORSClient(name, base_url, variant, api_key)


def build_datasets(cfg: OpenRewardEnvConfig, ctx: EnvContext) -> EnvDatasets:
    """The datasets of one `environments:` entry served over ORS (the server is asked for its splits
    now, so a wrong name or split fails before training), and, with `openreward.upload`, the hooks
    that upload each step's episodes."""
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
    train = OpenRewardDataset(spec, train_items, ctx.group_size, ctx.groups_per_batch, shuffle, ctx.seed)
    test = None
    if eval_split is not None:  # one batch of every eval task, one rollout each (the trainer's eval)
        items = pick(eval_split, ctx.eval_problems)
        test = OpenRewardDataset(spec, items, 1, max(1, len(items)), False, ctx.seed, wrap=False)
    run = ctx.train_config
    if run is None or not run.openreward.upload:
        return EnvDatasets(train=train, test=test)
    uploader = RolloutUploader(
        run.openreward.run_name or run.run_name or ctx.run_dir.name,
        run.model_name,
        lora_rank=run.lora_rank,
        batch_size=run.batch_size,
        lr=run.learning_rate,
    )

    def upload(step: int, groups: list) -> Metrics:
        uploader.submit(groups, step)
        return uploader.metrics()

    return EnvDatasets(train=train, test=test, on_step=upload, close=uploader.close)
