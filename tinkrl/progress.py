"""Progress bars for long phases (task gate, sampling, training steps, warm start, eval trials).

One tqdm bar per phase on stderr, with rate and ETA, drawn only when stderr is a terminal: logs of
non-interactive runs (CI, `nohup`, a cluster job) get no bar redraws, only the lines the phase prints.
`TINKRL_PROGRESS=1` forces bars on, `TINKRL_PROGRESS=0` off.
"""

from __future__ import annotations

import os
import sys

from tqdm import tqdm


def progress_enabled() -> bool:
    """Whether bars are drawn: `TINKRL_PROGRESS` when set, else whether stderr is a terminal."""
    forced = os.environ.get("TINKRL_PROGRESS", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return sys.stderr.isatty()


def progress_bar(total: int, desc: str, unit: str = "it", initial: int = 0, leave: bool = True) -> tqdm:
    """A bar for one phase; a no-op object with the same methods when bars are off."""
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit=unit,
        leave=leave,
        dynamic_ncols=True,
        file=sys.stderr,
        disable=not progress_enabled(),
    )


def progress_line(line: str) -> None:
    """Print a line to stderr above any drawn bar (as a plain line when bars are off)."""
    tqdm.write(line, file=sys.stderr)
