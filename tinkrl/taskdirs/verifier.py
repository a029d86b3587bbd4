"""The verifier: preparing a task's sandbox and grading what the agent left in it.

Grading integrity, in order: every agent process is killed; files that steer test runs
(conftest.py, pytest/tox/setup.cfg/pyproject configs, sitecustomize.py, a `pytest.py`
shadow, ...) are reset to the task's originals and new ones removed; /tests and
/logs/verifier are emptied and the tests copied in fresh from the task; the tests run
under `env -i` with PATH pinned to the read-only system dirs (so `python3`/`pytest` are
Debian's) and no user site-packages; whatever they started is killed before the result is
read. Graders: Harbor reward file, pytest summary (terminal-bench), R2E-Gym expected
output, SWE-bench FAIL_TO_PASS/PASS_TO_PASS through the official swebench package's
per-repo parsers and grading (`swebench_harness`).

A task with a container image (`Task.image`) runs from that image on docker/kubernetes and
its local build is skipped. The originals that grading restores (test-steering files, the
task's `restore_paths`) are then read from the fresh sandbox before the agent starts, and
hidden tests kept in the image (`image_tests`) are taken out of it until grading.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import weakref
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from tinkrl.errors import ConfigError
from tinkrl.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxProvider, SandboxSpec
from tinkrl.sandbox.build import BuildError, FileCopy, put_files
from tinkrl.sandbox.build import start_sandbox as start_built
from tinkrl.taskdirs import swebench_harness
from tinkrl.taskdirs.loaders import PROTECTED_NAMES
from tinkrl.taskdirs.model import Task, TaskLoadError

PINNED_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "TMPDIR": "/tmp",
    "PYTHONNOUSERSITE": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "GIT_CONFIG_NOSYSTEM": "1",
}
PASS_STATUSES = {"PASSED", "XFAIL", "SKIPPED"}
STATUS_RANK = {"PASSED": 0, "XFAIL": 1, "SKIPPED": 2, "XPASS": 3, "FAILED": 4, "ERROR": 5}
SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+\s*$")
OUTPUT_TAIL = 4000


@dataclass
class GradeResult:
    """A grader's verdict: the reward, a one-line reason, and what it read (test statuses, reward keys, output tail)."""

    reward: float
    detail: str  # one line: why this reward
    tests: dict[str, str] = field(default_factory=dict)  # parsed test statuses, when the grader has them
    rewards: dict[str, float] = field(default_factory=dict)  # every key of a reward.json
    output: str = ""  # tail of the verifier's output
    exit_code: int | None = None


class TaskBuildError(TaskLoadError):
    """A build step (Dockerfile RUN, setup.sh) failed in the sandbox."""


# -- sandbox preparation ---------------------------------------------------------------------


@dataclass
class _Baseline:
    """What an image-run sandbox held before the agent started (read by the host)."""

    files: dict[str, bytes]  # absolute path -> content: protected files and restore_paths
    restore: list[str]  # paths emptied and refilled from `files` before grading
    hidden_tests: dict[str, bytes]  # path relative to the image_tests dir -> content
    path: str = ""  # the image's PATH (its python/pytest may live outside the system dirs)


_BASELINES: weakref.WeakKeyDictionary[Sandbox, _Baseline] = weakref.WeakKeyDictionary()


def uses_image(task: Task, provider: SandboxProvider) -> bool:
    """Whether `provider` runs `task` from its image (True) or builds its local workspace (False).

    The image wins wherever a provider can run one; bwrap builds the workspace, and a task
    with only an image is a ConfigError there naming the task, the image and the fix.
    """
    if not task.image:
        return False
    if provider.runs_images:
        return True
    if task.build:
        return False
    why = task.metadata.get("tinkrl_build_error")
    raise ConfigError(
        f"task {task.id} ({task.source}) needs the container image {task.image!r}, which the "
        f"{provider.name} sandbox cannot run: set sandbox.provider=docker or kubernetes"
        + (f" (its Dockerfile cannot be built without one: {why})" if why else " (or give the task a local workspace)")
    )


def sandbox_spec(task: Task, provider: SandboxProvider | None = None) -> SandboxSpec:
    """The spec `provider` starts for `task`: with the task's image unless it builds the workspace, and with
    the task's Dockerfile directory for a provider that builds it (the build steps are then not run)."""
    image = task.image if provider is None or uses_image(task, provider) else None
    builds = provider is not None and provider.builds_definitions and not image and task.definition is not None
    return SandboxSpec(
        workdir=task.workdir,
        env=dict(task.env),
        memory_mb=task.memory_mb,
        pids=task.pids,
        disk_mb=task.disk_mb,
        cpu=task.cpus,
        labels={"task": task.id},
        image=image,
        definition=str(task.definition) if builds else None,
    )


def _files_under(sandbox: Sandbox, task: Task, find_args: str) -> list[str]:
    r = sandbox.exec(_pinned(f"find {find_args} 2>/dev/null; true", task), timeout=120, workdir="/")
    return [p for p in r.stdout.split("\0") if p]


def _read_baseline(task: Task, sandbox: Sandbox) -> _Baseline:
    """Read (host-side, before the agent runs) what grading restores, from the image itself."""
    quoted = " ".join(shlex.quote(p) for p in task.restore_paths)
    paths = _files_under(
        sandbox,
        task,
        f"{shlex.quote(task.workdir)} -xdev \\( {_protected_names()} \\) -prune -exec find {{}} -type f -print0 \\;",
    )
    if quoted:
        paths += _files_under(sandbox, task, f"{quoted} -type f -print0")
    files = {p: sandbox.read_file(p) for p in dict.fromkeys(paths)}
    env_path = sandbox.exec('printf %s "$PATH"', timeout=30, workdir="/")
    image_path = env_path.stdout.strip() if env_path.exit_code == 0 else ""
    hidden: dict[str, bytes] = {}
    if task.image_tests:
        root = task.image_tests.rstrip("/")
        for p in _files_under(sandbox, task, f"{shlex.quote(root)} -type f -print0"):
            hidden[p[len(root) + 1 :]] = sandbox.read_file(p)
        if not hidden:
            raise TaskLoadError(
                task.source, f"task {task.id}: the image {task.image} has no hidden tests in {root}", "image_tests"
            )
        gone = sandbox.exec(_pinned(f"rm -rf -- {shlex.quote(root)}", task), timeout=60, workdir="/")
        if gone.exit_code != 0:
            raise TaskLoadError(
                task.source, f"task {task.id}: cannot hide {root}: {gone.output.strip()[-200:]}", "image_tests"
            )
    return _Baseline(files=files, restore=list(task.restore_paths), hidden_tests=hidden, path=image_path)


def start_sandbox(task: Task, provider: SandboxProvider, spec: SandboxSpec | None = None) -> Sandbox:
    """A fresh sandbox with the task's workspace built (by its build steps, or by the provider from the task's
    Dockerfile; or its image started, and what grading restores read from it): what the agent starts from.
    `spec` is the task's own (`sandbox_spec`) unless the caller changed it (the network). A failed build step
    is a TaskBuildError naming the step."""
    spec = spec or sandbox_spec(task, provider)
    try:
        sandbox = start_built(provider, spec, [] if spec.image or spec.definition else task.build)
    except BuildError as e:
        raise TaskBuildError(e.origin, e.message) from None
    if spec.image:
        try:
            _BASELINES[sandbox] = _read_baseline(task, sandbox)
        except BaseException:
            sandbox.close()
            raise
    return sandbox


def apply_solution(task: Task, sandbox: Sandbox, timeout: float | None = None) -> ExecResult:
    """Run the task's reference solution as an agent would (for the gate)."""
    if not task.has_solution:
        raise TaskLoadError(task.source, f"task {task.id} has no solution to run", "solution")
    put_files(sandbox, task.solution)
    return sandbox.exec(task.solution_command, timeout=timeout or task.agent_timeout_s, workdir=task.workdir)


# -- grading ---------------------------------------------------------------------------------
def _pinned(command: str, task: Task, sandbox: Sandbox | None = None) -> str:
    """`command` under `env -i` with the pinned environment (PATH: the image's own, read at start)."""
    baseline = _BASELINES.get(sandbox) if sandbox is not None else None
    env = {**PINNED_ENV, **({"PATH": baseline.path} if baseline and baseline.path else {}), **task.verifier_env}
    return (
        "exec env -i "
        + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        + " /bin/bash --noprofile --norc -c "
        + shlex.quote(command)
    )


def _protected_names() -> str:
    return " -o ".join(f"-name {shlex.quote(n)}" for n in PROTECTED_NAMES + ("*.pth",))


def reset_protected_files(task: Task, sandbox: Sandbox) -> list[str]:
    """Reset test-steering files in the workspace to the task's originals; remove planted ones.

    The originals are the task's (from its local build) or, for a sandbox started from the
    task's image, what the image held; `restore_paths` are reset to that state too.
    """
    baseline = _BASELINES.get(sandbox)
    originals = task.original_files if baseline is None else baseline.files
    find = f"find {shlex.quote(task.workdir)} -xdev \\( {_protected_names()} \\) -prune -print0 2>/dev/null; true"
    found = sandbox.exec(_pinned(find, task, sandbox), timeout=60, workdir="/").stdout.split("\0")
    removed = [path for path in found if path and path not in originals]
    if baseline is not None:
        removed += baseline.restore
    if removed:
        sandbox.exec(
            _pinned("rm -rf -- " + " ".join(shlex.quote(p) for p in removed), task, sandbox), timeout=60, workdir="/"
        )
    for path, data in originals.items():
        sandbox.write_file(path, data, 0o644)
    return removed


def parse_pytest_summary(output: str) -> dict[str, str]:
    """{node id: status} from the last `short test summary info` block of `pytest -rA` output.

    Lines outside that block (anything the code under test printed, like a fake
    "PASSED test_x") are ignored; a test listed twice keeps its worst status.
    """
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if SUMMARY_HEADER.match(line)]
    if not starts:
        return {}
    statuses: dict[str, str] = {}
    for line in lines[starts[-1] + 1 :]:
        if line.startswith("="):
            break
        status, _, rest = line.partition(" ")
        if status not in STATUS_RANK or not rest or rest.startswith("["):
            continue
        node = rest.split(" - ", 1)[0].strip()
        if STATUS_RANK[status] >= STATUS_RANK.get(statuses.get(node, "PASSED"), 0):
            statuses[node] = status
    return statuses


def r2e_key(node_id: str) -> str:
    """R2E-Gym's test key: the node id without its file part ("TestA.test_b")."""
    return ".".join(node_id.split("::")[1:]) or node_id


def grade_reward_file(files: dict[str, bytes | None]) -> GradeResult:
    """Grade Harbor's reward file: reward.json (its `reward` key, else the mean of its numbers), else
    reward.txt; reward 0 with the reason when it is missing or malformed."""
    raw_json, raw_txt = files.get("reward.json"), files.get("reward.txt")
    if raw_json is not None:
        try:
            data = json.loads(raw_json)
        except ValueError:
            return GradeResult(0.0, "reward.json is not valid JSON")
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            data = {"reward": data}
        if (
            not isinstance(data, dict)
            or not data
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in data.values())
        ):
            return GradeResult(0.0, "reward.json must be an object of numbers")
        rewards = {str(k): float(v) for k, v in data.items()}
        if not all(math.isfinite(v) for v in rewards.values()):
            return GradeResult(0.0, "reward.json has a non-finite value", rewards=rewards)
        reward = rewards["reward"] if "reward" in rewards else sum(rewards.values()) / len(rewards)
        return GradeResult(reward, f"reward.json: {reward:g}", rewards=rewards)
    if raw_txt is not None:
        try:
            reward = float(raw_txt.decode().strip())
        except (UnicodeDecodeError, ValueError):
            return GradeResult(0.0, f"reward.txt is not a number: {raw_txt[:40]!r}")
        if not math.isfinite(reward):
            return GradeResult(0.0, "reward.txt is not finite")
        return GradeResult(reward, f"reward.txt: {reward:g}", rewards={"reward": reward})
    return GradeResult(0.0, "the tests wrote no /logs/verifier/reward.txt or reward.json")


def grade_pytest(output: str) -> GradeResult:
    """1 when pytest's summary lists tests and none failed (XFAIL and SKIPPED count as passing), else 0."""
    tests = parse_pytest_summary(output)
    if not tests:
        return GradeResult(0.0, "no pytest summary in the test output (run pytest with -rA)")
    failed = sorted(t for t, s in tests.items() if s not in PASS_STATUSES)
    if failed:
        return GradeResult(0.0, f"{len(failed)}/{len(tests)} tests failed: {', '.join(failed[:3])}", tests)
    return GradeResult(1.0, f"all {len(tests)} tests passed", tests)


def grade_r2e(output: str, expected: dict[str, str]) -> GradeResult:
    """1 when every test's status matches R2E-Gym's expected output exactly, else 0."""
    parsed = {r2e_key(k): v for k, v in parse_pytest_summary(output).items()}
    want = {r2e_key(k) if "::" in k else k: v for k, v in expected.items()}
    if not parsed:
        return GradeResult(0.0, "no pytest summary in the test output", parsed)
    wrong = sorted(k for k in set(want) | set(parsed) if parsed.get(k) != want.get(k))
    if wrong:
        k = wrong[0]
        return GradeResult(
            0.0,
            f"{len(wrong)} tests differ from the expected output, e.g. {k}: "
            f"got {parsed.get(k, 'missing')}, expected {want.get(k, 'absent')}",
            parsed,
        )
    return GradeResult(1.0, f"all {len(want)} tests match the expected output", parsed)


def grade_swebench(output: str, f2p: list[str], p2p: list[str], repo: str = "") -> GradeResult:
    """1 when swebench's parser for `repo` and its grading call the instance resolved (every FAIL_TO_PASS test
    passes or xfails, no PASS_TO_PASS test fails or errors), else 0; see `swebench_harness`."""
    try:
        v = swebench_harness.grade_log(output, f2p, p2p, repo)
    except swebench_harness.SwebenchMissing as e:
        return GradeResult(0.0, str(e))
    tests = v.tests
    if v.resolved:
        return GradeResult(1.0, f"resolved: {len(f2p)} FAIL_TO_PASS and {len(p2p)} PASS_TO_PASS pass", tests)
    f2p_ok = set(v.report["FAIL_TO_PASS"]["success"])
    f2p_bad = [t for t in f2p if t not in f2p_ok]
    p2p_bad = v.report["PASS_TO_PASS"]["failure"]
    parts = []
    if f2p_bad:
        parts.append(
            f"FAIL_TO_PASS {len(f2p) - len(f2p_bad)}/{len(f2p)} ({f2p_bad[0]}: {tests.get(f2p_bad[0], 'missing')})"
        )
    if p2p_bad:
        parts.append(
            f"PASS_TO_PASS {len(p2p) - len(p2p_bad)}/{len(p2p)} ({p2p_bad[0]}: {tests.get(p2p_bad[0], 'missing')})"
        )
    return GradeResult(0.0, f"not resolved ({v.status}): " + "; ".join(parts or ["no tests parsed"]), tests)


def _check_room_for_results(task: Task, sandbox: Sandbox) -> None:
    """SandboxError (`sandbox_disk_full`) when /logs/verifier has no room left: the tests could not write their
    result, which says nothing of the agent's work, so the episode must not be scored 0 for it."""
    probe = "head -c 4096 /dev/zero > /logs/verifier/.room; code=$?; rm -f /logs/verifier/.room; exit $code"
    r = sandbox.exec(_pinned(probe, task, sandbox), timeout=30, workdir="/")
    if r.exit_code != 0 and "No space left" in r.output:
        raise SandboxError(
            "the sandbox's disk is full: the tests could not write their result to /logs/verifier", "sandbox_disk_full"
        )


def _read_optional(sandbox: Sandbox, path: str) -> bytes | None:
    try:
        return sandbox.read_file(path)
    except OSError:
        return None


def grade(task: Task, sandbox: Sandbox) -> GradeResult:
    """Kill the agent, copy the tests in fresh, run them pinned, and score the result."""
    sandbox.kill_all()
    reset_protected_files(task, sandbox)
    clean = "find /tests -mindepth 1 -delete; rm -rf /logs/verifier; mkdir -p /logs/verifier"
    sandbox.exec(_pinned(clean, task, sandbox), timeout=60, workdir="/")
    put_files(sandbox, task.tests)
    baseline = _BASELINES.get(sandbox)
    if baseline is not None and baseline.hidden_tests:
        dest = f"/tests/{PurePosixPath(task.image_tests.rstrip('/')).name}"
        put_files(sandbox, [FileCopy(dest=f"{dest}/{rel}", data=data) for rel, data in baseline.hidden_tests.items()])
    if task.pre_test_command:
        pre = sandbox.exec(_pinned(task.pre_test_command, task, sandbox), timeout=120, workdir=task.workdir)
        if pre.exit_code != 0:
            sandbox.kill_all()
            return GradeResult(
                0.0,
                f"preparing the tests failed (exit {pre.exit_code}): {pre.output.strip()[-300:]}",
                output=pre.output[-OUTPUT_TAIL:],
                exit_code=pre.exit_code,
            )
    r = sandbox.exec(_pinned(task.test_command, task, sandbox), timeout=task.verifier_timeout_s, workdir=task.workdir)
    sandbox.kill_all()  # nothing the tests started may touch the results after this point
    output = r.output
    if r.timed_out:
        return GradeResult(
            0.0, f"the tests timed out after {task.verifier_timeout_s:g}s", output=output[-OUTPUT_TAIL:], exit_code=None
        )
    if task.grader == "reward_file":
        files = {name: _read_optional(sandbox, f"/logs/verifier/{name}") for name in ("reward.json", "reward.txt")}
        if not any(files.values()):
            _check_room_for_results(task, sandbox)
        res = grade_reward_file(files)
    elif task.grader == "pytest":
        res = grade_pytest(output)
    elif task.grader == "r2e":
        res = grade_r2e(output, task.expected["tests"])
    elif task.grader == "swebench":
        res = grade_swebench(
            output, task.expected["FAIL_TO_PASS"], task.expected["PASS_TO_PASS"], task.expected.get("repo", "")
        )
    else:
        raise TaskLoadError(task.source, f"unknown grader {task.grader!r}", "grader")
    res.output, res.exit_code = output[-OUTPUT_TAIL:], r.exit_code
    return res
