"""How often a black-box agent's model calls merge into one datum, per agent.

    python bench/merge_rate.py [--repeats 1]

Runs `tinkrl train bench/external_agents_merge_rate.yaml` (mini-swe-agent in text and in tool-call
mode, and a plain OpenAI tool-calling agent, each on the shipped file tasks, with the default model)
in a fresh run directory per repeat, with this interpreter first on PATH so that a `python` agent
command runs in this environment. Per agent, the mean over the run's steps of what the run logs
under `env/<agent>/`: calls per rollout, `proxy/merge_rate`, datums per rollout, `proxy/splice_rate`,
the truncated turns and the reward. Writes bench/results/merge_rate/<machine class>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import common

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "bench" / "external_agents_merge_rate.yaml"
AGENTS = ("mini_text", "mini_tools", "openai_tools")
METRICS = {  # result key: the run's metric under env/<agent>/
    "calls": "proxy/calls",
    "merge_rate": "proxy/merge_rate",
    "datums": "proxy/datums",
    "splice_rate": "proxy/splice_rate",
    "truncated": "frac_truncated",
    "reward": "reward/total",
}


def one_run() -> dict[str, float]:
    """One training run: each agent's metrics, averaged over the run's steps."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        cmd = [sys.executable, "-m", "tinkrl.cli", "train", str(CONFIG), f"log_path={tmp}/run"]
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"tinkrl train failed:\n{out.stderr[-3000:]}")
        steps = [json.loads(line) for line in Path(tmp, "run", "metrics.jsonl").read_text().splitlines()]
    row = {}
    for agent in AGENTS:
        for key, metric in METRICS.items():
            values = [s[f"env/{agent}/{metric}"] for s in steps if s.get(f"env/{agent}/{metric}") is not None]
            if not values:
                raise RuntimeError(f"the run logged no env/{agent}/{metric}: every rollout of {agent} failed")
            row[f"{agent}/{key}"] = statistics.fmean(values)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=1)
    common.add_results_arg(ap)
    args = ap.parse_args()
    repeats: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        row = one_run()
        print(" ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
        for k, v in row.items():
            repeats.setdefault(k, []).append(v)
    settings = {"config": CONFIG.relative_to(ROOT).as_posix(), "agents": list(AGENTS)}
    common.write_result("merge_rate", "file tasks, untrained default model", settings, repeats, args.results)


if __name__ == "__main__":
    main()
