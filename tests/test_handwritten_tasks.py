"""The hand-written shell tasks in tasks/ that the agent job evaluates: each one's reference solution
scores 1 when run from any working directory, doing nothing scores 0, and the mistakes a small shell
agent makes (appending by overwriting, `sort -r` for A-Z, `uniq` for a first line, `rmdir` on a file, a
copy under the wrong name, `head` for `tail`, a lexical sort of numbers, `uniq` on unsorted lines, a
too-greedy glob or `sed`) score 0 too."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.requirements import needs_bwrap

from tinkrl.sandbox.build import put_files
from tinkrl.taskdirs import grade, load_task, start_sandbox

pytestmark = needs_bwrap

TASKS = Path(__file__).resolve().parents[1] / "tasks"
SHELL_TASKS = [
    "hello-file",
    "tb-hello",
    "fix-permissions",
    "append-host",
    "first-line",
    "sort-guests",
    "remove-empty-dir",
    "delete-debug-log",
    "backup-config",
    "count-errors",
    "archive-report",
    "rename-draft",
    "fix-spelling",
    "count-lines",
    "tail-log",
    "make-release-dir",
    "copy-settings",
    "clean-tmp-files",
    "extract-warnings",
    "drop-deprecated",
    "uppercase-codes",
    "count-inbox",
    "set-log-level",
    "sort-latencies",
    "unique-ips",
]
NEAR_MISSES = {
    "append-host": "echo '192.168.1.50 printer.lan' > /app/hosts.txt",
    "first-line": "cd /app && uniq data/measurements.csv > header.txt",
    "sort-guests": "sort -r /app/guests.txt > /app/guests_sorted.txt",
    "remove-empty-dir": "rm -r /app/reports /app/old_reports",
    "delete-debug-log": "rm -f /app/logs/*",
    "backup-config": "cp /app/config.ini /app/config.bak",
    "count-errors": "grep ERROR /app/server.log > /app/error_count.txt",
    "archive-report": "cd /app && mkdir archive && cp report_2023.txt archive/",
    "rename-draft": "mv /app/notes/draft.md /app/final.md",
    "fix-spelling": "sed -i 's/colour/color/' /app/notes.txt && echo color >> /app/notes.txt",
    "count-lines": "wc -l data/users.csv > line_count.txt",
    "tail-log": "head -n 5 /app/logs/error.log > /app/recent.log",
    "make-release-dir": "mkdir -p releases/v2.4.0 assets",
    "copy-settings": "mv /app/settings.yaml /app/deploy/",
    "clean-tmp-files": "rm -f cache/*tmp*",
    "extract-warnings": "grep -c WARN /app/logs/worker.log > /app/warnings.log",
    "drop-deprecated": "grep deprecated backend/requirements.txt > backend/requirements.clean.txt",
    "uppercase-codes": "tr A-Z a-z < airports.txt > airports_upper.txt",
    "count-inbox": "ls -l /app/inbox | wc -l > /app/inbox_count.txt",
    "set-log-level": "sed -i 's/debug/info/g' service.env",
    "sort-latencies": "sort results/latency.txt > results/sorted.txt",
    "unique-ips": "uniq /app/logs/blocked_ips.txt > /app/unique_ips.txt",
}


def _reward_after(name: str, bwrap_provider, command: str | None, workdir: str = "/app") -> float:
    """The task's grade after `command` (None: the reference solution) ran from `workdir` in a fresh sandbox."""
    task = load_task(TASKS / name)
    sandbox = start_sandbox(task, bwrap_provider)
    try:
        if command is None:
            put_files(sandbox, task.solution)
            command = task.solution_command
        if command:
            result = sandbox.exec(command, timeout=60, workdir=workdir)
            assert result.exit_code == 0, (name, command, result.output)
        return grade(task, sandbox).reward
    finally:
        sandbox.close()


@pytest.mark.parametrize("name", SHELL_TASKS)
def test_the_solution_passes_from_any_directory_and_doing_nothing_fails(name, bwrap_provider) -> None:
    for workdir in ("/", "/tmp"):
        assert _reward_after(name, bwrap_provider, None, workdir) == 1.0, (name, workdir)
    assert _reward_after(name, bwrap_provider, "") == 0.0


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_a_near_miss_fails(name, bwrap_provider) -> None:
    assert _reward_after(name, bwrap_provider, NEAR_MISSES[name]) == 0.0


def test_every_new_task_is_in_harbor_layout_and_names_its_files() -> None:
    """Each task written for the agent job has Harbor's files, works in /app, and its instruction names a
    file or directory of its workspace as it is (absolute or relative)."""
    for name in NEAR_MISSES:
        d = TASKS / name
        assert all((d / f).is_file() for f in ("task.toml", "instruction.md", "environment/Dockerfile")), name
        assert (d / "tests/test.sh").is_file() and (d / "solution/solve.sh").is_file(), name
        task = load_task(d)
        assert task.workdir == "/app" and task.format == "harbor", name
        files = [p.relative_to(d / "environment") for p in (d / "environment").rglob("*") if p.name != "Dockerfile"]
        named = {str(f) for f in files} | {f.name for f in files} | {"/app/" + str(f) for f in files}
        assert any(n in task.instruction for n in named), (name, task.instruction)


def test_the_agent_job_evaluates_every_hand_written_shell_task() -> None:
    """`make train-agent`'s held-out set holds each of these tasks, so its hand-written figure covers them all."""
    import yaml

    config = yaml.safe_load((TASKS.parent / "configs/agent.yaml").read_text())
    assert config["env_config"]["eval_tasks"] == [f"tasks/{name}" for name in SHELL_TASKS]
