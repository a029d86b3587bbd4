"""Sandbox start-up cost: create + exec `true` + destroy, sequentially and 32 at once.

    .venv/bin/python bench/sandbox.py [--provider bwrap] [--runs 200] [--concurrent 32]

Prints p50/p99 of the sequential cycle, and for 32 sandboxes started together the wall
time for all of them plus the p50/p99 of a single cycle under that load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from tinkrl.sandbox import get_provider
from tinkrl.sandbox.base import SandboxSpec


def cycle(provider) -> float:
    t0 = time.perf_counter()
    sb = provider.create(SandboxSpec())
    r = sb.exec("true")
    sb.close()
    if r.exit_code != 0:
        raise SystemExit(f"`true` exited {r.exit_code}: {r.output}")
    return time.perf_counter() - t0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provider", default="bwrap")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--concurrent", type=int, default=32)
    args = ap.parse_args()
    provider = get_provider(args.provider)
    for _ in range(5):  # warm caches (page cache, compiled server, cgroup dirs)
        cycle(provider)
    seq = [cycle(provider) for _ in range(args.runs)]
    print(f"sequential create+exec(true)+destroy over {args.runs} runs: "
          f"p50 {pct(seq, .5) * 1e3:.1f} ms  p99 {pct(seq, .99) * 1e3:.1f} ms  mean {statistics.mean(seq) * 1e3:.1f} ms")
    with ThreadPoolExecutor(args.concurrent) as pool:
        t0 = time.perf_counter()
        conc = list(pool.map(lambda _: cycle(provider), range(args.concurrent)))
        wall = time.perf_counter() - t0
    print(f"{args.concurrent} at once: all done in {wall * 1e3:.0f} ms; per sandbox "
          f"p50 {pct(conc, .5) * 1e3:.1f} ms  p99 {pct(conc, .99) * 1e3:.1f} ms")
    provider.close()


if __name__ == "__main__":
    main()
