"""Evaluating an agent on tasks: K trials per task, pass@1 / pass@K, transcripts and SWE-bench predictions.

The policy is a Tinker SamplingClient (the embedded engine or the Tinker service: the token-level
`SessionEnv` through the trainer's own rollout loop) or any OpenAI-compatible endpoint (the same
`TaskSession` fed chat messages, tools sent as `tools=`, tool calls read from `tool_calls` or,
when a server leaves them in the text, parsed as the task's tool format writes them). Either way the episode, its
limits and its grading are the training environment's. `tinkrl eval` (`tinkrl.commands.eval`)
is the command.

Written to an output directory: `results.jsonl` (one line per trial: reward, turns, end reason,
failure_mode, grade detail, transcript), `results.json` and `results.md` (the per-task table
with unbiased pass@k and each task's verdict: solved when a valid trial resolved it, unsolved, or
error when no trial could run; `results.json` also lists terminal-bench's `resolved_ids` /
`unresolved_ids`), and for SWE tasks (SWE-bench, R2E-Gym rows) `predictions.jsonl` in
SWE-bench's format (`instance_id`, `model_name_or_path`, `model_patch` = the git diff of the
workspace), one file per attempt when K > 1. Infrastructure failures are recorded per trial and
left out of pass@k. While it runs, finished trials are appended to `results.partial.jsonl`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tinkrl.errors import InfraFailure, TinkrlError
from tinkrl.progress import progress_bar, progress_line
from tinkrl.taskdirs.model import Task

log = logging.getLogger(__name__)


@dataclass
class Trial:
    """One attempt at one task: reward, counts, how it ended, the patch and the transcript."""

    task_id: str
    format: str
    attempt: int  # 1-based
    reward: float | None = None  # None when infrastructure failed
    resolved: bool = False  # reward >= 1
    turns: int = 0
    tool_calls: int = 0
    malformed_calls: int = 0
    command_timeouts: int = 0
    sampled_tokens: int = 0
    end_reason: str | None = None
    grade_detail: str = ""
    failure_mode: str | None = None
    failure_detail: str = ""
    seconds: float = 0.0
    patch: str | None = None
    transcript: list[dict] = field(default_factory=list)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n trials with c successes: 1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} trials, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def trial_from_session(
    session,
    attempt: int,
    seconds: float,
    failure: InfraFailure | None = None,
    failure_mode: str | None = None,
    failure_detail: str = "",
) -> Trial:
    """A finished session as a Trial; an infrastructure failure (raised or reported) leaves its reward None."""
    mode = failure.failure_mode if failure is not None else failure_mode
    ok = mode is None and session.reward is not None
    return Trial(
        task_id=session.task.id,
        format=session.task.format,
        attempt=attempt,
        reward=session.reward if ok else None,
        resolved=bool(ok and session.reward >= 1.0),
        turns=session.turns,
        tool_calls=session.tool_calls,
        malformed_calls=session.malformed_calls,
        command_timeouts=session.command_timeouts,
        sampled_tokens=session.sampled_tokens,
        end_reason=session.end_reason,
        grade_detail=session.grade_detail,
        failure_mode=mode,
        failure_detail=str(failure) if failure is not None else failure_detail,
        seconds=round(seconds, 2),
        patch=session.patch,
        transcript=list(session.messages),
    )


# ---------------------------------------------------------------------------------------------
# Policies


class SamplingClientPolicy:
    """A Tinker SamplingClient (local engine or service: a base model or a checkpoint), through the
    token-level SessionEnv."""

    def __init__(self, sampling_client, cfg, renderer, provider, temperature: float):
        self.sampling_client, self.cfg = sampling_client, cfg
        self.renderer, self.provider, self.temperature = renderer, provider, temperature

    async def run(self, task: Task, attempt: int) -> Trial:
        from tinkrl.agents.episode import SessionEnv
        from tinkrl.agents.session import TaskSession
        from tinkrl.rl.rollouts import do_rollout

        session = TaskSession(task, self.cfg, self.provider, capture_patch=True)
        env = SessionEnv(session, self.renderer, self.cfg.max_tokens_per_turn)
        t0 = time.monotonic()
        traj = await do_rollout(env, self.sampling_client, self.cfg.max_tokens_per_turn, self.temperature)
        return trial_from_session(
            session, attempt, time.monotonic() - t0, failure_mode=traj.failure_mode, failure_detail=traj.failure_detail
        )


def _is_context_error(e: Exception) -> bool:
    text = str(e).lower()
    return any(
        w in text
        for w in (
            "context length",
            "context_length",
            "maximum context",
            "too many tokens",
            "prompt is too long",
            "context window",
        )
    )


def openai_history(messages: list[dict]) -> list[dict]:
    """The transcript as OpenAI chat messages (tool results keep only role, id and content)."""
    out = []
    for m in messages:
        if m["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": m.get("tool_call_id") or "call_0", "content": m["content"]})
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content", "tool_calls")})
    return out


class OpenAIPolicy:
    """Any OpenAI-compatible chat endpoint, through the message-level TaskSession."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        model_name: str | None,
        cfg,
        provider,
        temperature: float,
        timeout_s: float = 600.0,
    ):
        import openai

        self.client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or os.environ.get("TINKRL_API_KEY") or "EMPTY",
            timeout=timeout_s,
            max_retries=2,
        )
        self.model_name, self.cfg = model_name, cfg
        self.provider, self.temperature = provider, temperature

    async def resolve_model(self) -> str:
        """The served model: --served-model, or the endpoint's only/first listed model."""
        import openai

        if self.model_name:
            return self.model_name
        try:
            models = [m.id async for m in self.client.models.list()]
        except openai.OpenAIError as e:
            raise TinkrlError(f"cannot list the models of {self.client.base_url}: {e} (pass --served-model)") from None
        if not models:
            raise TinkrlError(f"{self.client.base_url} serves no models; pass --served-model")
        self.model_name = models[0]
        return self.model_name

    async def _complete(self, session):
        import openai

        try:
            return await self.client.chat.completions.create(
                model=self.model_name,
                messages=openai_history(session.messages),
                **({"tools": session.tools} if session.tools else {}),
                temperature=self.temperature,
                max_tokens=self.cfg.max_tokens_per_turn,
            )
        except openai.BadRequestError as e:
            if _is_context_error(e):
                return None
            raise InfraFailure(f"the model endpoint rejected the request: {e}", "model_error") from None
        except openai.OpenAIError as e:
            raise InfraFailure(f"the model endpoint failed: {type(e).__name__}: {e}", "model_error") from None

    async def episode(self, session) -> None:
        from tinkrl.agents.episode import MIN_ACTION_TOKENS, Reply, shell_reply
        from tinkrl.renderers import parse_text_calls, tool_call

        await session.start()
        while True:
            resp = await self._complete(session)
            if resp is None:  # the endpoint says the conversation no longer fits
                session.overflow()
                break
            if not resp.choices:
                raise InfraFailure("the model endpoint returned no choices", "model_error")
            choice = resp.choices[0]
            msg = choice.message
            content = msg.content or ""
            usage = resp.usage
            n_tokens = usage.completion_tokens if usage else 0
            truncated = choice.finish_reason == "length"
            if session.shell:
                _, done = await session.act(shell_reply(content, truncated, n_tokens))
            else:
                calls = [
                    tool_call(c.function.name, c.function.arguments or "{}", c.id)
                    for c in (msg.tool_calls or [])
                    if getattr(c, "function", None) is not None
                ]
                errors: list[str] = []
                if not calls:  # servers without a tool parser leave the calls in the text
                    content, calls, errors = parse_text_calls(content, self.cfg.tool_format)
                assistant: dict[str, Any] = {"role": "assistant", "content": content or ("" if not calls else None)}
                if calls:
                    assistant["tool_calls"] = calls
                _, done = await session.act(Reply(assistant, calls, errors, [], truncated, n_tokens))
            if done:
                break
            if usage and usage.total_tokens + MIN_ACTION_TOKENS > self.cfg.max_context_tokens:
                session.overflow()
                break
        await session.finish()

    async def run(self, task: Task, attempt: int) -> Trial:
        from tinkrl.agents.session import TaskSession

        session = TaskSession(task, self.cfg, self.provider, capture_patch=True)
        t0 = time.monotonic()
        try:
            await self.episode(session)
            return trial_from_session(session, attempt, time.monotonic() - t0)
        except InfraFailure as e:
            return trial_from_session(session, attempt, time.monotonic() - t0, failure=e)
        finally:
            await session.close()


# ---------------------------------------------------------------------------------------------
# Running and reporting


async def run_trials(
    tasks: list[Task], policy, n: int, n_concurrent: int, progress: bool = True, partial_path: Path | None = None
) -> list[Trial]:
    """Every task n times, at most n_concurrent episodes at once; trials in (task, attempt) order.
    Each finished trial is also appended to `partial_path` at once, so an interrupted run keeps them."""
    sem = asyncio.Semaphore(n_concurrent)
    partial = None
    if partial_path is not None:
        partial_path.parent.mkdir(parents=True, exist_ok=True)
        partial = open(partial_path, "a")
    total, finished = len(tasks) * n, 0
    bar = progress_bar(total, "eval trials", unit="trial") if progress else None

    async def one(task: Task, attempt: int) -> Trial:
        nonlocal finished
        async with sem:
            try:
                trial = await policy.run(task, attempt)
            except Exception as e:  # a bug in one trial must not lose the others' results
                log.exception("trial %s#%d crashed", task.id, attempt)
                trial = Trial(
                    task.id, task.format, attempt, failure_mode="agent_crash", failure_detail=f"{type(e).__name__}: {e}"
                )
        finished += 1
        if partial is not None:
            partial.write(json.dumps(asdict(trial), ensure_ascii=False) + "\n")
            partial.flush()
        if progress:
            what = (
                f"reward={trial.reward:g} turns={trial.turns} end={trial.end_reason}"
                if trial.failure_mode is None
                else f"FAILED ({trial.failure_mode}: {trial.failure_detail[:120]})"
            )
            progress_line(f"[{finished}/{total}] {task.id}#{attempt} {what} ({trial.seconds:.1f}s)")
            bar.update(1)
        return trial

    try:
        return list(await asyncio.gather(*(one(t, a) for t in tasks for a in range(1, n + 1))))
    finally:
        if bar is not None:
            bar.close()
        if partial is not None:
            partial.close()


def summarize(trials: list[Trial], k: int) -> tuple[list[dict], dict]:
    """Per-task rows and the overall row (pass@k averaged over the tasks that have k valid trials)."""
    by_task: dict[str, list[Trial]] = {}
    for t in trials:
        by_task.setdefault(t.task_id, []).append(t)
    rows = []
    for task_id, ts in by_task.items():
        valid = [t for t in ts if t.failure_mode is None]
        n, c = len(valid), sum(t.resolved for t in valid)
        rows.append(
            {
                "task": task_id,
                "format": ts[0].format,
                "trials": len(ts),
                "infra_failures": len(ts) - n,
                "resolved": c,
                "mean_reward": sum(t.reward or 0.0 for t in valid) / n if n else None,
                "mean_turns": sum(t.turns for t in valid) / n if n else None,
                "pass@1": pass_at_k(n, c, 1) if n >= 1 else None,
                f"pass@{k}": pass_at_k(n, c, k) if n >= k else None,
                "solved": c > 0 if n else None,  # None: every trial failed on infrastructure
            }
        )

    def mean(key: str) -> float | None:
        vals = [r[key] for r in rows if r[key] is not None]
        return sum(vals) / len(vals) if vals else None

    overall = {
        "task": f"all ({len(rows)} tasks)",
        "format": "",
        "trials": sum(r["trials"] for r in rows),
        "infra_failures": sum(r["infra_failures"] for r in rows),
        "resolved": sum(r["resolved"] for r in rows),
        "mean_reward": mean("mean_reward"),
        "mean_turns": mean("mean_turns"),
        "pass@1": mean("pass@1"),
        f"pass@{k}": mean(f"pass@{k}"),
        "solved": sum(r["solved"] is True for r in rows),  # tasks solved
    }
    return rows, overall


VERDICTS = {True: "solved", False: "unsolved", None: "error"}  # error: no trial ran (infrastructure)


def format_table(rows: list[dict], overall: dict, k: int) -> str:
    """The per-task rows and the overall row as a Markdown table; the last column is each task's verdict
    (solved, unsolved, or error) and, overall, how many tasks were solved."""
    cols = ["task", "format", "trials", "infra_failures", "resolved", "mean_reward", "mean_turns", "pass@1"]
    if k > 1:
        cols.append(f"pass@{k}")

    def cell(v) -> str:
        if v is None:
            return "-"
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(cols + ["solved"]) + " |", "|" + "|".join("---" for _ in range(len(cols) + 1)) + "|"]
    for r in rows:
        lines.append("| " + " | ".join([*(cell(r[c]) for c in cols), VERDICTS[r["solved"]]]) + " |")
    lines.append("| " + " | ".join([*(cell(overall[c]) for c in cols), f"{overall['solved']}/{len(rows)}"]) + " |")
    return "\n".join(lines)


def write_outputs(out_dir: Path, trials: list[Trial], rows: list[dict], overall: dict, table: str, meta: dict) -> None:
    """Write results.jsonl, results.json (with resolved_ids / unresolved_ids), results.md and, for SWE tasks,
    one predictions file per attempt."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "results.jsonl", "w") as f:
        for t in trials:
            f.write(json.dumps(asdict(t), ensure_ascii=False) + "\n")
    ids = {
        "resolved_ids": [r["task"] for r in rows if r["solved"]],
        "unresolved_ids": [r["task"] for r in rows if r["solved"] is False],
    }
    summary = {**meta, **ids, "tasks": rows, "overall": overall}
    (out_dir / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out_dir / "results.md").write_text(table + "\n")
    repo = [t for t in trials if t.format in ("swebench", "r2e")]
    if not repo:
        return
    n = max(t.attempt for t in repo)
    for attempt in range(1, n + 1):
        name = "predictions.jsonl" if attempt == 1 else f"predictions.attempt{attempt}.jsonl"
        with open(out_dir / name, "w") as f:
            for t in repo:
                if t.attempt == attempt:
                    f.write(
                        json.dumps(
                            {
                                "instance_id": t.task_id,
                                "model_name_or_path": meta["model"],
                                "model_patch": t.patch or "",
                            }
                        )
                        + "\n"
                    )
