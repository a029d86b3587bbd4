"""Plot training runs' reward per step and their held-out evals against wall time.

    python bench/plot_train.py runs/arithmetic/metrics.jsonl [more metrics.jsonl ...] --out docs/make_train.png

Left: mean train reward per step. Right: eval accuracy (greedy, and sampled) against the
run's wall clock (`time/total`), the axis `make train`'s 10-minute budget is about.
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
    ap.add_argument("metrics", nargs="+", type=Path)
    ap.add_argument("--labels", nargs="*", default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    labels = args.labels or [p.parent.name for p in args.metrics]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for path, label in zip(args.metrics, labels):
        rows = read_jsonl(path)
        left.plot(
            [r["progress/step"] for r in rows],
            [r.get("env/all/reward/total", float("nan")) for r in rows],
            label=label,
            linewidth=1,
        )
        evals = [r for r in rows if any(k.endswith("greedy_correct") for k in r)]
        greedy = [next(v for k, v in r.items() if k.endswith("greedy_correct")) for r in evals]
        minutes = [r["time/total"] / 60 for r in evals]
        line = right.plot(minutes, greedy, marker="o", label=f"{label}: greedy")[0]
        sampled = [next((v for k, v in r.items() if k.endswith("sampled_correct")), None) for r in evals]
        right.plot(minutes, sampled, marker="x", linestyle=":", color=line.get_color(), label=f"{label}: sampled")
    left.set(xlabel="step", ylabel="train reward (mean over rollouts)", ylim=(0, 1))
    right.axhline(0.8, color="grey", linewidth=0.8, linestyle="--")
    right.axvline(10, color="grey", linewidth=0.8, linestyle="--")
    right.set(xlabel="wall time (min, model loading included)", ylabel="held-out accuracy", ylim=(0, 1))
    left.legend(fontsize=8)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
