"""A Tinker checkpoint acting as an agent in someone else's harness, turn by turn, on tokens.

`CheckpointPolicy` samples a checkpoint (`tinker://...` on the hosted service or a local `tinkrl serve
tinker`, or a base model) through the official Tinker SDK. `run_episode` drives one
`tinkrl.agents.session.TaskSession` with it through the training env's own turn
(`tinkrl.agents.episode.SessionEnv.turn`): the same parsing in tinkrl's action formats (`shell`: one
```bash block per turn, `DONE` to finish; `tools`: the renderer's tool calls, their arguments typed by
the episode's tool schemas), the same next prompts, the actions run in whatever `Sandbox` the harness
provides. Every turn's prompt tokens, sampled tokens and logprobs are recorded
in the training record (`tinkrl.rl.types.Trajectory`); `episode_record` is its file layout.

Runs without torch: the tokenizer is a `transformers` tokenizer read from disk (`load_tokenizer`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import tinker
from pydantic import ValidationError

from tinkrl.agents.episode import SessionEnv
from tinkrl.agents.limits import EpisodeLimits
from tinkrl.agents.session import TaskSession
from tinkrl.backends import SessionStatus, exit_status, finish_session, run_metadata
from tinkrl.rl.types import Trajectory, Transition
from tinkrl.sandbox.base import Sandbox, SandboxProvider, SandboxSpec
from tinkrl.taskdirs.model import Task

ACTION_FORMATS = ("shell", "tools")


class PolicyError(ValueError):
    """A bad agent argument (model, checkpoint, renderer, action format), said in one line."""


def load_tokenizer(model_name: str, tokenizer: str | None = None) -> Any:
    """The model's tokenizer without torch: `tokenizer` (a directory or hub id) when given, else the
    model's files on this machine (tinkrl's model cache, a model directory, the HF cache), else a
    download of the tokenizer files from the Hugging Face hub."""
    from transformers import AutoTokenizer

    from tinkrl.local.model_files import (
        DEFAULT_MODEL,
        TINY_ARCHS,
        find_local_model,
        has_tokenizer,
        hf_cache_snapshot,
        tinkrl_model_dir,
    )

    if tokenizer:
        return AutoTokenizer.from_pretrained(tokenizer)
    name = DEFAULT_MODEL if model_name in TINY_ARCHS else model_name
    for candidate in (find_local_model(name), tinkrl_model_dir(name), hf_cache_snapshot(name, weights=False)):
        if candidate is not None and candidate.is_dir() and has_tokenizer(candidate):
            return AutoTokenizer.from_pretrained(str(candidate))
    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as e:
        raise PolicyError(
            f"no tokenizer for {model_name!r} on this machine and none could be downloaded ({type(e).__name__}); "
            "run the model once with tinkrl (e.g. `tinkrl serve tinker --model NAME`) or pass tokenizer=DIR"
        ) from None


class CheckpointPolicy:
    """A Tinker sampling client for `checkpoint_path` (or the base `model_name`), with tinkrl's renderer.

    Its client opens a Tinker SDK session on first use; `close(status)`, or leaving a `with` / `async
    with` block around an episode, finishes it with the episode's outcome (bounded wait,
    `tinkrl.backends.finish_session`). A later sample opens a new session."""

    def __init__(
        self,
        model_name: str,
        checkpoint_path: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        renderer: str | None = None,
        tokenizer: str | None = None,
        temperature: float = 1.0,
        max_tokens_per_turn: int = 512,
        action_format: str = "shell",
        tool_format: str = "hermes",
    ):
        if not model_name:
            raise PolicyError("model_name is required (the checkpoint's base model, e.g. Qwen/Qwen3-8B)")
        if checkpoint_path is not None and not checkpoint_path.startswith("tinker://"):
            raise PolicyError(f"checkpoint_path must be a tinker:// path, got {checkpoint_path!r}")
        if action_format not in ACTION_FORMATS:
            raise PolicyError(f"action_format must be one of {', '.join(ACTION_FORMATS)}, got {action_format!r}")
        self.model_name, self.checkpoint_path = model_name, checkpoint_path
        self.base_url = (base_url or os.environ.get("TINKER_BASE_URL") or "").rstrip("/") or None
        self.api_key = api_key or os.environ.get("TINKER_API_KEY")
        if not self.api_key:
            raise PolicyError("no Tinker API key: set TINKER_API_KEY (any tml-… key for a local `tinkrl serve tinker`)")
        self.temperature, self.max_tokens_per_turn = float(temperature), int(max_tokens_per_turn)
        self.action_format = action_format
        from tinkrl.renderers import get_renderer

        try:
            self.renderer = get_renderer(load_tokenizer(model_name, tokenizer), model_name, tool_format, renderer)
        except ValueError as e:
            raise PolicyError(str(e)) from None
        self._service: Any = None
        self._client: Any = None

    def trained_settings(self) -> dict[str, str]:
        """What the training run that saved `checkpoint_path` recorded for its readers (`user_metadata`:
        the action format and turn cap it trained with); {} for a base model or when the service cannot
        say. Blocking; asked through the SDK's RestClient, which opens no session, from a thread of its
        own, so a harness building its agent on an event loop gets no warning from the SDK."""
        if not self.checkpoint_path:
            return {}
        import tinker

        def rest_client() -> Any:
            return tinker.RestClient(base_url=self.base_url, api_key=self.api_key)

        with ThreadPoolExecutor(1) as pool:  # off any event loop the caller runs
            return pool.submit(run_metadata, rest_client, self.checkpoint_path).result()

    def client(self) -> Any:
        """The SDK's sampling client (made on first use; blocking)."""
        if self._client is None:
            import tinker

            if self._service is None:
                self._service = tinker.ServiceClient(base_url=self.base_url, api_key=self.api_key)
            if self.checkpoint_path:
                self._client = self._service.create_sampling_client(model_path=self.checkpoint_path).result()
            else:
                self._client = self._service.create_sampling_client(base_model=self.model_name).result()
        return self._client

    def close(self, status: SessionStatus = "success", detail: str | None = None) -> None:
        """Finish the Tinker session with `status` (success, errored, interrupted), waiting a bounded time
        (one line on stderr if the service does not answer); nothing when no client was made."""
        service, self._service, self._client = self._service, None, None
        if service is not None:
            finish_session(service, status, detail)

    def __enter__(self) -> CheckpointPolicy:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self.close(exit_status(exc_type))

    async def __aenter__(self) -> CheckpointPolicy:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        await asyncio.to_thread(self.close, exit_status(exc_type))  # off the loop: other episodes go on

    async def sample(self, prompt: list[int], max_tokens: int) -> tuple[list[int], list[float], str]:
        """One reply to `prompt`: its tokens, their logprobs, and why it stopped (awaits the SDK's future,
        so a harness that cancels the agent cancels the wait)."""
        import tinker

        client = self._client if self._client is not None else await asyncio.to_thread(self.client)
        params = tinker.SamplingParams(
            max_tokens=max_tokens, temperature=self.temperature, stop=self.renderer.stop_sequences()
        )
        out = await client.sample(tinker.ModelInput.from_ints(prompt), 1, params)
        seq = out.sequences[0]
        return list(seq.tokens), [float(x) for x in (seq.logprobs or [])], str(seq.stop_reason)


class GivenSandbox(SandboxProvider):
    """A sandbox provider that hands out the one sandbox a harness already started (for `TaskSession`)."""

    name = "harness"

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox

    def create(self, spec: SandboxSpec) -> Sandbox:
        """The harness's sandbox (the spec is the harness's business)."""
        return self.sandbox

    def get(self) -> SandboxProvider:
        """Itself (the `SandboxSource` a session asks for its provider)."""
        return self


def _int(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise PolicyError(f"agent kwarg {name} must be an integer, got {value!r}") from None


def policy_from_kwargs(
    model_name: str | None,
    checkpoint_path: str | None = None,
    tinker_url: str | None = None,
    action_format: str | None = None,
    renderer: str | None = None,
    tokenizer: str | None = None,
    temperature: float = 1.0,
    max_turns: int | None = None,
    max_tokens_per_turn: int = 512,
    max_context_tokens: int = 8192,
    command_timeout_s: float = 60.0,
) -> tuple[CheckpointPolicy, EpisodeLimits]:
    """The policy and episode limits of a harness agent's kwargs (strings from the harness's command
    line are converted; a non-number where a number belongs is a PolicyError naming the kwarg). An
    action format or turn cap left unset is the one the checkpoint's training run recorded, else
    `shell` and 10 turns."""
    turns = None if max_turns is None else _int(max_turns, "max_turns")
    policy = CheckpointPolicy(
        model_name or "",
        checkpoint_path=checkpoint_path,
        base_url=tinker_url,
        renderer=renderer,
        tokenizer=tokenizer,
        temperature=float(temperature),
        max_tokens_per_turn=_int(max_tokens_per_turn, "max_tokens_per_turn"),
        action_format=action_format or "shell",
    )
    trained = policy.trained_settings() if action_format is None or turns is None else {}
    if action_format is None and trained.get("action_format") in ACTION_FORMATS:
        policy.action_format = trained["action_format"]
    try:
        limits = EpisodeLimits(
            max_turns=turns if turns is not None else _int(trained.get("max_turns", 10), "max_turns"),
            max_context_tokens=_int(max_context_tokens, "max_context_tokens"),
            command_timeout_s=float(command_timeout_s),
            action_format=policy.action_format,
            timeout_includes_sampling=True,  # in a harness the wall clock is what the harness enforces
        )
    except ValidationError as e:
        first = e.errors()[0]
        raise PolicyError(f"agent kwarg {first['loc'][0]}: {first['msg']}") from None
    return policy, limits


def split_agent_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A harness agent's kwargs split into `policy_from_kwargs`'s (all but model_name) and the rest,
    which belong to the harness's own base class."""
    ours = set(inspect.signature(policy_from_kwargs).parameters) - {"model_name"}
    return {k: v for k, v in kwargs.items() if k in ours}, {k: v for k, v in kwargs.items() if k not in ours}


def harness_task(task_id: str, instruction: str, workdir: str, timeout_s: float = 3600.0) -> Task:
    """The task as the session sees it: the instruction and workdir; building and grading are the harness's."""
    return Task(
        id=task_id,
        source=Path("."),
        format="harness",
        instruction=instruction,
        workdir=workdir,
        agent_timeout_s=timeout_s,
    )


def episode_record(policy: CheckpointPolicy, traj: Trajectory) -> dict[str, Any]:
    """The episode as `tinkrl_trajectory.json` holds it: who played it (model, checkpoint, renderer,
    action format), every turn (the whole prompt it was sampled from, the sampled tokens, their
    logprobs, why sampling stopped, the reply's text, the observations, seconds spent sampling), the
    transcript, how it ended (None while it runs or when the harness stopped it) and the session's
    counts. A view of the training record: the turns are the trajectory's transitions."""
    logs = traj.logs
    return {
        "model_name": policy.model_name,
        "checkpoint_path": policy.checkpoint_path,
        "renderer": policy.renderer.name,
        "action_format": policy.action_format,
        "turns": [
            {
                "prompt_tokens": t.ob.to_ints(),
                "sampled_tokens": t.ac_tokens,
                "logprobs": t.ac_logprobs,
                "stop_reason": t.stop_reason,
                **{k.removeprefix("turn/"): v for k, v in t.logs.items() if k.startswith("turn/")},
            }
            for t in traj.transitions
        ],
        "messages": list(logs.get("tasks/transcript", [])),
        "end_reason": logs.get("tasks/end") or None,
        "metrics": {k: v for t in traj.transitions for k, v in t.metrics.items()},
    }


def rollout_detail(record: dict[str, Any]) -> dict[str, list]:
    """An `episode_record` in Harbor's `RolloutDetail` shape (per turn: prompt ids, completion ids, logprobs)."""
    turns = record["turns"]
    return {
        "prompt_token_ids": [t["prompt_tokens"] for t in turns],
        "completion_token_ids": [t["sampled_tokens"] for t in turns],
        "logprobs": [t["logprobs"] for t in turns],
    }


def write_episode(path: Path, policy: CheckpointPolicy, traj: Trajectory) -> dict[str, Any]:
    """Write `episode_record` as one JSON document at `path`; the record."""
    record = episode_record(policy, traj)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record))
    return record


async def run_episode(
    policy: CheckpointPolicy, sandbox: Sandbox, task: Task, limits: EpisodeLimits, traj: Trajectory | None = None
) -> Trajectory:
    """Play one episode of `task` in `sandbox` (already prepared by the harness) and return its trajectory.

    The loop is the training env's: tokens extend turn by turn; the session runs the actions and ends the
    episode on DONE/submit, the turn, token or time limit, or a full context. It never grades, so every
    reward is 0; the last turn carries the session's counts and logs (how it ended, the transcript), as a
    training episode's does. `traj` (when given) is filled turn by turn, its transcript live, so a harness
    that stops the agent at its time limit keeps the turns so far."""
    limits.action_format = policy.action_format
    session = TaskSession(task, limits, GivenSandbox(sandbox))
    env = SessionEnv(session, policy.renderer)
    traj = traj if traj is not None else Trajectory([])
    tokens = await env.begin()
    if not env.fits(tokens):
        session.overflow()
    while not session.done:
        t0 = time.monotonic()
        action, logprobs, stop = await policy.sample(env.tokens, env.max_tokens(policy.max_tokens_per_turn))
        logs: dict[str, Any] = {"turn/sample_s": round(time.monotonic() - t0, 3), "tasks/transcript": session.messages}
        turn = Transition(tinker.ModelInput.from_ints(env.tokens), action, logprobs, 0.0, False, stop, logs=logs)
        traj.transitions.append(turn)
        result = await env.turn(action)
        turn.episode_done = result.done
        logs.update({"turn/text": result.reply.text, "turn/observations": result.observations})
    if traj.transitions:
        metrics = session.metrics()
        traj.transitions[-1].metrics = {k: v for k, v in metrics.items() if not k.startswith("tasks/reward")}
        traj.transitions[-1].logs.update(session.logs())
    return traj
