"""Plot an agent run: train reward per RL step, held-out reward against wall time, and what the warm
start and RL each gained.

    python bench/plot_agent.py runs/agent --out docs/make_train_agent.png

Reads the run directory's `warm_start.jsonl` (the untrained model's eval, the supervised steps),
`metrics.jsonl` (RL steps; their evals) and `summary.json` (each phase's full eval with standard
errors). Left: mean train reward per RL step. Middle: held-out reward (greedy unless `--mode
sampled`) against the run's wall clock (model loading included): the full evals per tag
(before the warm start, before RL, at the end) and the in-run sample between, each with its
standard error, the warm start's end marked. Right: per tag, the base model, the warm start and
RL side by side with standard errors, RL's own gain written above its bar.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tinkrl.tracking import read_jsonl  # noqa: E402

Point = tuple[float, float, float]  # (minutes, mean, standard error)
PHASES = (("base", "base model"), ("warm_start", "warm start"), ("rl", "after RL"))


def eval_end_minutes(row: dict[str, Any]) -> float:
    """When a step's own eval (run at the step's start) ended, in minutes of the run's clock."""
    return (row["time/total"] - row.get("time/step", 0.0) + row.get("time/eval", 0.0)) / 60


def figure(row: dict[str, Any], key: str) -> tuple[float, float] | None:
    """(mean, standard error) of `key` in a row (standard error 0 when not recorded), else None."""
    if row.get(key) is None:
        return None
    se = row.get(key + "_stderr")
    return float(row[key]), float(se) if se is not None else 0.0


def full_eval_points(phases: list[dict], steps: list[dict], key: str) -> list[Point]:
    """The full evals of `key` (`<env>/<tag>/<mode>_reward`): before the warm start, before RL (step 0)
    and at the end (the final eval), as (minutes, mean, stderr)."""
    points: list[Point] = []
    for row in phases:
        if row.get("phase") == "base":
            found = figure(row, f"eval/{key}") or figure(row, f"eval_sample/{key}")
            if found:
                points.append((row["time/total"] / 60, *found))
    for row in steps:
        found = figure(row, f"eval/{key}")
        if found is None:
            continue
        at = row["time/total"] / 60 if "time/final_eval" in row else eval_end_minutes(row)
        points.append((at, *found))
    return points


def sample_points(steps: list[dict], key: str) -> list[Point]:
    """The in-run sample evals of `key` as (minutes, mean, stderr)."""
    out: list[Point] = []
    for row in steps:
        found = figure(row, f"eval_sample/{key}")
        if found:
            out.append((eval_end_minutes(row), *found))
    return out


def tags_of(rows: list[dict], env: str, mode: str) -> list[str]:
    """The held-out tags the rows report for `env` (e.g. heldout_instances, handwritten), in order seen."""
    tags: list[str] = []
    for row in rows:
        for k in row:
            parts = k.split("/")
            if len(parts) == 4 and parts[0] == "eval" and parts[1] == env and parts[3] == f"{mode}_reward":
                if parts[2] not in tags:
                    tags.append(parts[2])
    return tags


def plot_curves(ax, phases: list[dict], steps: list[dict], env: str, mode: str) -> None:
    """The middle panel: full evals per tag and the in-run sample, with standard errors, over wall time."""
    for tag in tags_of(phases + steps, env, mode):
        pts = full_eval_points(phases, steps, f"{env}/{tag}/{mode}_reward")
        if pts:
            x, y, e = zip(*pts)
            ax.errorbar(x, y, yerr=e, marker="o", capsize=3, label=f"{tag} (full)")
    pts = sample_points(steps, f"{env}/greedy_reward")
    if pts:
        x, y, e = zip(*pts)
        ax.errorbar(x, y, yerr=e, marker=".", linestyle="--", capsize=2, color="grey", label="in-run sample")
    sft = [r for r in phases if r.get("phase") == "sft"]
    if sft:
        ax.axvline(sft[-1]["time/total"] / 60, color="grey", linewidth=0.8, linestyle=":", label="warm start ends")
    ax.axvline(30, color="red", linewidth=0.8, linestyle="--")
    ax.set(xlabel="wall time (min, model loading included)", ylabel=f"held-out {mode} reward", ylim=(0, 1))
    ax.legend(fontsize=7)


def plot_gains(ax, summary: dict[str, Any] | None, env: str, mode: str) -> None:
    """The right panel: per tag, each phase's full eval with its standard error; RL's gain above its bar."""
    evals = (summary or {}).get("evals", {})
    tags = sorted({k.split("/")[1] for e in evals.values() for k in e if k.startswith(f"{env}/") and k.count("/") == 2})
    if not tags:
        ax.text(0.5, 0.5, "no summary.json", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    width = 0.8 / len(PHASES)
    for i, (phase, label) in enumerate(PHASES):
        means, errs = [], []
        for tag in tags:
            key = f"{env}/{tag}/{mode}_reward"
            means.append(evals.get(phase, {}).get(key) or 0.0)
            errs.append(evals.get(phase, {}).get(key + "_stderr") or 0.0)
        xs = [t + (i - 1) * width for t in range(len(tags))]
        ax.bar(xs, means, width, yerr=errs, capsize=3, label=label)
    for t, tag in enumerate(tags):
        gain = summary.get("gain", {}).get("rl", {}).get(f"{env}/{tag}/{mode}_reward")
        if gain:
            ax.annotate(
                f"RL {gain['gain']:+.2f}\n± {gain['stderr']:.2f}",
                (t + width, min(0.95, gain["after"] + gain["stderr"] + 0.03)),
                ha="center",
                fontsize=7,
            )
    ax.set_xticks(range(len(tags)), tags, fontsize=8)
    ax.set(ylabel=f"held-out {mode} reward", ylim=(0, 1.05), title="warm start -> RL")
    ax.legend(fontsize=7, loc="upper left")


def main() -> None:
    """Read the run directory and write the three panels to --out."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--env", default="shell", help="the environment key (default shell)")
    ap.add_argument("--mode", default="greedy", choices=("greedy", "sampled"), help="which full evals to draw")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    phases = read_jsonl(args.run_dir / "warm_start.jsonl")
    steps = read_jsonl(args.run_dir / "metrics.jsonl")
    summary_path = args.run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4))
    left.plot(
        [r["progress/step"] for r in steps], [r.get("env/all/reward/total") for r in steps], linewidth=1, label="RL"
    )
    left.set(xlabel="RL step", ylabel="train reward (mean over rollouts)", ylim=(0, 1))
    left.legend(fontsize=8)
    plot_curves(middle, phases, steps, args.env, args.mode)
    plot_gains(right, summary, args.env, args.mode)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
