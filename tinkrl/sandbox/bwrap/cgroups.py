"""pid and memory limits for bwrap sandboxes through cgroups (v2, else v1), one cgroup per sandbox uid.

Used only as root and only where the hierarchy is writable; otherwise `Cgroups.mode` is
"none" and the sandbox falls back to rlimits. The launcher (`bwrap_init.c --launch`) joins a
sandbox's cgroups before bwrap forks, so its processes are born inside them; without the
launcher, `descendants` lists bwrap and its server so they can be moved in after start.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


class Cgroups:
    """pid + memory limits per sandbox uid through cgroup v2 or v1; `mode` "none" when not writable."""

    NAME = "tinkrl-sandbox"

    def __init__(self, enabled: bool = True):
        self.mode = "none"
        self.bases: dict[str, Path] = {}
        if enabled and os.geteuid() == 0:
            for probe in (self._setup_v2, self._setup_v1):
                try:
                    if probe():
                        break
                except OSError:
                    self.bases = {}
            else:
                self.mode = "none"

    @staticmethod
    def _own_path(controller: str) -> str:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            if controller in ctrls.split(","):
                return path
        return "/"

    def _setup_v2(self) -> bool:
        root = Path("/sys/fs/cgroup")
        controllers = (
            (root / "cgroup.controllers").read_text().split() if (root / "cgroup.controllers").exists() else []
        )
        if not {"pids", "memory"} <= set(controllers):
            return False
        base = root / self.NAME
        (root / "cgroup.subtree_control").write_text("+pids +memory")
        base.mkdir(exist_ok=True)
        (base / "cgroup.subtree_control").write_text("+pids +memory")
        self.bases = {"unified": base}
        self.mode = "v2"
        self._probe()
        return True

    def _setup_v1(self) -> bool:
        bases = {}
        for ctrl in ("pids", "memory"):
            mount = Path("/sys/fs/cgroup") / ctrl
            if not (mount / "cgroup.procs").exists():
                return False
            own = self._own_path(ctrl).lstrip("/")
            base = mount / own / self.NAME
            base.mkdir(exist_ok=True)
            bases[ctrl] = base
        self.bases = bases
        self.mode = "v1"
        self._probe()
        return True

    def _probe(self) -> None:
        name = f"probe-{os.getpid()}"
        self.prepare(name, pids=16, memory_mb=64)
        self.remove(name)

    def _dirs(self, name: str) -> list[Path]:
        return [base / name for base in self.bases.values()]

    def procs_files(self, name: str) -> list[str]:
        """The cgroup.procs files a process writes itself into to join sandbox `name`."""
        return [str(d / "cgroup.procs") for d in self._dirs(name)]

    def prepare(self, name: str, pids: int, memory_mb: int) -> None:
        """Create (or empty) cgroup `name` with these pid and memory limits (no swap)."""
        mem = str(memory_mb * 1024 * 1024)
        for d in self._dirs(name):
            d.mkdir(exist_ok=True)
            self._kill_members(d)
        if self.mode == "v2":
            d = self.bases["unified"] / name
            (d / "pids.max").write_text(str(pids))
            (d / "memory.max").write_text(mem)
            if (d / "memory.swap.max").exists():
                (d / "memory.swap.max").write_text("0")
        elif self.mode == "v1":
            (self.bases["pids"] / name / "pids.max").write_text(str(pids))
            m = self.bases["memory"] / name
            memsw = m / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text("-1")
            (m / "memory.limit_in_bytes").write_text(mem)
            if memsw.exists():
                memsw.write_text(mem)

    def add(self, name: str, pids: list[int]) -> None:
        """Move running processes into cgroup `name` (ones already gone are skipped)."""
        for d in self._dirs(name):
            for pid in pids:
                try:
                    (d / "cgroup.procs").write_text(str(pid))
                except ProcessLookupError:
                    pass

    @staticmethod
    def _kill_members(d: Path) -> None:
        kill = d / "cgroup.kill"
        try:
            if kill.exists():
                kill.write_text("1")
                return
            for line in (d / "cgroup.procs").read_text().split():
                try:
                    os.kill(int(line), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        except OSError:
            pass

    def kill(self, name: str) -> None:
        """SIGKILL every process in cgroup `name`."""
        for d in self._dirs(name):
            self._kill_members(d)

    def remove(self, name: str) -> None:
        """Kill what is left in cgroup `name` and delete it."""
        for d in self._dirs(name):
            for _ in range(50):
                self._kill_members(d)
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.002)


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (from /proc), each parent before its children."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return out
