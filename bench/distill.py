"""On-policy distillation against RL from the same start, as a benchmark result and one plot.

    make train && make distill && python bench/distill.py [runs/distill [runs/distill-2 ...]] \
        [--teacher runs/arithmetic] [--plot docs/distill.png] [--results DIR]

The student (`configs/distill.yaml`: SmolLM2-135M-Instruct, untrained) distils from the checkpoint
`make train` left; the teacher's run is the RL run from the same start. Writes
bench/results/distill/<machine class>.json: the teacher's held-out greedy accuracy (its final eval),
the student's before and after (each with its standard error), the steps and wall time of both runs
and their ratio; several runs of the same config are repeats (the table shows their medians).
`--plot` draws held-out greedy accuracy and train reward against wall time, each distilling run
beside the RL run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from common import add_results_arg, command_line, write_result
from make_train import run_device

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETTINGS = (  # the config fields that shape the workload
    "model_name",
    "compile",
    "batch_size",
    "group_size",
    "max_tokens",
    "lora_rank",
    "learning_rate",
    "lr_schedule",
    "loss_fn",
    "time_budget_s",
    "teacher",
)
KEY = "eval/arithmetic"


def read_rows(run_dir: Path) -> list[dict]:
    """A run's metrics.jsonl rows; a run without steps stops the script with one line."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    if not rows:
        raise SystemExit(f"{path}: no steps (run `make train` and `make distill` first)")
    return rows


def greedy_points(rows: list[dict]) -> list[tuple[float, float, int]]:
    """(wall seconds, held-out greedy accuracy, step) at each eval of a run: its full evals and fixed samples."""
    points = []
    for r in rows:
        for prefix in (KEY, "eval_sample/arithmetic"):
            if f"{prefix}/greedy_correct" in r:
                points.append((r["time/total"], r[f"{prefix}/greedy_correct"], r["step"]))
                break
    return points


def full_eval(rows: list[dict], which: int) -> tuple[float, float]:
    """(greedy accuracy, its standard error) of a run's first (`which=0`) or last (`-1`) full held-out eval."""
    evals = [r for r in rows if f"{KEY}/greedy_correct" in r]
    if not evals:
        raise SystemExit("the run has no full held-out eval (eval_problems > 0 is needed)")
    r = evals[which]
    return r[f"{KEY}/greedy_correct"], r.get(f"{KEY}/greedy_correct_stderr", 0.0)


def figures(student: list[dict], teacher: list[dict]) -> dict[str, list[float]]:
    """The record's figures, each a list of one."""
    t, t_err = full_eval(teacher, -1)
    before, before_err = full_eval(student, 0)
    after, after_err = full_eval(student, -1)
    wall, rl_wall = student[-1]["time/total"], teacher[-1]["time/total"]
    out = {
        "teacher_greedy": t,
        "teacher_greedy_stderr": t_err,
        "greedy_before": before,
        "greedy_before_stderr": before_err,
        "greedy_after": after,
        "greedy_after_stderr": after_err,
        "steps": len(student),
        "wall_s": wall,
        "rl_steps": len(teacher),
        "rl_wall_s": rl_wall,
        "wall_ratio": wall / rl_wall,
    }
    return {k: [float(v)] for k, v in out.items()}


def plot(students: list[list[dict]], teacher: list[dict], out: Path) -> None:
    """Held-out greedy accuracy (left) and train reward (right) against wall minutes, the RL run and each
    distilling run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    runs = [(teacher, "RL (make train)")]
    runs += [(rows, f"on-policy distillation (make distill), run {i + 1}") for i, rows in enumerate(students)]
    for rows, label in runs:
        points = greedy_points(rows)
        style = ":" if rows is teacher else "-"  # make train evaluates before and after only: a dotted join
        left.plot([p[0] / 60 for p in points], [p[1] for p in points], style, marker="o", label=label)
        right.plot(
            [r["time/total"] / 60 for r in rows],
            [r.get("env/all/reward/total", float("nan")) for r in rows],
            linewidth=1,
            label=label,
        )
    t, _ = full_eval(teacher, -1)
    left.axhline(t, color="grey", linewidth=0.8, linestyle="--", label="teacher (RL's final checkpoint)")
    left.set(xlabel="wall time (min, model loading included)", ylabel="held-out greedy accuracy", ylim=(0, 1))
    right.set(xlabel="wall time (min)", ylabel="train reward (mean over rollouts)", ylim=(-0.2, 1))
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dirs", nargs="*", type=Path, default=[Path("runs/distill")], help="repeats of one config")
    ap.add_argument("--teacher", type=Path, default=Path("runs/arithmetic"), help="the RL run the teacher came from")
    ap.add_argument("--plot", type=Path, default=None, help="where to draw the curves (e.g. docs/distill.png)")
    add_results_arg(ap)
    args = ap.parse_args()
    students, teacher = [read_rows(d) for d in args.run_dirs], read_rows(args.teacher)
    result: dict[str, list[float]] = {}
    for rows in students:
        for k, v in figures(rows, teacher).items():
            result.setdefault(k, []).extend(v)
    print(json.dumps(result))
    config = yaml.safe_load((args.run_dirs[0] / "config.yaml").read_text())
    settings = {k: config.get(k) for k in SETTINGS}
    write_result(
        "distill",
        args.run_dirs[0].name,
        settings,
        result,
        args.results,
        device=run_device(config),
        command=f"make train && make distill && {command_line()}",
    )
    if args.plot is not None:
        plot(students, teacher, args.plot)


if __name__ == "__main__":
    main()
