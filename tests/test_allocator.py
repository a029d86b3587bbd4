"""The `tinkrl` command on tcmalloc (`tinkrl/allocator.py`).

What must hold: the command restarts itself once with tcmalloc loaded where the machine has it;
what it starts (a sandboxed command, a task's tests) inherits no preload; `TINKRL_ALLOCATOR=system`
keeps glibc's malloc; a `tinkrl` started by a `tinkrl` gets tcmalloc too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers.requirements import unless

from tinkrl.allocator import TCMALLOC, tcmalloc_path

# What a process reports of itself: whether tcmalloc is mapped, its preload and mark, and what a child sees.
REPORT = """
import json, os, subprocess, sys
from tinkrl.allocator import reexec_on_tcmalloc
reexec_on_tcmalloc()
child = subprocess.run(["sh", "-c", "echo \\"$LD_PRELOAD|$TINKRL_ALLOCATOR\\""], capture_output=True, text=True)
maps = open("/proc/self/maps").read()
print(json.dumps({"loaded": "tcmalloc" in maps, "preload": os.environ.get("LD_PRELOAD", ""),
                  "mark": os.environ.get("TINKRL_ALLOCATOR", ""), "child": child.stdout.strip()}))
"""

needs_tcmalloc = unless(
    None if tcmalloc_path() else f"no {TCMALLOC} here (`make install` installs libtcmalloc-minimal4)"
)


def report(**env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TINKRL_ALLOCATOR")}
    out = subprocess.run([sys.executable, "-c", REPORT], env={**environ, **env}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_tcmalloc
def test_the_command_runs_on_tcmalloc_and_its_children_inherit_nothing():
    seen = report()
    assert seen == {"loaded": True, "preload": "", "mark": "", "child": "|"}


@needs_tcmalloc
def test_a_users_preload_is_kept_and_system_keeps_glibc():
    assert report(TINKRL_ALLOCATOR="system") == {"loaded": False, "preload": "", "mark": "system", "child": "|system"}
    other = tcmalloc_path().replace(TCMALLOC, "libdl.so.2")  # any other library the user preloads
    seen = report(LD_PRELOAD=other)
    assert seen["loaded"] and seen["preload"] == other and seen["child"] == f"{other}|"


# Frees a tensor of many small blocks (which either allocator keeps for reuse), then releases them.
RELEASE = """
import json
from tinkrl.allocator import reexec_on_tcmalloc, release_free_memory
reexec_on_tcmalloc()
import torch
def rss(): return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) << 10
before = rss()
blocks = [torch.ones(64 << 10, dtype=torch.uint8) for _ in range(8 << 10)]  # 512 MiB in 64 KiB blocks
held = rss()
del blocks
kept = rss()
release_free_memory()
print(json.dumps({"held": held - before, "kept": kept - before, "released": rss() - before}))
"""


@needs_tcmalloc
def test_freed_memory_goes_back_to_the_system_on_either_allocator():
    environ = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TINKRL_ALLOCATOR")}
    for env in ({}, {"TINKRL_ALLOCATOR": "system"}):
        out = subprocess.run([sys.executable, "-c", RELEASE], env={**environ, **env}, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        seen = json.loads(out.stdout.strip().splitlines()[-1])
        assert seen["held"] > 400 << 20, (env, seen)
        assert seen["released"] < 100 << 20, (env, seen)  # whatever the allocator kept after the free
