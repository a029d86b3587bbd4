"""`tinkrl serve env [--host H] [--port P] ENV...`: tinkrl's own environments over ORS.

Each ENV (a name from the environment registry, e.g. `arithmetic`, `gsm8k`, `tasks`, with
optional fields as `ENV.field=value`) becomes an environment class of the `openreward` SDK
and all are served by its `Server` (HTTP + SSE, the Open Reward Standard), so any ORS
client — another trainer, `openreward`'s own client, another machine — can train on them.
The first ENV is the server's default; the others are at `/<name>/...` (an SDK client picks
one with `environments.get(name, variant=name, base_url=...)`; do so for `tasks`, whose bare
`/tasks` path is the server's task-list route).

Mapping onto ORS (splits, tasks, prompt, tools; a session is one episode):
- math (`arithmetic`, `gsm8k`, `math500`, `hendrycks`, `polaris`): splits `train` and
  `test`, built by the math environment itself (same problems, same held-out set); the
  prompt is the question; one tool, `answer(answer)`, grades with the math env's grader
  (last number for arithmetic, math-verify otherwise) and finishes the episode with
  reward 1 or 0. Tasks carry an id and the question, never the reference answer.
  Arithmetic's unbounded train space is served as `--train-size` fixed problems.
- tasks (`tasks`, with `tasks.path=DIR`): splits `train` (and `test` when
  `tasks.test_task_ids` is set); a session owns a sandbox built in `setup()`; the prompt is
  the agent system prompt + the task instruction; tools are tinkrl's agent tools
  (execute_bash, file_editor, search, submit); `submit` — or the turn limit — grades the
  sandbox with the task's tests and finishes with that reward.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openreward.environments import Environment, Message, Server, TextBlock, ToolOutput, tool
from pydantic import BaseModel

from tinkrl.access import key_matches, request_key
from tinkrl.errors import ConfigError

ANSWER_INSTRUCTION = "\n\nSubmit your final answer with the `answer` tool."


class AnswerParams(BaseModel):
    """The arguments of the `answer` tool."""

    answer: str


def _context(key: str, entry: Any, seed: int, eval_problems: int, groups_per_batch: int = 64):
    from tinkrl.envs import EnvContext

    return EnvContext(
        key=key,
        entry=entry,
        renderer=None,
        model_name="",
        group_size=1,
        groups_per_batch=groups_per_batch,
        max_tokens=0,
        run_dir=Path("."),
        seed=seed,
        eval_problems=eval_problems,
    )


# ---------------------------------------------------------------------------------------------
# math


def math_problems(cfg: Any, key: str, train_size: int, eval_problems: int, seed: int):
    """(train, test) problem lists exactly as the math env builds them, and its episode spec."""
    from tinkrl.config import EnvEntry
    from tinkrl.envs.math.env import ProblemListDataset, build_datasets

    datasets = build_datasets(cfg, _context(key, EnvEntry(), seed, eval_problems))
    train_ds, test_ds = datasets.train, datasets.test
    if isinstance(train_ds, ProblemListDataset):
        train = list(train_ds.problems)[:train_size]
    else:  # arithmetic: an unbounded stream; serve its first distinct problems
        train, seen, i = [], set(), 0
        while len(train) < train_size and i < 10 * train_size:
            for b in train_ds.get_batch(i):
                if b.problem.id not in seen and len(train) < train_size:
                    seen.add(b.problem.id)
                    train.append(b.problem)
            i += 1
    test = list(test_ds.problems) if test_ds is not None else []
    spec = (train_ds.get_batch(0)[0]).spec
    return train, test, spec


async def grade_answer(answer: str, reference: str, style: str, timeout_s: float) -> bool:
    """The math env's grading applied to an `answer` tool argument."""
    from tinkrl.envs.math import grading

    if style == "number":
        given = grading.extract_last_number(answer)
        return given is not None and grading.to_number(given) == grading.to_number(reference)
    given = grading.extract_final_answer(answer) if "\\boxed" in answer else answer.strip()
    result = await grading.grade_async(given, reference, grading.pool_for(timeout_s))
    return bool(result.correct)


def math_environment(key: str, cfg: Any, train_size: int, eval_problems: int, seed: int) -> type:
    """An ORS `Environment` class serving a math env's train and test problems, graded by its `answer` tool."""
    train, test, spec = math_problems(cfg, key, train_size, eval_problems, seed)
    splits = {"train": train, "test": test} if test else {"train": train}
    by_id = {f"{s}-{i}": p for s, probs in splits.items() for i, p in enumerate(probs)}

    class MathORSEnvironment(Environment):
        def __init__(self, task_spec: dict = {}, secrets: dict[str, str] = {}) -> None:  # noqa: B006 - the SDK's signature
            super().__init__(task_spec, secrets)
            problem = by_id.get(str(task_spec.get("id")))
            if problem is None:
                raise ValueError(f"unknown task {task_spec.get('id')!r}: create sessions by split and index")
            self.problem = problem

        @classmethod
        def name(cls) -> str:
            return key

        @classmethod
        def list_splits(cls):
            return list(splits)

        @classmethod
        def list_tasks(cls, split: str) -> list[dict]:
            return [{"id": f"{split}-{i}", "question": p.question} for i, p in enumerate(splits[split])]

        def get_messages(self):
            msgs = [Message(role="system", blocks=[TextBlock(text=spec.system_prompt)])] if spec.system_prompt else []
            return msgs + [Message(role="user", blocks=[TextBlock(text=self.problem.question + ANSWER_INSTRUCTION)])]

        def get_prompt(self):
            return [TextBlock(text=self.problem.question + ANSWER_INSTRUCTION)]

        @tool
        async def answer(self, params: AnswerParams) -> ToolOutput:
            """Submit the final answer (a number or expression). Ends the episode."""
            correct = await grade_answer(params.answer, self.problem.answer, spec.style, spec.grade_timeout_s)
            return ToolOutput(
                blocks=[TextBlock(text="Correct." if correct else "Incorrect.")],
                reward=1.0 if correct else 0.0,
                finished=True,
                metadata={"correct": correct},
            )

    MathORSEnvironment.__name__ = MathORSEnvironment.__qualname__ = f"{key}_ors"
    return MathORSEnvironment


# ---------------------------------------------------------------------------------------------
# assembling the server


def environment_classes(
    envs: dict[str, dict[str, Any]], train_size: int = 1000, eval_problems: int = 100, seed: int = 0
) -> list[type]:
    """ORS environment classes for tinkrl environments by name ({name: {field: value}}): math presets and tasks."""
    from tinkrl.config import EnvEntry
    from tinkrl.envs import make_env_config, resolve_type

    classes = []
    for key, fields in envs.items():
        entry = EnvEntry(env=fields)
        type_name, _ = resolve_type(key, entry)
        cfg = make_env_config(key, entry)
        if type_name == "math":
            classes.append(math_environment(key, cfg, train_size, eval_problems, seed))
        elif type_name == "tasks":
            from tinkrl.env_server.tasks import tasks_environment

            classes.append(tasks_environment(key, cfg))
        else:
            raise ConfigError(
                f"{key}: serving {type_name!r} environments over ORS is not supported (math presets and tasks are)"
            )
    return classes


def make_app(classes: list[type], api_key: str | None = None):
    """The `openreward` SDK's ORS server app over `classes`; with `api_key`, every request must carry it
    (`X-API-Key`, as the SDK's clients send their key, or `Authorization: Bearer`)."""
    app = Server(classes).app
    return app if api_key is None else KeyedApp(app, api_key)


class KeyedApp:
    """An ASGI app that answers 401 to an HTTP request without `key`, and hands every other one to `app`."""

    def __init__(self, app: Any, key: str) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            if not key_matches(request_key(headers), self.key):
                body = json.dumps({"detail": "invalid or missing API key (send X-API-Key: KEY)"}).encode()
                await send(
                    {"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"application/json")]}
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
