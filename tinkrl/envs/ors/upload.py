"""Upload of finished ORS trajectories to OpenReward's rollout API (`openreward.upload: true`).

Each ORS environment of a run owns one `RolloutUploader`, called from the environment's hooks:
after each step it queues every trajectory whose last step carries the episode record the
ORS env writes under `LOG_KEY`, sent on worker threads (`OPENREWARD_API_KEY` needed); when
the run ends it waits for them. An upload problem is logged and counted, never raised.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from tinkrl.errors import ConfigError
from tinkrl.rl.types import Metrics
from tinkrl.traces.runs import ORS_LOG_KEY

LOG_KEY = ORS_LOG_KEY  # key of an episode's final step logs holding its record (written by env.py)


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

    def submit(self, groups: Sequence[Any], step: int) -> int:
        """Queue every ORS trajectory of the step's groups; returns how many were queued."""
        n = 0
        for group in groups:
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
