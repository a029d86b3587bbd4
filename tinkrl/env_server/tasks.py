"""tinkrl's agent tasks as an ORS environment (`tinkrl serve env tasks tasks.path=DIR`).

One ORS session is one `TaskSession` (tinkrl.agents.session): `setup()` builds the task's
sandbox, the prompt is tinkrl's agent system prompt and the task instruction, the tools are
tinkrl's agent tools with their own JSON schemas, and every tool call runs in the sandbox
through the session (same limits, timeouts and clipping as local training). `submit`, or
the session's turn limit (counted per tool call here, the server sees no assistant turns),
grades the sandbox with the task's tests: that call returns the reward and `finished`.
`teardown()` (session delete, or the server's reaper) destroys the sandbox.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from openreward.environments import Environment, Message, TextBlock, ToolOutput, tool
from pydantic import BaseModel, ConfigDict

from tinkrl.agents.episode import Reply
from tinkrl.agents.session import TaskSession
from tinkrl.agents.tools import TOOL_SCHEMAS
from tinkrl.envs.agent_tasks.config import TasksEnvConfig
from tinkrl.errors import ConfigError
from tinkrl.sandbox import LazyProvider


def _arguments_model(name: str, schema: dict) -> type[BaseModel]:
    """A pydantic model that advertises the tool's own JSON schema and passes arguments through
    unvalidated: `run_tool` checks them and answers a bad call with an error the model reads."""

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="allow")

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict:
            return schema

    Arguments.__name__ = Arguments.__qualname__ = f"{name}_arguments"
    return Arguments


def _make_tool(name: str, description: str, schema: dict):
    model = _arguments_model(name, schema)

    async def call(self, params) -> ToolOutput:
        return await self._run(name, params.model_dump())

    call.__annotations__ = {"params": model, "return": ToolOutput}
    call.__name__ = call.__qualname__ = name
    call.__doc__ = description
    return tool(exclusive=True)(call) if name == "submit" else tool(call)


def tasks_environment(key: str, cfg: TasksEnvConfig, provider: LazyProvider | None = None) -> type:
    """An ORS `Environment` class serving task directories with the agent tools (train tasks gated when `cfg.gate`)."""
    tasks = cfg.load_tasks()
    provider = provider or LazyProvider()
    train, test = cfg.split(tasks, provider)
    if not train and not test:
        raise ConfigError(f"{key}: no tasks to serve (all failed the gate)")
    splits = {name: ts for name, ts in (("train", train), ("test", test)) if ts}
    by_id = {t.id: t for t in tasks}

    class TasksORSEnvironment(Environment):
        def __init__(self, task_spec: dict = {}, secrets: dict[str, str] = {}) -> None:  # noqa: B006 - the SDK's signature
            super().__init__(task_spec, secrets)
            task = by_id.get(str(task_spec.get("id")))
            if task is None:
                raise ValueError(f"unknown task {task_spec.get('id')!r}")
            self.session = TaskSession(task, cfg, provider)

        @classmethod
        def name(cls) -> str:
            return key

        @classmethod
        def list_splits(cls):
            return list(splits)

        @classmethod
        def list_tasks(cls, split: str) -> list[dict]:
            return [{"id": t.id} for t in splits[split]]

        async def setup(self) -> None:
            await self.session.start()

        async def teardown(self) -> None:
            await self.session.close()

        def get_messages(self):
            return [
                Message(role=m["role"], blocks=[TextBlock(text=m["content"])]) for m in self.session.first_messages()
            ]

        def get_prompt(self):
            return [TextBlock(text=self.session.task.instruction)]

        async def _run(self, name: str, arguments: dict) -> ToolOutput:
            call = {
                "id": "call_" + uuid.uuid4().hex[:12],
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
            observations, done = await self.session.act(
                Reply({"role": "assistant", "content": "", "tool_calls": [call]}, [call])
            )
            text = "\n".join(str(m["content"]) for m in observations)
            if not done:
                return ToolOutput(blocks=[TextBlock(text=text)], finished=False)
            reward = await self.session.finish()
            summary = f"{text}\n[episode ended ({self.session.end_reason}); reward {reward:g}]"
            return ToolOutput(
                blocks=[TextBlock(text=summary)],
                reward=reward,
                finished=True,
                metadata={
                    "end_reason": self.session.end_reason,
                    "grade": self.session.grade_detail[:2000],
                    **self.session.metrics(),
                },
            )

    for schema in TOOL_SCHEMAS:
        fn = schema["function"]
        setattr(
            TasksORSEnvironment,
            fn["name"],
            _make_tool(fn["name"], fn.get("description", ""), fn.get("parameters", {"type": "object"})),
        )
    TasksORSEnvironment.__name__ = TasksORSEnvironment.__qualname__ = f"{key}_ors"
    return TasksORSEnvironment
