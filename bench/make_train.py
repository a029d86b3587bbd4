"""The figures of a `make train` run, from its run directory, as a benchmark result.

    make train && python bench/make_train.py [runs/arithmetic] [--train-command "make train"] [--fresh] [--results DIR]

Reads the run's config.yaml and metrics.jsonl and writes bench/results/make_train/<machine
class>.json: steps run within the time budget, the late steps' seconds (each step's total, its
sampling and its training; late = the second half of the run, the last step left out because it
also runs the final eval), held-out greedy accuracy before and after, sampled accuracy after,
and the run's wall time (model loading included). `--fresh` says the run is a new user's: a fresh
clone, `make install`, then `make train`, with `~/.cache/tinkrl` and `$TINKRL_HOME` empty first (the
table keeps such runs apart). The record names the commit checked out now, so summarise a run from
the tree that made it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from common import add_results_arg, command_line, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETTINGS = (  # the config fields that shape the workload
    "model_name",
    "precision",
    "device",
    "compile",
    "batch_size",
    "group_size",
    "max_tokens",
    "lora_rank",
    "learning_rate",
    "loss_fn",
    "adv_estimator",
    "remove_constant_reward_groups",
    "max_steps",
    "time_budget_s",
)


def run_figures(rows: list[dict]) -> dict[str, list[float]]:
    """Late steps' times (one value per step) and the run's single figures (lists of one)."""
    if not rows:
        raise SystemExit("metrics.jsonl has no steps")
    late = rows[len(rows) // 2 : -1] or rows
    out = {k: [r[f"time/{k}"] for r in late] for k in ("step", "sample", "train")}
    out = {f"late_{k}_s": v for k, v in out.items()}
    out["steps"] = [len(rows)]
    out["wall_s"] = [rows[-1]["time/total"]]
    evals = [r for r in rows if any(k.endswith("/greedy_correct") for k in r)]
    if evals:
        first, last = evals[0], evals[-1]
        out["greedy_before"] = [next(v for k, v in first.items() if k.endswith("/greedy_correct"))]
        out["greedy_after"] = [next(v for k, v in last.items() if k.endswith("/greedy_correct"))]
        sampled = [v for k, v in last.items() if k.endswith("/sampled_correct")]
        if sampled:
            out["sampled_after"] = sampled[:1]
    return out


def run_sampler(config: dict, compute: dict | None) -> str:
    """How the run's sampler computed: as its run.json's compute plan records it, else its config's
    `sampler_precision`, else the default of this machine's class for the run's device (`local/compute_plan.py`)."""
    from tinkrl.local.models import default_sampler_precision, pick_device

    if compute:
        return compute["sampler"]["path"]
    chosen = config.get("sampler_precision") or "auto"
    return default_sampler_precision(pick_device(config.get("device"))) if chosen == "auto" else chosen


def run_device(config: dict) -> str:
    """Where the run trained: its config's `device`, else the engine's default here (CUDA when torch sees a
    GPU), so a CPU run on a GPU host with the GPU hidden (`CUDA_VISIBLE_DEVICES=`) is filed as CPU work."""
    from tinkrl.local.models import pick_device  # the engine's own rule (imports torch)

    return pick_device(config.get("device")).type


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", nargs="?", type=Path, default=Path("runs/arithmetic"))
    ap.add_argument("--train-command", default="make train", help="what made the run (recorded with the figures)")
    ap.add_argument("--fresh", action="store_true", help="a fresh clone's make install then make train, caches empty")
    add_results_arg(ap)
    args = ap.parse_args()
    config = yaml.safe_load((args.run_dir / "config.yaml").read_text())
    rows = [json.loads(line) for line in (args.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    figures = run_figures(rows)
    print(json.dumps({k: v if len(v) == 1 else f"{len(v)} steps" for k, v in figures.items()}))
    settings = {k: config.get(k) for k in SETTINGS} | {"environments": sorted(config.get("environments") or {})}
    run_json = args.run_dir / "run.json"
    compute = json.loads(run_json.read_text()).get("compute") if run_json.is_file() else None
    settings["sampler_precision"] = run_sampler(config, compute)
    settings["start"] = "fresh clone" if args.fresh else "as found"
    if compute:
        settings["plan"] = compute["line"]
    command = f"{args.train_command} && {command_line()}"
    write_result(
        "make_train", args.run_dir.name, settings, figures, args.results, device=run_device(config), command=command
    )


if __name__ == "__main__":
    main()
