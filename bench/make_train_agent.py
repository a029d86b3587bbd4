"""The figures of `make train-agent` runs, from their run directories, as a benchmark result.

    make train-agent && python bench/make_train_agent.py [runs/agent ...] [--train-command "make train-agent"]

Reads each run's summary.json (written at the end of every run, `tinkrl/rl/summary.py`) and writes
bench/results/make_train_agent/<machine class>.json, under the first run's name, one repeat per
run (the table shows their medians): RL steps run within the time budget, the job's wall time and
evaluation's share of it, and for each held-out tag (new instances of the trained templates,
templates never trained on, the hand-written tasks of `tasks/`) the greedy pass@1 after the warm
start and after RL with their standard errors. The runs must share their settings. The record
names the commit checked out now, so summarise runs from the tree that made them. `--append`
adds the runs as further repeats of the record already there under `--workload` (its settings
must match; its commits are kept beside this one), for repeats whose run directories are gone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from common import COMMIT_AT_START, add_results_arg, command_line, machine, result_path, write_result
from make_train import run_device

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETTINGS = (  # the config fields that shape the workload
    "model_name",
    "compile",
    "groups_per_step",
    "group_size",
    "max_tokens",
    "lora_rank",
    "learning_rate",
    "kl_penalty_coef",
    "time_budget_s",
    "eval_sample_size",
    "eval_max_share",
)
TAGS = ("heldout_instances", "heldout_templates", "handwritten")


def run_figures(summary: dict) -> dict[str, list[float]]:
    """The run's single figures (lists of one): steps, times, and per tag the warm start's and RL's
    greedy pass@1 with standard errors."""
    out = {
        "rl_steps": [summary["rl_steps"]],
        "wall_s": [summary["time"]["total_s"]],
        "eval_share": [summary["time"]["eval_share"]],
    }
    for phase in ("warm_start", "rl"):
        row = summary["evals"].get(phase) or {}
        for tag in TAGS:
            key = next((k for k in row if k.endswith(f"/{tag}/greedy_reward")), None)
            if key is not None:
                out[f"{tag}/{phase}"] = [row[key]]
                out[f"{tag}/{phase}_stderr"] = [row.get(f"{key}_stderr", 0.0)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dirs", nargs="*", type=Path, default=[Path("runs/agent")])
    ap.add_argument("--train-command", default="make train-agent", help="what made the runs (recorded with them)")
    ap.add_argument("--workload", help="the record's name (default: the first run directory's name)")
    ap.add_argument("--append", action="store_true", help="add the runs to that record's repeats")
    add_results_arg(ap)
    args = ap.parse_args()
    workload = args.workload or args.run_dirs[0].name
    figures: dict[str, list[float]] = {}
    settings: dict | None = None
    for run_dir in args.run_dirs:
        summary_path = run_dir / "summary.json"
        if not summary_path.is_file():
            raise SystemExit(f"{summary_path} is missing: the run has not finished (every finished run writes it)")
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        mine = {k: config.get(k) for k in SETTINGS}
        run_json = run_dir / "run.json"
        compute = json.loads(run_json.read_text()).get("compute") if run_json.is_file() else None
        if compute:
            mine["plan"] = compute["line"]
        if settings is not None and mine != settings:
            raise SystemExit(f"{run_dir} ran with other settings than {args.run_dirs[0]}: {mine} != {settings}")
        settings = mine
        one = run_figures(json.loads(summary_path.read_text()))
        print(json.dumps({k: v[0] for k, v in one.items()}))
        for k, v in one.items():
            figures.setdefault(k, []).extend(v)
    device, commit = run_device(config), None
    if args.append:
        earlier = earlier_record(args.results, workload, device)
        if earlier["settings"] != settings:
            raise SystemExit(
                f"{args.run_dirs[0]} ran with other settings than {workload}: {settings} != {earlier['settings']}"
            )
        figures = {k: [*earlier["repeats"].get(k, []), *figures.get(k, [])] for k in {**earlier["repeats"], **figures}}
        commit = f"{earlier['commit']}, {COMMIT_AT_START}"
    command = f"{args.train_command} && {command_line()}"
    write_result(
        "make_train_agent",
        workload,
        settings or {},
        figures,
        args.results,
        device=device,
        command=command,
        commit=commit,
    )


def earlier_record(results: Path, workload: str, device: str) -> dict:
    """The record of `workload` in this machine class's result file; SystemExit naming what is missing."""
    path = result_path("make_train_agent", results, machine(), device)
    runs = json.loads(path.read_text())["runs"] if path.is_file() else {}
    if workload not in runs:
        raise SystemExit(f"--append: {path} has no record {workload!r} (it has: {', '.join(runs) or 'none'})")
    return runs[workload]


if __name__ == "__main__":
    main()
