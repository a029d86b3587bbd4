"""Episodes as Docent agent runs (Transluce's `docent` SDK): converted, validated by the SDK's own
models, then uploaded to a collection when credentials are there, else written to a JSON file.

One agent run per episode: its transcript's messages in Docent's chat schema (tool calls with parsed
arguments, tool results as tool messages; a rendered prompt or observation without roles as a user
message), and metadata to filter on: run, step, environment, group, task id, reward, advantage,
model, checkpoint, how it ended, its grade.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tinkrl.errors import TinkrlError
from tinkrl.traces.runs import (
    Episode,
    checkpoints_by_step,
    eval_episodes,
    eval_results,
    is_eval_dir,
    is_run_dir,
    run_episodes,
    run_info,
)


def _docent():
    try:
        from docent.data_models import AgentRun, Transcript
        from docent.data_models.chat import parse_chat_message
    except ImportError as e:
        raise TinkrlError("the Docent export needs the `docent-python` package: pip install 'tinkrl[docent]'") from e
    return AgentRun, Transcript, parse_chat_message


def _tool_call(call: dict, index: int) -> dict:
    """An OpenAI-style tool call as Docent's ToolCall: arguments parsed, a parse error kept."""
    fn = call.get("function") or {}
    name, raw = fn.get("name") or call.get("name") or "", fn.get("arguments", call.get("arguments", {}))
    out: dict[str, Any] = {"id": call.get("id") or f"call_{index}", "function": name, "type": "function"}
    if isinstance(raw, dict):
        out["arguments"] = raw
        return out
    try:
        parsed = json.loads(raw or "{}")
        out["arguments"] = parsed if isinstance(parsed, dict) else {"value": parsed}
    except json.JSONDecodeError as e:
        out["arguments"] = {"raw": raw}
        out["parse_error"] = str(e)
    return out


def docent_message(message: dict, index: int) -> dict:
    """One transcript message in Docent's chat schema."""
    role = message.get("role")
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content) if content is not None else ""
    if role in ("system", "user"):
        return {"role": role, "content": text}
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": text}
        calls = message.get("tool_calls") or []
        if calls:
            out["tool_calls"] = [_tool_call(c, i) for i, c in enumerate(calls)]
        return out
    if role == "tool":
        return {
            "role": "tool",
            "content": text,
            "tool_call_id": message.get("tool_call_id"),
            "function": message.get("name"),
        }
    # `prompt` / `observation`: tokens the renderer laid out, shown as the text the model read
    return {"role": "user", "content": text, "metadata": {"tinkrl_role": role or "unknown", "index": index}}


def episode_metadata(ep: Episode, run: dict, checkpoint: str | None) -> dict:
    """What Docent shows and filters on for one episode."""
    meta = {
        "run": run.get("name"),
        "run_id": run.get("run_id"),
        "model": run.get("model"),
        "checkpoint": checkpoint,
        "source": ep.source,
        "step": ep.step,
        "env": ep.env,
        "group": ep.group,
        "episode": ep.episode,
        "task_id": ep.task,
        "reward": ep.reward,
        "advantage": ep.advantage,
        "trained": ep.trained,
        "turns": ep.turns,
        "action_tokens": ep.ac_tokens,
        "truncated": ep.truncated,
        "end": ep.end,
        "grade": ep.grade,
        "failure_mode": ep.failure_mode,
        "scores": {"reward": ep.reward} if ep.reward is not None else {},
    }
    return {k: v for k, v in meta.items() if v is not None}


def to_agent_run(ep: Episode, run: dict, checkpoint: str | None = None):
    """One episode as a `docent.data_models.AgentRun`, validated by the SDK."""
    AgentRun, Transcript, parse_chat_message = _docent()
    messages = [parse_chat_message(docent_message(m, i)) for i, m in enumerate(ep.messages)]
    if not messages:  # an infrastructure failure before the first turn: say so, as Docent needs a message
        note = f"no transcript: {ep.failure_mode or 'empty episode'} {ep.failure_detail}".strip()
        messages = [parse_chat_message({"role": "system", "content": note})]
    return AgentRun(
        name=f"{run.get('name')}:{ep.id}",
        transcripts=[Transcript(name=ep.id, messages=messages)],
        metadata=episode_metadata(ep, run, checkpoint),
    )


def agent_runs(path: Path, steps: Iterable[int] | None = None) -> list:
    """Every episode of a run directory (the given steps, or all) or a `tinkrl eval` output directory as
    Docent agent runs."""
    if is_run_dir(path):
        run, checkpoints = run_info(path), checkpoints_by_step(path)
        episodes = run_episodes(path, None if steps is None else list(steps))
        return [to_agent_run(e, run, checkpoints.get(e.step or -1)) for e in episodes]
    if is_eval_dir(path):
        results = eval_results(path)
        run = {"name": path.name, "model": results.get("model")}
        return [to_agent_run(e, run, results.get("checkpoint")) for e in eval_episodes(path)]
    raise TinkrlError(f"{path} is neither a run directory (metrics.jsonl) nor a tinkrl eval output (results.json)")


def write_agent_runs(runs: list, out: Path) -> Path:
    """The agent runs as one JSON list, each as the SDK dumps it (`AgentRun.model_validate` reads it back)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps([r.model_dump(mode="json") for r in runs], ensure_ascii=False) + "\n")
    tmp.replace(out)
    return out


def has_credentials() -> bool:
    """Whether a Docent API key is set (`DOCENT_API_KEY`, or a docent.env config the SDK reads)."""
    if os.environ.get("DOCENT_API_KEY"):
        return True
    try:
        from docent.sdk.client import load_config_file
    except ImportError:
        return False
    return bool(load_config_file(None).get("DOCENT_API_KEY"))


def upload_agent_runs(runs: list, collection: str) -> str:
    """Add the agent runs to the Docent collection named `collection` (created when absent; an id of an
    existing collection works too); returns the collection id. The SDK reads `DOCENT_API_KEY` and, for
    a self-hosted Docent, `DOCENT_API_URL` / `DOCENT_FRONTEND_URL`."""
    _docent()
    from docent import Docent

    client = Docent()
    existing = {c.get("id") or c.get("collection_id"): c for c in client.list_collections()}
    named = [cid for cid, c in existing.items() if c.get("name") == collection]
    collection_id = collection if collection in existing else named[0] if named else None
    if collection_id is None:
        collection_id = client.create_collection(name=collection, description="tinkrl episodes")
    if runs:
        client.add_agent_runs(collection_id, runs)
    return collection_id


def export_traces(
    path: Path, steps: Iterable[int] | None, collection: str | None, out: Path | None = None, to_file: bool = False
) -> str:
    """Episodes of a run (the given steps, or all) or trials of an eval as Docent agent runs: uploaded to
    `collection` (default: the directory's name) when credentials are set and `to_file` is not, else
    written to `out` (default: PATH/docent_agent_runs.json). Returns a line saying where they went."""
    runs = agent_runs(path, steps)
    if has_credentials() and not to_file:
        name = collection or path.resolve().name
        cid = upload_agent_runs(runs, name)
        return f"uploaded {len(runs)} agent runs to Docent collection {name!r} ({cid})"
    written = write_agent_runs(runs, out or path / "docent_agent_runs.json")
    return f"wrote {len(runs)} Docent agent runs to {written} (set DOCENT_API_KEY to upload)"
