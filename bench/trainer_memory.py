"""The trainer's peak resident memory and step times on a multi-turn agent run.

    python bench/trainer_memory.py [--repeats 2] [--pythonpath TREE --label COMMIT]

Starts the ORS toy environment (`tests/helpers/ors_toy_env.py`, on 127.0.0.1:18731) and runs
`tinkrl train bench/ors_multiturn.yaml` (six-turn tool-call episodes beside arithmetic, two steps)
under `/usr/bin/time -v`, each repeat in a fresh process and run directory: the trainer's maximum
resident set size, and each step's sampling, training and total seconds. `--pythonpath` runs another
tree's tinkrl (a worktree of an earlier commit) on the same episodes, recorded under `--label`.
Writes bench/results/trainer_memory/<machine class>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "bench" / "ors_multiturn.yaml"
PORT = 18731


def _wait_for_port(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the ORS toy environment did not listen on 127.0.0.1:{port} within {timeout_s:.0f} s")


def one_run(pythonpath: Path) -> dict[str, float]:
    """One training run: max RSS in GB and the steps' seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "tinkrl.cli", "train", str(CONFIG), f"log_path={tmp}/run"]
        env = {**os.environ, "PYTHONPATH": str(pythonpath)}
        out = subprocess.run(cmd, cwd=pythonpath, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"tinkrl train failed:\n{out.stderr[-3000:]}")
        kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr).group(1))
        row = {"max_rss_gb": kib * 1024 / 2**30}
        for i, line in enumerate(Path(tmp, "run", "metrics.jsonl").read_text().splitlines()):
            m = json.loads(line)
            for key in ("time/sample", "time/train", "time/step"):
                row[f"step{i}/{key.split('/')[1]}_s"] = m[key]
        return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--pythonpath", type=Path, default=ROOT, help="the tree whose tinkrl runs (default: this one)")
    ap.add_argument("--label", default="", help="names the record (e.g. the commit of --pythonpath)")
    common.add_results_arg(ap)
    args = ap.parse_args()
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "helpers" / "ors_toy_env.py"), "--port", str(PORT)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(PORT)
        repeats: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            row = one_run(args.pythonpath.resolve())
            print(" ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
            for k, v in row.items():
                repeats.setdefault(k, []).append(v)
    finally:
        server.terminate()
        server.wait()
    workload = " ".join(w for w in ("ors multi-turn + arithmetic", args.label) if w)
    settings = {"config": "bench/ors_multiturn.yaml", "label": args.label, "steps": 2, "rollouts_per_step": 8}
    common.write_result("trainer_memory", workload, settings, repeats, args.results, device="cpu")


if __name__ == "__main__":
    main()
