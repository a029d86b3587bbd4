"""Run several `tinkrl train` variants side by side and tabulate their eval curves.

Used to pick `configs/default.yaml`'s learning rate and batch shape: each variant is the
default config plus overrides; its eval metrics per step land in <out>/<name>/metrics.jsonl.

    python bench/sweep.py --out runs/sweep --parallel 4 \\
        --variant lr1e-3 learning_rate=1e-3 --variant lr2e-3 learning_rate=2e-3 [--common max_steps=40]
    (prefix a command with `taskset -c 0,1` style pinning via --cpus 0,1 2,3 ... for CPU runs)

`--collect` runs nothing and tabulates variants already run into <out>/<name> (e.g. one at a
time, pinned by hand). Writes bench/results/sweep/<machine class>.json: per variant its steps,
final and best held-out greedy accuracy, and wall time; the record is named after the --out
directory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import add_results_arg, write_result

GREEDY = "eval/arithmetic/greedy_correct"  # the default environment's held-out accuracy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variant", nargs="+", action="append", required=True, metavar=("NAME", "KEY=VALUE"))
    ap.add_argument("--common", nargs="*", default=[])
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--cpus", nargs="*", default=[], help="CPU lists to pin variants to, e.g. 0,1 2,3")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--collect", action="store_true", help="run nothing: tabulate the variants' finished runs in --out")
    add_results_arg(ap)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pending = [] if args.collect else list(args.variant)
    running: list[tuple[str, subprocess.Popen, float, str]] = []
    free_cpus = list(args.cpus)
    t0 = time.time()
    while pending or running:
        while pending and len(running) < args.parallel:
            name, *overrides = pending.pop(0)
            cmd = [
                sys.executable,
                "-m",
                "tinkrl.cli",
                "train",
                args.config,
                *args.common,
                *overrides,
                f"log_path={args.out / name}",
                f"run_name={name}",
            ]
            cpus = free_cpus.pop(0) if free_cpus else ""
            if cpus:
                cmd = ["taskset", "-c", cpus, *cmd]
            env = dict(
                os.environ, OMP_NUM_THREADS=str(len(cpus.split(","))) if cpus else os.environ.get("OMP_NUM_THREADS", "")
            )
            log = open(args.out / f"{name}.log", "w")
            running.append(
                (name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), time.time(), cpus)
            )
        time.sleep(2)
        for item in list(running):
            name, proc, start, cpus = item
            if proc.poll() is not None or time.time() - start > args.timeout:
                if proc.poll() is None:
                    proc.kill()
                running.remove(item)
                if cpus:
                    free_cpus.append(cpus)
                print(f"{name}: exit {proc.returncode} after {time.time() - start:.0f}s", flush=True)
    table = {}
    for name, *_ in args.variant:
        rows = (
            [json.loads(line) for line in (args.out / name / "metrics.jsonl").read_text().splitlines()]
            if (args.out / name / "metrics.jsonl").is_file()
            else []
        )
        table[name] = [
            {
                k: round(v, 4) if isinstance(v, float) else v
                for k, v in r.items()
                if k == "step" or k.startswith("eval/") or k in ("env/all/reward/total", "time/step", "time/total")
            }
            for r in rows
        ]
    (args.out / "summary.json").write_text(json.dumps(table, indent=1))
    for name, rows in table.items():
        evals = [(r["step"], r.get(GREEDY)) for r in rows if GREEDY in r]
        rewards = [r.get("env/all/reward/total") for r in rows]
        print(
            name,
            "greedy:",
            evals,
            "reward:",
            [round(x, 2) for x in rewards if x is not None][-5:],
            f"total {rows[-1].get('time/total', 0):.0f}s" if rows else "",
            flush=True,
        )
    print(f"sweep done in {time.time() - t0:.0f}s")
    settings = {
        "config": args.config,
        "common": args.common,
        "variants": {name: overrides for name, *overrides in args.variant},
        "parallel": args.parallel,
    }
    figures = variant_figures(table)
    if figures:
        write_result("sweep", args.out.name, settings, figures, args.results)
    else:
        print("no variant logged a step: no result written")


def variant_figures(table: dict[str, list[dict]]) -> dict[str, list[float]]:
    """Per variant (one run each): steps run, final and best held-out greedy accuracy, the step of
    the best, and the run's wall time; a variant that logged nothing has no figures."""
    out: dict[str, list[float]] = {}
    for name, rows in table.items():
        if not rows:
            continue
        out[f"{name}/steps"] = [len(rows)]
        out[f"{name}/wall_s"] = [rows[-1].get("time/total", 0.0)]
        evals = [(r["step"], r[GREEDY]) for r in rows if GREEDY in r]
        if evals:
            best_step, best = max(evals, key=lambda e: e[1])
            out[f"{name}/final_greedy"] = [evals[-1][1]]
            out[f"{name}/best_greedy"] = [best]
            out[f"{name}/best_step"] = [best_step]
    return out


if __name__ == "__main__":
    main()
