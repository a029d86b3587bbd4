"""Plot an agent run: train reward per RL step, and held-out pass@1 against wall time.

    python bench/plot_agent.py runs/agent --out docs/make_train_agent.png

Reads the run directory's `warm_start.jsonl` (the untrained model's eval, the supervised steps)
and `metrics.jsonl` (RL steps; their evals). Left: mean train reward per RL step. Right:
held-out pass@1 at the run's temperature (one sampled episode per held-out instance), for
held-out instances of the trained templates and for the held-out templates, against the run's
wall clock (model loading included), with the warm start's end marked.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tinkrl.tracking import read_jsonl  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--env", default="shell", help="the environment key (default shell)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    phases = read_jsonl(args.run_dir / "warm_start.jsonl")
    steps = read_jsonl(args.run_dir / "metrics.jsonl")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(
        [r["progress/step"] for r in steps], [r.get("env/all/reward/total") for r in steps], linewidth=1, label="RL"
    )
    left.set(xlabel="RL step", ylabel="train reward (mean over rollouts)", ylim=(0, 1))
    evals = [r for r in phases if r.get("phase") == "base"] + [
        r for r in steps if f"eval/{args.env}/sampled_reward" in r
    ]
    minutes = [r["time/total"] / 60 for r in evals]
    for tag, marker in (("heldout_instances", "o"), ("heldout_templates", "s")):
        for mode, style in (("sampled", "-"), ("greedy", ":")):
            key = f"eval/{args.env}/{tag}/{mode}_reward"
            right.plot(minutes, [r.get(key) for r in evals], marker=marker, linestyle=style, label=f"{tag} ({mode})")
    sft = [r for r in phases if r.get("phase") == "sft"]
    if sft:
        right.axvline(sft[-1]["time/total"] / 60, color="grey", linewidth=0.8, linestyle="--", label="warm start ends")
    right.axvline(30, color="red", linewidth=0.8, linestyle="--")
    right.set(xlabel="wall time (min, model loading included)", ylabel="held-out pass@1", ylim=(0, 1))
    left.legend(fontsize=8)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
