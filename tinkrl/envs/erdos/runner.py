"""Runs model-written Erdős programs in a sandbox and reads back the construction h.

Protocol (told to the model in the prompt): the program defines `run()` returning the
n_points values of h (a tuple's first item is taken as h, so the published `(h, c5, n)`
form also works). `np`, `n_points` and `initial_h_values` (the starting construction) are
predefined. A small driver inside the sandbox executes the program under an address-space
limit, calls `run`, and saves what it returned as `.npy` (no pickles); stdout is captured.

The host trusts nothing but that array: it validates h and computes C₅ itself, so a value
the program prints or returns alongside h has no effect on the reward. The driver's status
file only chooses the reason string for a failure; a program that tampers with it or
writes the output file directly still has its h checked like any other.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass

import numpy as np

from tinkrl.envs.erdos import overlap as em
from tinkrl.sandbox.base import SandboxProvider, SandboxSpec

# Reasons of execution failures (validation reasons are in overlap.py).
NO_CODE = "no_code"  # the response has no ```python block
NO_RUN_FUNCTION = "no_run_function"  # the program defines no callable run()
RUNTIME_ERROR = "runtime_error"  # the program raised
TIMEOUT = "timeout"  # wall or CPU time limit
MEMORY_LIMIT = "memory_limit"  # MemoryError, or killed by the memory limit
NO_OUTPUT = "no_output"  # run() returned None or nothing was written
BAD_OUTPUT = "bad_output"  # not convertible to an array of floats
CRASHED = "crashed"  # the interpreter died for another reason
# the driver's status of a program that failed, as the reason recorded for it
_STATUS_REASONS = dict(
    exception=RUNTIME_ERROR, no_run_function=NO_RUN_FUNCTION, no_output=NO_OUTPUT, bad_output=BAD_OUTPUT
)

WORKDIR = "/app"
_PYTHON = "/usr/bin/python3"  # Debian's python3 with numpy/scipy (scripts/install-system.sh)

_DRIVER = r"""
import inspect, json, resource, sys, traceback

def report(status, detail=""):
    with open("/app/out/status.json", "w") as f:
        json.dump({"status": status, "detail": detail[-1500:]}, f)

limit = int(sys.argv[1]) * 1024 * 1024
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
cpu = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
import numpy as np

spec = json.load(open("/app/input.json"))
initial = np.array(spec["initial_h"], dtype=np.float64)
namespace = {"__name__": "__solution__", "np": np, "numpy": np, "n_points": spec["n_points"],
             "initial_h_values": initial.copy()}
offered = {"seed": spec["seed"], "budget_s": spec["budget_s"], "n_points": spec["n_points"],
           "initial_h_values": initial.copy()}
try:
    source = open("/app/solution.py").read()
    exec(compile(source, "solution.py", "exec"), namespace)
    run = namespace.get("run")
    if callable(run):
        params = inspect.signature(run).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        result = run(**{k: v for k, v in offered.items() if takes_any or k in params})
except MemoryError:
    report("memory", traceback.format_exc())
    sys.exit(0)
except BaseException:
    report("exception", traceback.format_exc())
    sys.exit(0)
if not callable(run):
    report("no_run_function", "the program must define run() returning h")
    sys.exit(0)
if isinstance(result, tuple) and result:
    result = result[0]
if result is None:
    report("no_output", "run() returned None")
    sys.exit(0)
try:
    values = np.asarray(result, dtype=np.float64)
except BaseException as exc:
    report("bad_output", "run() returned %s: %s" % (type(result).__name__, exc))
    sys.exit(0)
np.save("/app/out/h.npy", values, allow_pickle=False)
report("ok")
"""

_CODE_BLOCK = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(text: str) -> str | None:
    """The last ```python block of a response (an unterminated final block counts)."""
    blocks = [b for b in _CODE_BLOCK.findall(text) if b.strip()]
    return blocks[-1] if blocks else None


@dataclass
class RunOutcome:
    """What one program produced: a validated h (with C₅) or why it scored 0."""

    h: np.ndarray | None
    c5: float | None
    reason: str | None
    detail: str = ""
    stdout_tail: str = ""
    duration_s: float = 0.0

    @property
    def valid(self) -> bool:
        return self.c5 is not None

    @property
    def reward(self) -> float:
        return em.reward_for(self.c5)


def invalid(reason: str, detail: str = "", stdout_tail: str = "", duration_s: float = 0.0) -> RunOutcome:
    """A RunOutcome that scores 0 for `reason`."""
    return RunOutcome(None, None, reason, detail, stdout_tail, duration_s)


def score_values(
    values, n_points: int, integral_tol: float, stdout_tail: str = "", duration_s: float = 0.0
) -> RunOutcome:
    """Validate a program's returned values as h and compute its C₅, or say why they are invalid."""
    checked = em.validate(values, n_points, integral_tol)
    if not checked.valid:
        return invalid(checked.reason or "invalid", checked.detail, stdout_tail, duration_s)
    assert checked.h is not None
    return RunOutcome(checked.h, em.c5(checked.h), None, "", stdout_tail, duration_s)


@dataclass
class ProgramRunner:
    """Executes Erdős programs, one fresh sandbox each."""

    provider: SandboxProvider
    n_points: int
    timeout_s: float = 60.0
    memory_mb: int = 1024
    integral_tol: float = 1e-6
    stdout_tail_chars: int = 500

    def run(self, code: str, initial_h: np.ndarray, seed: int = 0) -> RunOutcome:
        """Run one program (blocking). Sandbox infrastructure errors propagate as SandboxError."""
        budget = max(1.0, self.timeout_s - 2.0)
        spec = SandboxSpec(
            workdir=WORKDIR,
            memory_mb=self.memory_mb + 256,
            pids=64,
            network=False,
            env={
                "OPENBLAS_NUM_THREADS": "1",
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
            },
        )
        sandbox = self.provider.create(spec)
        try:
            sandbox.write_file(f"{WORKDIR}/solution.py", code)
            sandbox.write_file(f"{WORKDIR}/driver.py", _DRIVER)
            sandbox.write_file(
                f"{WORKDIR}/input.json",
                json.dumps(
                    {
                        "n_points": self.n_points,
                        "seed": seed,
                        "budget_s": budget,
                        "initial_h": [float(v) for v in initial_h],
                    }
                ),
            )
            sandbox.exec(f"mkdir -p {WORKDIR}/out", timeout=30)
            cpu_s = int(self.timeout_s) + 1
            result = sandbox.exec(
                f"{_PYTHON} {WORKDIR}/driver.py {self.memory_mb} {cpu_s}", timeout=self.timeout_s, workdir=WORKDIR
            )
            tail = result.stdout[-self.stdout_tail_chars :] if self.stdout_tail_chars else ""
            took = result.duration_s
            if result.timed_out:
                return invalid(TIMEOUT, f"the program ran longer than {self.timeout_s:g} s", tail, took)
            try:
                status = json.loads(sandbox.read_file(f"{WORKDIR}/out/status.json"))
                if not isinstance(status, dict):
                    raise ValueError("status is not an object")
            except (FileNotFoundError, ValueError):
                status = None
            if status is None:
                # The interpreter died without reporting: a signal from a limit, or exit().
                code_ = result.exit_code
                if code_ in (137, -9):
                    return invalid(MEMORY_LIMIT, "killed (memory limit)", tail, took)
                if code_ in (152, -24, 158):
                    return invalid(TIMEOUT, "CPU time limit exceeded", tail, took)
                if code_ == 0:
                    return invalid(NO_OUTPUT, "the program exited before run() returned", tail, took)
                return invalid(CRASHED, f"exit code {code_}: {result.stderr[-300:]}", tail, took)
            kind = str(status.get("status"))
            detail = str(status.get("detail", ""))[-600:]
            if kind == "memory":
                return invalid(MEMORY_LIMIT, f"MemoryError (limit {self.memory_mb} MB)", tail, took)
            if kind in _STATUS_REASONS:
                return invalid(_STATUS_REASONS[kind], detail, tail, took)
            try:
                raw = sandbox.read_file(f"{WORKDIR}/out/h.npy")
            except FileNotFoundError:
                return invalid(NO_OUTPUT, "run() produced no array", tail, took)
            if len(raw) > 8 * self.n_points + 4096:
                return invalid(
                    BAD_OUTPUT, f"output is {len(raw)} bytes, far more than {self.n_points} floats", tail, took
                )
            try:
                values = np.load(io.BytesIO(raw), allow_pickle=False)
            except (ValueError, OSError, EOFError) as exc:
                return invalid(BAD_OUTPUT, f"unreadable array: {exc}"[:300], tail, took)
            return score_values(values, self.n_points, self.integral_tol, tail, took)
        finally:
            sandbox.close()
