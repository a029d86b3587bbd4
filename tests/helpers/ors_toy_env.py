"""A small ORS environment written with the openreward SDK's own Server/Environment classes.

`python tests/helpers/ors_toy_env.py --port N` serves it on 127.0.0.1. Tasks are additions; tools:
`hint` (reward -0.1, episode goes on) and `submit` (reward 1 if the answer is the sum, else 0;
finishes the episode). Used by the ORS client and training tests as an independent server.
`--die-at-session K` SIGKILLs the server when the K-th session is created (a crash mid-run).
"""

from __future__ import annotations

import argparse
import os
import signal

os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")

from openreward.environments import Environment, JSONObject, Server, TextBlock, ToolOutput, tool  # noqa: E402
from pydantic import BaseModel  # noqa: E402


class SubmitParams(BaseModel):
    answer: str


class Adder(Environment):
    """What is a + b? Submit the sum."""

    sessions = 0
    die_at_session = 0

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:  # noqa: B006 - the SDK's signature
        super().__init__(task_spec, secrets)
        Adder.sessions += 1
        if Adder.sessions == Adder.die_at_session:
            os.kill(os.getpid(), signal.SIGKILL)
        self.a, self.b = int(task_spec["a"]), int(task_spec["b"])

    @classmethod
    def list_splits(cls):
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        n, offset = (8, 0) if split == "train" else (4, 100)
        return [{"id": f"{split}-{i}", "a": offset + i, "b": 2 * i + 1} for i in range(n)]

    def get_prompt(self):
        return [TextBlock(text=f"What is {self.a} + {self.b}? Submit the sum with the submit tool.")]

    @tool
    async def hint(self) -> ToolOutput:
        """Get a hint (costs 0.1 reward)."""
        return ToolOutput(
            blocks=[TextBlock(text=f"The sum is between {self.a} and {self.a + self.b}.")], reward=-0.1, finished=False
        )

    @tool
    async def submit(self, params: SubmitParams) -> ToolOutput:
        """Submit the final answer."""
        correct = params.answer.strip() == str(self.a + self.b)
        return ToolOutput(
            blocks=[TextBlock(text="Correct!" if correct else "Wrong.")],
            reward=1.0 if correct else 0.0,
            finished=True,
            metadata={"gold": self.a + self.b},
        )


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--die-at-session", type=int, default=0)
    args = parser.parse_args()
    Adder.die_at_session = args.die_at_session
    uvicorn.run(Server([Adder]).app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
