"""Task directories and rows: load (Harbor, terminal-bench, R2E-Gym, SWE-bench), prepare a sandbox, grade, gate.

The verifier (`verifier.py`, Harbor's name for it) grades what an agent left in the sandbox.

task = load_task("tasks/fix-permissions")
with start_sandbox(task, get_provider("bwrap")) as sb:
    ...agent acts on sb...
    result = grade(task, sb)   # GradeResult(reward, detail, ...)
"""

from tinkrl.taskdirs.gate import GateResult, run_gate
from tinkrl.taskdirs.loaders import iter_tasks, load_task
from tinkrl.taskdirs.model import Task, TaskLoadError
from tinkrl.taskdirs.verifier import GradeResult, TaskBuildError, apply_solution, grade, start_sandbox

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
