"""Sandbox start-up cost: create + exec `true` + destroy, sequentially and 32 at once.

    .venv/bin/python bench/sandbox.py [--provider bwrap] [--runs 200] [--concurrent 32] [--pool 2]

Prints p50/p99 of the sequential cycle, and for 32 sandboxes started together the wall
time for all of them plus the p50/p99 of a single cycle under that load. For bwrap it
measures twice: cold (every sandbox started on demand) and pooled (`pool=N`: sandboxes
started ahead by a background thread, each fresh and used once; `--pool 0` skips this).
Writes every cycle's seconds to bench/results/sandbox/<machine class>.json (`--results DIR`
elsewhere), one record per provider and mode.
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


def sequential(provider, label: str, runs: int, gap_s: float = 0.0) -> list[float]:
    seq = []
    for _ in range(runs):
        time.sleep(gap_s)  # not timed: an agent's episode between two creates
        seq.append(cycle(provider))
    gap = f", {gap_s * 1e3:.0f} ms idle between runs" if gap_s else " back to back"
    print(
        f"[{label}] sequential create+exec(true)+destroy over {runs} runs{gap}: "
        f"p50 {pct(seq, 0.5) * 1e3:.1f} ms  p99 {pct(seq, 0.99) * 1e3:.1f} ms  mean {statistics.mean(seq) * 1e3:.1f} ms"
    )
    return seq


def measure(provider, label: str, runs: int, concurrent: int, gap_s: float = 0.0) -> dict[str, list[float]]:
    """Each cycle's seconds: back to back, with `gap_s` idle between cycles (when given), and
    `concurrent` started at once (plus the wall time for all of them)."""
    if getattr(provider, "server", None):  # bwrap: which pid 1 runs in the sandbox
        label += f", pid 1 {provider.server}"
    for _ in range(5):  # warm caches (page cache, compiled server, cgroup dirs)
        cycle(provider)
    out = {"sequential_s": sequential(provider, label, runs)}
    if gap_s:
        out["sequential_idle_gap_s"] = sequential(provider, label, runs, gap_s)
    time.sleep(0.5)  # let a pool refill before the burst
    with ThreadPoolExecutor(concurrent) as pool:
        t0 = time.perf_counter()
        conc = list(pool.map(lambda _: cycle(provider), range(concurrent)))
        wall = time.perf_counter() - t0
    print(
        f"[{label}] {concurrent} at once: all done in {wall * 1e3:.0f} ms; per sandbox "
        f"p50 {pct(conc, 0.5) * 1e3:.1f} ms  p99 {pct(conc, 0.99) * 1e3:.1f} ms"
    )
    provider.close()
    return out | {"at_once_cycle_s": conc, "at_once_wall_s": [wall]}


def main() -> None:
    import common  # bench/common.py, beside this script

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provider", default="bwrap")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--concurrent", type=int, default=32)
    ap.add_argument("--pool", type=int, default=2, help="bwrap only: pool size for the pooled run (0 = skip)")
    ap.add_argument(
        "--gap-ms",
        type=float,
        default=30.0,
        help="pooled run: also time cycles with this idle gap between them (time to refill)",
    )
    common.add_results_arg(ap)
    args = ap.parse_args()
    provider = get_provider(args.provider)
    settings = {"provider": args.provider, "runs": args.runs, "concurrent": args.concurrent}
    settings["pid1"] = getattr(provider, "server", None)  # bwrap: the native or the python pid 1
    cold = measure(provider, "cold", args.runs, args.concurrent)
    common.write_result("sandbox", f"{args.provider} cold", settings, cold, args.results, device="cpu")
    if args.provider == "bwrap" and args.pool > 0:
        pooled = measure(
            get_provider("bwrap", pool=args.pool),
            f"pool={args.pool}",
            args.runs,
            args.concurrent,
            gap_s=args.gap_ms / 1000,
        )
        settings |= {"pool": args.pool, "gap_ms": args.gap_ms}
        common.write_result(
            "sandbox", f"{args.provider} pool={args.pool}", settings, pooled, args.results, device="cpu"
        )


if __name__ == "__main__":
    main()
