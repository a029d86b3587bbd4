"""Generated shell instances as sandbox tasks, and the seeded streams of them.

Each instance becomes a `Task` like a Harbor directory's: its workspace is built from literal
files, its checker (`check_tree.py` and the expected tree as JSON) goes into /tests only at
grading time, after the agent's processes are killed, and writes /logs/verifier/reward.txt —
so nothing the agent writes to /tests or /logs can grade it. The sandbox caps are small
(memory, processes, disk); the network is off as in every bwrap sandbox.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np

from tinkrl.envs.shell.templates import TEMPLATES, WORKDIR, Instance, Tree
from tinkrl.sandbox.build import BuildStep, FileCopy
from tinkrl.taskdirs.model import Task

CHECKER = Path(__file__).with_name("check_tree.py")
TEST_SH = "#!/bin/bash\nexec python3 /tests/check_tree.py /tests/expected.json\n"
LIMITS = {"memory_mb": 256, "pids": 64, "disk_mb": 16, "agent_timeout_s": 60.0, "verifier_timeout_s": 30.0}


def instance(template: str, seed: int | list[int], paraphrase: bool = False) -> Instance:
    """The instance of `template` drawn with `seed` (the same seed always gives the same instance);
    with `paraphrase`, told in one of its wordings, its paths relative or absolute, both drawn with the
    same seed."""
    rng = np.random.default_rng(seed)
    inst = TEMPLATES[template](rng)
    if paraphrase and inst.paraphrases:
        wording = int(rng.integers(len(inst.paraphrases) + 1))
        inst = dataclasses.replace(inst, wording=wording, absolute=bool(rng.integers(2)))
    return inst


@functools.cache
def _checker_source() -> bytes:
    return CHECKER.read_bytes()


def _build(tree: Tree) -> list[BuildStep]:
    dirs = sorted(p for p, e in tree.items() if e.kind == "dir")
    steps = []
    if dirs:
        steps.append(BuildStep("run", "shell task: directories", command="mkdir -p " + " ".join(dirs), workdir=WORKDIR))
    for path, e in sorted(tree.items()):
        if e.kind == "file":
            data = FileCopy(f"{WORKDIR}/{path}", data=e.text.encode(), mode=0o755 if e.exec else 0o644)
            steps.append(BuildStep("copy", f"shell task: {path}", copy=data))
    return steps


def to_task(inst: Instance) -> Task:
    """The instance as a sandbox task: workspace, instruction, checker and reference solution."""
    expected = json.dumps({"root": WORKDIR, "tree": {p: e.to_json() for p, e in sorted(inst.end.items())}})
    solve = f"#!/bin/bash\nset -e\ncd {WORKDIR}\n" + "".join(c + "\n" for c in inst.commands)
    style = (f"-w{inst.wording}" if inst.wording else "") + ("-abs" if inst.absolute else "")
    return Task(
        id=f"shell-{inst.template}-{inst.key}{style}",
        source=CHECKER.parent,
        format="harbor",
        instruction=inst.told,
        workdir=WORKDIR,
        build=_build(inst.start),
        tests=[
            FileCopy("/tests/test.sh", data=TEST_SH.encode(), mode=0o755),
            FileCopy("/tests/check_tree.py", data=_checker_source()),
            FileCopy("/tests/expected.json", data=expected.encode()),
        ],
        test_command="bash /tests/test.sh",
        solution=[FileCopy("/solution/solve.sh", data=solve.encode(), mode=0o755)],
        solution_command="bash /solution/solve.sh",
        metadata={"template": inst.template, "family": "shell"},
        **LIMITS,
    )


def template_of(task_id: str) -> str | None:
    """The template of a task `to_task` made (its id is `shell-<template>-<key>...`); None for any other id."""
    parts = task_id.split("-")
    return parts[1] if len(parts) > 2 and parts[0] == "shell" and parts[1] in TEMPLATES else None


def held_out(templates: list[str], per_template: int, seed: int, paraphrase: bool = False) -> list[Instance]:
    """`per_template` distinct instances of each template, from a seed space the train stream never uses
    (`paraphrase`: as `instance`)."""
    out = []
    for name in templates:
        seen: set[str] = set()
        i = 0
        while len(seen) < per_template and i < 50 * per_template:
            inst = instance(name, [seed, 0x7E57, TEMPLATE_IDS[name], i], paraphrase)
            i += 1
            if inst.key not in seen:
                seen.add(inst.key)
                out.append(inst)
    return out


def train_instance(
    templates: list[str],
    position: int,
    seed: int,
    exclude: set[str],
    paraphrase: bool = False,
    weights: list[float] | None = None,
) -> Instance:
    """The train stream's instance at `position`: its template drawn by the seed (in proportion to
    `weights` when given, else uniformly), redrawn while it equals a held-out instance (`exclude`: their
    keys, whatever the wording; `paraphrase`: as `instance`)."""
    rng = np.random.default_rng([seed, 0x78A1, position])
    if weights is None:
        name = templates[int(rng.integers(len(templates)))]
    else:
        p = np.asarray(weights, dtype=float)
        name = templates[int(rng.choice(len(templates), p=p / p.sum()))]
    for attempt in range(100):
        inst = instance(name, [seed, 0x78A1, position, attempt + 1], paraphrase)
        if inst.key not in exclude:
            return inst
    raise RuntimeError(f"template {name} keeps drawing held-out instances; it has too few distinct ones")


TEMPLATE_IDS = {name: i for i, name in enumerate(TEMPLATES)}
