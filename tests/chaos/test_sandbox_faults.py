"""Sandbox faults in the middle of an episode: the sandbox killed, its cgroup OOM-killing it, its disk filled.

Real bwrap sandboxes run real tasks of the `shell` family; episodes are rolled out, grouped and
counted by the RL loop's own code (`rl.rollouts.do_group_rollout`, `rl.data.select_groups`,
`rl.metrics`). The policy is scripted: each episode's first reply runs `sleep` and then the
task's reference solution, the second says DONE. For the episodes picked with a fixed seed, the
sleep is a marked length, and while it runs the test finds that sandbox by its processes and
faults it:
- kill: SIGKILL of the sandbox's pid 1 (everything in it dies with it);
- oom: the kernel's OOM killer, inside the sandbox's memory cgroup, takes its pid 1 (a process
  joined to the cgroup from outside allocates past the limit; pid 1 is the chosen victim);
- disk_full: the disk where the tests write their result (/logs) filled to the last byte.

What must hold: a faulted episode is an infrastructure failure, left out of its group with its
`failure_mode` (`sandbox_died`, `sandbox_disk_full`), counted in `env/<key>/failures` and written
in the episode rows with reward null, never scored; its group's other episodes are graded as
usual (the reference solution scores 1); and the next step, on the same provider, runs clean.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from helpers.requirements import needs_bwrap
from tinker import types

from tinkrl.envs.agent_tasks.env import TaskGroupBuilder, renderer_for
from tinkrl.envs.shell.config import ShellEnvConfig
from tinkrl.envs.shell.tasks import instance, to_task
from tinkrl.rl.data import select_groups
from tinkrl.rl.metrics import episode_rows, group_metrics
from tinkrl.rl.rollouts import do_group_rollout
from tinkrl.sandbox import LazyProvider

pytestmark = needs_bwrap

SEED = 5
TEMPLATES = ["write_line", "copy_file", "count_lines"]
GROUP_SIZE = 3
FAULT_SLEEP = {"kill": "1.71", "oom": "1.72", "disk_full": "1.73"}  # the marked sleeps: which fault, where
LOGS_DISK_LIMIT = 256 << 20  # the sandbox's /logs is a tmpfs of at most this size
EXPECTED_MODE = {"kill": "sandbox_died", "oom": "sandbox_died", "disk_full": "sandbox_disk_full"}


class ScriptedPolicy:
    """A sampling client that plays each task's reference solution after a sleep, then DONE; the first
    replies numbered in `faulted` sleep a marked time instead (the fault lands during that sleep)."""

    def __init__(self, renderer, solutions: dict[str, str], faulted: dict[int, str]):
        self.renderer, self.solutions, self.faulted = renderer, solutions, faulted
        self.first_replies = 0

    def _reply(self, prompt: str) -> str:
        if "```bash" in prompt.split("<|im_start|>user")[-1] or prompt.count("<|im_start|>assistant") > 1:
            return "DONE"
        solution = next(cmd for instruction, cmd in self.solutions.items() if instruction in prompt)
        n, self.first_replies = self.first_replies, self.first_replies + 1
        sleep = FAULT_SLEEP[self.faulted[n]] if n in self.faulted else "0.3"
        return f"```bash\nsleep {sleep}; {solution}\n```"

    async def sample(self, prompt: types.ModelInput, num_samples: int, params: types.SamplingParams):
        text = self._reply(self.renderer.tokenizer.decode(prompt.to_ints(), skip_special_tokens=False))
        tokens = self.renderer.tokenizer.encode(text, add_special_tokens=False) + [self.renderer.im_end]
        seq = types.SampledSequence(
            stop_reason="stop",
            sequence_id=f"scripted-{self.first_replies}",
            tokens_np=np.asarray(tokens, dtype=np.int32),
            logprobs_np=np.full(len(tokens), -1.0, dtype=np.float32),
        )
        return types.SampleResponse(sequences=[seq])


def memcg_dir(pid: int) -> Path:
    """The memory cgroup directory of a process (cgroup v1's memory controller, or v2's unified tree)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if "memory" in ctrls.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    path = next(line for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if line.startswith("0::"))
    return Path("/sys/fs/cgroup") / path[3:].lstrip("/")


def oom_kills(cgroup: Path) -> int:
    """How many processes the kernel's OOM killer has killed in this memory cgroup."""
    for name in ("memory.events", "memory.oom_control"):
        if (cgroup / name).exists():
            m = re.search(r"^oom_kill (\d+)", (cgroup / name).read_text(), re.M)
            return int(m.group(1)) if m else 0
    return 0


def sandbox_init(cgroup: Path) -> int:
    """The sandbox's pid 1 among its cgroup's processes (the one whose pid in its own namespace is 1)."""
    for pid in (cgroup / "cgroup.procs").read_text().split():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        nspids = re.search(r"^NSpid:\s*(.+)$", status, re.M)
        if nspids and len(nspids.group(1).split()) > 1 and nspids.group(1).split()[-1] == "1":
            return int(pid)
    raise AssertionError(f"no sandbox pid 1 in {cgroup}")


# Fills a file until the disk refuses, as the sandbox's own uid (fsuid only: root keeps its right to reach
# the sandbox's root through /proc, and the file belongs to the sandbox's root inside).
# Never more than the sandbox's own small disk: the filesystem's size is checked first, and the writing
# stops past it whatever happens.
FILL = """
import ctypes, errno, os, sys
path, uid, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fs = os.statvfs(os.path.dirname(path))
if fs.f_blocks * fs.f_frsize > limit:
    sys.exit("not the sandbox's small disk: refusing to fill it")
libc = ctypes.CDLL(None)
libc.setfsgid(uid); libc.setfsuid(uid)
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
written = 0
try:
    while written <= limit:
        written += os.write(fd, bytes(65536))
    print("not full")
except OSError as e:
    print(errno.errorcode[e.errno])
"""


def find_sleep(mark: str) -> int | None:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == f"sleep\0{mark}\0".encode():
                    return int(pid)
            except OSError:
                pass
    return None


def inject(fault: str, sleeper: int, evidence: dict) -> None:
    """Fault the sandbox that runs process `sleeper`."""
    cgroup = memcg_dir(sleeper)
    init = sandbox_init(cgroup)
    if fault == "kill":
        os.kill(init, signal.SIGKILL)
    elif fault == "oom":
        before = oom_kills(cgroup)
        Path(f"/proc/{init}/oom_score_adj").write_text("1000")  # the victim the OOM killer picks first
        # charged to the sandbox's cgroup (a file in memory), while the writer's own footprint stays small
        shm = Path("/dev/shm") / f"tinkrl-chaos-oom-{os.getpid()}"
        hog = f"echo $$ > {cgroup / 'cgroup.procs'} && exec dd if=/dev/zero of={shm} bs=1M count=2048"
        try:
            subprocess.run(["sh", "-c", hog], capture_output=True, timeout=60)
        finally:
            shm.unlink(missing_ok=True)
        evidence["oom_kills"] = oom_kills(cgroup) - before
    elif fault == "disk_full":
        uid = os.stat(f"/proc/{init}").st_uid
        r = subprocess.run(
            [sys.executable, "-c", FILL, f"/proc/{init}/root/logs/fill", str(uid), str(LOGS_DISK_LIMIT)],
            capture_output=True,
            text=True,
        )
        evidence["fill"] = r.stdout.strip() or r.stderr


class Injector(threading.Thread):
    """Waits for each marked sleep to start and faults its sandbox while it runs."""

    def __init__(self, faults: list[str]):
        super().__init__(daemon=True)
        self.todo, self.evidence, self.errors = list(faults), {f: {} for f in faults}, []

    def run(self) -> None:
        deadline = time.monotonic() + 120
        while self.todo and time.monotonic() < deadline:
            for fault in list(self.todo):
                sleeper = find_sleep(FAULT_SLEEP[fault])
                if sleeper is not None:
                    try:
                        inject(fault, sleeper, self.evidence[fault])
                    except Exception as e:  # reported by the test
                        self.errors.append(f"{fault}: {type(e).__name__}: {e}")
                    self.todo.remove(fault)
            time.sleep(0.01)


def play_step(builders, policy) -> list[tuple[str, object]]:
    async def step():
        groups = await asyncio.gather(*(do_group_rollout(b, policy, 64, 1.0) for b in builders))
        return [("shell", g) for g in groups]

    return asyncio.run(step())


def test_faulted_sandboxes_are_infra_failures_and_the_run_goes_on(renderer, bwrap_provider):
    faults = list(EXPECTED_MODE)
    if bwrap_provider.cgroups.mode == "none":
        faults.remove("oom")  # no memory cgroup to run out of: the rlimit fallback has no OOM killer
    cfg = ShellEnvConfig()
    shell_renderer = renderer_for(renderer, cfg.tool_format, "shell")
    instances = [instance(name, [SEED, i]) for i, name in enumerate(TEMPLATES)]
    solutions = {inst.told: " && ".join(inst.commands) for inst in instances}
    provider = LazyProvider(bwrap_provider)
    builders = [TaskGroupBuilder(to_task(i), cfg, shell_renderer, provider, GROUP_SIZE, "shell") for i in instances]
    episodes = len(instances) * GROUP_SIZE
    faulted = dict(zip(random.Random(SEED).sample(range(episodes), len(faults)), faults))

    injector = Injector(faults)
    injector.start()
    keyed = play_step(builders, ScriptedPolicy(shell_renderer, solutions, faulted))
    injector.join(5)
    assert not injector.errors and not injector.todo, (injector.errors, injector.todo)

    failures = [t for _, g in keyed for t in g.failures]
    modes = sorted(t.failure_mode for t in failures)
    assert modes == sorted(EXPECTED_MODE[f] for f in faults), [(t.failure_mode, t.failure_detail) for t in failures]
    if "oom" in faults:
        assert injector.evidence["oom"]["oom_kills"] >= 1  # the kernel's OOM killer did it, not the test
    if "disk_full" in faults:
        assert injector.evidence["disk_full"]["fill"] == "ENOSPC"
    ok = [r for _, g in keyed for r in g.total_rewards()]
    assert ok == [1.0] * (episodes - len(faults))  # the rest of each group graded as usual
    m = group_metrics(keyed)
    assert m["env/shell/failures"] == len(faults) and m["env/shell/total_episodes"] == episodes - len(faults)
    rows = [r for r in episode_rows(keyed, 0, shell_renderer.tokenizer, set()) if r.get("failure_mode")]
    assert len(rows) == len(faults) and all(r["reward"] is None and r["failure_detail"] for r in rows)
    kept, sel = select_groups(keyed, {"shell": GROUP_SIZE - 2}, remove_constant=False)
    assert len(kept) == sum(len(g.failures) <= GROUP_SIZE - 2 for _, g in keyed)

    # the next step, same provider, no faults: every episode runs and scores
    again = play_step(builders, ScriptedPolicy(shell_renderer, solutions, {}))
    assert [r for _, g in again for r in g.total_rewards()] == [1.0] * episodes
    assert group_metrics(again)["env/shell/failures"] == 0
