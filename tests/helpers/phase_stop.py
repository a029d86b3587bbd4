"""Run `tinkrl ARGS...` and freeze the process (SIGSTOP) the Nth time it reaches a phase of a
training step, so that a test can SIGKILL it exactly there, or change the world around it and
let it go on (SIGCONT).

usage: python phase_stop.py PHASE N[+] MARKER -- TINKRL_ARGS...

Phases, and where the process stops:
  sample        on the engine thread, a sampling batch about to decode
  train         inside forward_backward, gradients accumulated, optim_step not yet run
  save_state    inside save_state: the adapter and optimizer files written, the checkpoint's
                PEFT files and tinkrl_meta.json not (a half-written checkpoint directory)
  save_sampler  state saved, the sampler weights not yet
  log           the step's metrics.jsonl line about to be appended
  commit        the step's line written, its checkpoints.jsonl row not yet
With `N+` it stops at the Nth occurrence and every later one. When it stops, MARKER holds
"PHASE COUNT" (the test removes it before letting the process go on). Nothing of tinkrl changes: the stops are wrappers this
script installs around tinkrl's functions, in this process only.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from pathlib import Path


def _stopper(phase: str, nth: int, again: bool, marker: Path):
    seen = 0

    def maybe_stop() -> None:
        nonlocal seen
        seen += 1
        if seen == nth or (again and seen > nth):
            tmp = marker.with_suffix(".tmp")
            tmp.write_text(f"{phase} {seen}\n")
            tmp.rename(marker)
            os.kill(os.getpid(), signal.SIGSTOP)  # every thread stops here until SIGKILL or SIGCONT

    return maybe_stop


def _wrap(owner, name: str, before, after=None) -> None:
    """Replace `owner.name` by a function that calls `before(*args)` first (or `after` once it returned)."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if before is not None:
            before(*args, **kwargs)
        result = original(*args, **kwargs)
        if after is not None:
            after()
        return result

    setattr(owner, name, wrapper)


def install(phase: str, nth: str, marker: Path) -> None:
    """Install the stop for `phase` at occurrence `nth` ("N", or "N+" for N and every later one)."""
    from tinkrl.local import checkpoints, engine, training
    from tinkrl.rl.checkpointer import Checkpointer
    from tinkrl.tracking import RunLogger

    stop = _stopper(phase, int(nth.rstrip("+")), nth.endswith("+"), marker)
    if phase == "sample":
        _wrap(engine, "sample_batch", lambda *a, **k: stop())
    elif phase == "train":
        _wrap(training.Trainer, "forward_backward", None, after=stop)
    elif phase == "save_state":
        _wrap(checkpoints, "_write_peft_adapter", lambda out, lora, meta: meta["kind"] == "weights" and stop())
    elif phase == "save_sampler":
        _wrap(training.Trainer, "save_weights_for_sampler", lambda *a, **k: stop())
    elif phase == "log":
        _wrap(RunLogger, "log", lambda *a, **k: stop())
    elif phase == "commit":
        _wrap(Checkpointer, "commit", lambda *a, **k: stop())
    else:
        raise SystemExit(f"unknown phase {phase!r}")


def main(argv: list[str]) -> int:
    phase, nth, marker, sep, *rest = argv
    assert sep == "--", "usage: phase_stop.py PHASE N[+] MARKER -- TINKRL_ARGS..."
    install(phase, nth, Path(marker))
    from tinkrl.cli import main as tinkrl

    return tinkrl(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
