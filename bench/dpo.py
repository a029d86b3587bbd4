"""DPO on a run's own pairs against RL from the same start, as a benchmark result.

    make train && make dpo && python bench/dpo.py [runs/dpo [runs/dpo-2 ...]] [--rl runs/arithmetic] [--results DIR]

The base model (`configs/dpo.yaml`: SmolLM2-135M-Instruct, untrained) trains with DPO on pairs of a
right and a wrong answer to the same training problem: the best and the worst rollout of each group
`make train` sampled in its first steps. Writes bench/results/dpo/<machine class>.json: the pairs,
the held-out greedy accuracy before and after (each with its standard error), the steps and wall
time, and the RL run's before and after and wall beside them; several runs of the same config are
repeats (the table shows their medians).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from common import add_results_arg, command_line, write_result
from distill import full_eval, read_rows
from make_train import run_device

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETTINGS = ("model_name", "compile", "batch_size", "max_steps", "lora_rank", "learning_rate", "lr_schedule", "dpo")


def figures(run_dir: Path, rows: list[dict], rl: list[dict]) -> dict[str, list[float]]:
    """The record's figures for one DPO run, each a list of one."""
    before, before_err = full_eval(rows, 0)
    after, after_err = full_eval(rows, -1)
    rl_before, rl_before_err = full_eval(rl, 0)
    rl_after, rl_after_err = full_eval(rl, -1)
    reference = json.loads((run_dir / "dpo_reference.json").read_text())
    out = {
        "pairs": len(reference["logprobs"]) // 2,
        "greedy_before": before,
        "greedy_before_stderr": before_err,
        "greedy_after": after,
        "greedy_after_stderr": after_err,
        "pair_accuracy": rows[-1]["dpo/accuracy"],
        "steps": len(rows),
        "wall_s": rows[-1]["time/total"],
        "rl_greedy_before": rl_before,
        "rl_greedy_before_stderr": rl_before_err,
        "rl_greedy_after": rl_after,
        "rl_greedy_after_stderr": rl_after_err,
        "rl_steps": len(rl),
        "rl_wall_s": rl[-1]["time/total"],
    }
    return {k: [float(v)] for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dirs", nargs="*", type=Path, default=[Path("runs/dpo")], help="repeats of one config")
    ap.add_argument("--rl", type=Path, default=Path("runs/arithmetic"), help="the RL run the pairs came from")
    add_results_arg(ap)
    args = ap.parse_args()
    rl = read_rows(args.rl)
    result: dict[str, list[float]] = {}
    for run_dir in args.run_dirs:
        for k, v in figures(run_dir, read_rows(run_dir), rl).items():
            result.setdefault(k, []).extend(v)
    print(json.dumps(result))
    config = yaml.safe_load((args.run_dirs[0] / "config.yaml").read_text())
    write_result(
        "dpo",
        args.run_dirs[0].name,
        {k: config.get(k) for k in SETTINGS},
        result,
        args.results,
        device=run_device(config),
        command=f"make train && make dpo && {command_line()}",
    )


if __name__ == "__main__":
    main()
