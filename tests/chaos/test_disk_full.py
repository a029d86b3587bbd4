"""A run directory whose disk fills mid-run.

The run directory is a small tmpfs in a private mount namespace (real ENOSPC; mounting needs root,
else those tests are skipped saying so). The run is frozen just before a step appends its line to
`metrics.jsonl`, at a step whose line cannot fit in the file's last page, the disk is filled to the
last byte, and the run is let go on: the kernel takes part of the line, then refuses the rest. A
file size limit (RLIMIT_FSIZE, EFBIG) set on the frozen run does the same, exactly, to a
`checkpoints.jsonl` row. What must hold: the run stops with a one-line error naming the file and the
cause, exit code 1, no traceback; no line of either file is cut short (a nearly full disk takes
part of a write); and once space is freed, the same command resumes with every step once.
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess
from pathlib import Path

import pytest
from helpers.chaos import go_on, jsonl_rows, output, start_stopping, train, wait_stopped
from helpers.requirements import unless

TMPFS_BYTES = 4 << 20


def _why_no_tmpfs() -> str | None:
    if os.geteuid() != 0:
        return "a size-limited tmpfs needs root (CAP_SYS_ADMIN) to mount"
    probe = subprocess.run(["unshare", "--mount", "mount", "-t", "tmpfs", "tmpfs", "/mnt"], capture_output=True)
    return None if probe.returncode == 0 else f"cannot mount a tmpfs here: {probe.stderr.decode().strip()}"


needs_tmpfs = unless(_why_no_tmpfs())


class SmallDisk:
    """A tmpfs of `size` bytes at `path` inside a mount namespace of its own, which a holder process keeps alive
    (mounted by the holder itself once its namespace exists, so the mount can never land in this one)."""

    def __init__(self, path: Path, size: int):
        path.mkdir(parents=True)
        self.path, self.size = path, size
        mount = f"mount -t tmpfs -o size={size} tmpfs {path} && echo ready && exec sleep 900"
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount], stdout=subprocess.PIPE, text=True
        )
        ready = self.holder.stdout.readline().strip()
        self.prefix = ("nsenter", f"--target={self.holder.pid}", "--mount", "--")
        fs = os.statvfs(self.inside(path)) if ready == "ready" else None
        if fs is None or fs.f_blocks * fs.f_frsize != size:
            self.close()
            raise AssertionError(f"the {size}-byte tmpfs is not at {path} in its namespace")

    def inside(self, p: Path) -> Path:
        """`p` (a path under the tmpfs) as this process sees it."""
        return Path(f"/proc/{self.holder.pid}/root") / p.relative_to("/")

    def fill(self) -> Path:
        """Write a file until not one more byte fits; returns it. Only ever the small tmpfs: the filesystem is
        checked first, and the writing stops at its size whatever happens."""
        fs = os.statvfs(self.inside(self.path))
        assert fs.f_blocks * fs.f_frsize <= self.size, "not the small tmpfs: refusing to fill it"
        filler = self.inside(self.path / "filler")
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            chunk, written = 1 << 20, 0
            while chunk and written <= self.size:
                try:
                    written += os.write(fd, b"\0" * chunk)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    chunk //= 2
        finally:
            os.close(fd)
        assert written <= self.size
        return filler

    def close(self) -> None:
        """End the holder: its namespace, and the tmpfs with it, go away."""
        self.holder.kill()
        self.holder.wait()


@pytest.fixture
def disk(tmp_path):
    """A 4 MiB tmpfs for the run directory."""
    d = SmallDisk(tmp_path / "runs", TMPFS_BYTES)
    yield d
    d.close()


def assert_clean_failure(out: str, path: Path, cause: str) -> None:
    """The run's last line names the file and the cause and says how to go on; no traceback."""
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"tinkrl train: cannot write {path}: {cause}"), out[-2000:]
    assert "run the same command again" in last and "Traceback" not in out, out[-3000:]


def fill_while_logging(disk: SmallDisk, home: Path, tmp_path: Path, argv: list[str]) -> Path:
    """Run until a step's metrics line cannot fit in the file's last page, fill the disk there and let the run
    go on: the append is cut short by the kernel (part of the line fits). Returns the run dir as seen from here."""
    run = disk.path / "run"
    metrics = disk.inside(run / "metrics.jsonl")
    proc, marker = start_stopping(home, tmp_path, "log", "1+", *argv, prefix=disk.prefix)
    while True:
        pid = wait_stopped(proc, marker)
        lines = metrics.read_text().splitlines(keepends=True) if metrics.exists() else []
        room = -metrics.stat().st_size % 4096 if lines else 0
        if lines and 0 < room < len(lines[-1]) - 64:  # the lines' lengths differ by a few bytes
            break
        go_on(pid, marker)
    disk.fill()
    go_on(pid, marker)
    assert proc.wait(120) == 1
    assert_clean_failure(output(proc), run / "metrics.jsonl", "No space left on device")
    steps = [m["step"] for m in jsonl_rows(metrics)]
    assert steps == list(range(len(lines))), steps  # the cut line is gone whole
    return disk.inside(run)


def resume_after_freeing(disk: SmallDisk, home: Path, tmp_path: Path, argv: list[str], steps: int) -> None:
    disk.inside(disk.path / "filler").unlink()
    out = train(home, tmp_path, *argv, prefix=disk.prefix)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert_complete(disk.inside(disk.path / "run"), steps)


def assert_complete(run: Path, steps: int) -> None:
    assert [m["step"] for m in jsonl_rows(run / "metrics.jsonl")] == list(range(steps))
    assert [r["batch"] for r in jsonl_rows(run / "checkpoints.jsonl")] == list(range(1, steps + 1))


@needs_tmpfs
def test_disk_full_while_appending_a_metrics_line(disk, home, tmp_path):
    steps = 6
    argv = [f"max_steps={steps}", f"log_path={disk.path / 'run'}"]
    fill_while_logging(disk, home, tmp_path, argv)
    resume_after_freeing(disk, home, tmp_path, argv, steps)


@needs_tmpfs
@pytest.mark.slow  # ~40 s
def test_started_again_on_the_still_full_disk(disk, home, tmp_path):
    steps = 6
    argv = [f"max_steps={steps}", f"log_path={disk.path / 'run'}"]
    run = fill_while_logging(disk, home, tmp_path, argv)
    before = (run / "metrics.jsonl").read_text()
    again = train(home, tmp_path, *argv, prefix=disk.prefix)
    assert again.returncode == 1
    assert_clean_failure(again.stderr, disk.path / "run" / "metrics.jsonl", "No space left on device")
    assert (run / "metrics.jsonl").read_text() == before  # nothing it had is lost, nothing half-written added
    resume_after_freeing(disk, home, tmp_path, argv, steps)


@pytest.mark.slow  # ~40 s
def test_file_size_limit_while_appending_a_checkpoint_row(home, tmp_path):
    """RLIMIT_FSIZE (EFBIG) set on the frozen run just past checkpoints.jsonl's end: the next row is cut by
    the kernel after a few bytes, exactly."""
    run, steps = tmp_path / "run", 3
    argv = [f"max_steps={steps}", f"log_path={run}"]
    proc, marker = start_stopping(home, tmp_path, "commit", 2, *argv)
    pid = wait_stopped(proc, marker)
    limit = (run / "checkpoints.jsonl").stat().st_size + 40
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, limit))
    go_on(pid, marker)
    assert proc.wait(120) == 1
    assert_clean_failure(output(proc), run / "checkpoints.jsonl", "File too large")
    assert [r["batch"] for r in jsonl_rows(run / "checkpoints.jsonl")] == [1]  # step 2's row: all or nothing
    assert [m["step"] for m in jsonl_rows(run / "metrics.jsonl")] == [0, 1]
    out = train(home, tmp_path, *argv)
    assert out.returncode == 0 and "(step 1)" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    assert_complete(run, steps)
