"""A verifiers taskset made for the tests: small sums, scored by a rubric of known functions.

`reply_length` is a known function of the completion (min(len(reply), 200) / 200) and
`constant` always 1.0 with weight 0.5, so a rollout's reward is checkable from its reply; a task
marked `explode` has a rubric that raises (a failing rollout). `correct` is a metric.
"""

from __future__ import annotations

import verifiers.v1 as vf

__all__ = ["ArithTaskset"]

PROBLEMS = [(3, 4), (10, 5), (7, 8), (2, 9), (6, 6), (1, 12)]


class ArithData(vf.TaskData):
    answer: int = 0
    explode: bool = False


class ArithTaskConfig(vf.TaskConfig):
    pass


class ArithTask(vf.Task[ArithData, vf.State, ArithTaskConfig]):
    @vf.reward
    async def reply_length(self, trace) -> float:
        return min(len(trace.last_reply), 200) / 200

    @vf.reward(weight=0.5)
    async def constant(self, task: ArithData) -> float:
        if task.explode:
            raise RuntimeError("rubric exploded on purpose")
        return 1.0

    @vf.metric
    async def correct(self, task: ArithData, trace) -> float:
        return float(str(task.answer) in trace.last_reply)


class ArithTasksetConfig(vf.TasksetConfig):
    explode_idx: int = -1
    """The task whose rubric raises (-1: none)."""


class ArithTaskset(vf.Taskset[ArithTask, ArithTasksetConfig]):
    def load(self):
        for i, (a, b) in enumerate(PROBLEMS):
            data = ArithData(
                prompt=f"What is {a} + {b}? Answer with the number.",
                system_prompt="You are a calculator.",
                answer=a + b,
                explode=i == self.config.explode_idx,
            )
            yield ArithTask(data, self.config.task)
