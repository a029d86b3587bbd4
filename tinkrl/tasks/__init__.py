"""Agent tasks: load (Harbor, terminal-bench, R2E-Gym, SWE-bench), prepare a sandbox, grade, gate.

task = load_task("tasks/fix-permissions")
with start_sandbox(task, get_provider("bwrap")) as sb:
    ...agent acts on sb...
    result = grade(task, sb)   # GradeResult(reward, detail, ...)
"""

from tinkrl.tasks.gate import GateResult, run_gate
from tinkrl.tasks.grading import GradeResult, TaskBuildError, apply_solution, grade, start_sandbox
from tinkrl.tasks.loaders import iter_tasks, load_task
from tinkrl.tasks.model import Task, TaskLoadError

__all__ = [
    "GateResult",
    "GradeResult",
    "Task",
    "TaskBuildError",
    "TaskLoadError",
    "apply_solution",
    "grade",
    "iter_tasks",
    "load_task",
    "run_gate",
    "start_sandbox",
]
