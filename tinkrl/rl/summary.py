"""A run's summary, `summary.json`: what each phase reached on the held-out sets, what each phase
gained on its own, and where the job's time went.

Three full evals mark the phases: `base` (the untrained model, before the warm start: the `base`
line of warm_start.jsonl), `warm_start` (before the first RL step: step 0's eval) and `rl` (the
final eval). Each holds the held-out means with their standard errors, keyed without the eval's
prefix (`shell/heldout_instances/greedy_reward`, `..._stderr`), so a base eval run on the in-run
sample compares with the full ones. `gain.warm_start` and `gain.rl` are the differences, each
with the standard error of the difference. `problems` says, per held-out tag, how many problems the
eval before RL and the final one solved and which ones RL gained or lost (from `evals/step_*.jsonl`).
`sandboxes` says what the run's sandbox providers did, for those that count it (the harbor provider:
sandboxes started, failed to start, and start retries).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from tinkrl.rl.evaluation import FULL, SAMPLE
from tinkrl.rl.schedule import TimeBudget
from tinkrl.rl.types import EnvDatasets, Metrics
from tinkrl.tracking import read_jsonl, writing

SUMMARY_FILE = "summary.json"
STDERR = "_stderr"


def eval_figures(metrics: dict[str, Any]) -> dict[str, float]:
    """The held-out means and their standard errors in a metrics row, keyed without the `eval/` or
    `eval_sample/` prefix (a row holds one or the other)."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        prefix, _, rest = k.partition("/")
        if prefix in (FULL, SAMPLE) and rest and isinstance(v, (int, float)) and not isinstance(v, bool):
            out[rest] = float(v)
    return out


def gains(before: dict[str, float], after: dict[str, float]) -> dict[str, dict[str, float]]:
    """For each mean in both: before, after, the gain, and the gain's standard error (the two evals'
    errors combined as independent)."""
    out = {}
    for name, b in before.items():
        if name.endswith(STDERR) or name not in after:
            continue
        a = after[name]
        se_b, se_a = before.get(name + STDERR, math.nan), after.get(name + STDERR, math.nan)
        out[name] = {"before": b, "after": a, "gain": a - b, "stderr": math.sqrt(se_b**2 + se_a**2)}
    return out


def base_eval_row(run_dir: Path) -> dict[str, Any] | None:
    """The untrained model's eval as warm_start.jsonl recorded it (None without one)."""
    return next((r for r in read_jsonl(run_dir / "warm_start.jsonl") if r.get("phase") == "base"), None)


def before_rl_row(run_dir: Path) -> dict[str, Any] | None:
    """Step 0's line of metrics.jsonl when it holds a full eval (the eval before the first RL step)."""
    row = next((r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("step") == 0), None)
    return row if row is not None and any(k.startswith(FULL + "/") for k in row) else None


def eval_rows(run_dir: Path, step: int) -> list[dict[str, Any]]:
    """The episodes of the eval of the weights after `step` steps, one mode's: greedy where it was played."""
    rows = read_jsonl(run_dir / "evals" / f"step_{step:06d}.jsonl")
    modes = [r.get("mode") for r in rows]
    mode = "greedy" if "greedy" in modes else (modes[0] if modes else None)
    return [r for r in rows if r.get("mode") == mode]


def problem_changes(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tag: problems solved (reward 1) before and after, of how many, and the names of those gained and
    lost (a task's id, else `<env>#<index>`), over the problems both evals played."""

    def solved(rows: list[dict[str, Any]]) -> dict[tuple[str, str], bool]:
        return {(r["tag"], r.get("tasks/task") or f"{r['env']}#{r['problem']}"): r.get("reward") == 1 for r in rows}

    b, a = solved(before), solved(after)
    out: dict[str, Any] = {}
    for tag, name in sorted(b.keys() & a.keys()):
        t = out.setdefault(tag, {"of": 0, "before": 0, "after": 0, "gained": [], "lost": []})
        t["of"] += 1
        t["before"] += b[tag, name]
        t["after"] += a[tag, name]
        if a[tag, name] != b[tag, name]:
            t["gained" if a[tag, name] else "lost"].append(name)
    return out


def time_split(budget: TimeBudget, now: float) -> dict[str, float]:
    """Seconds per phase of this process (the rest, `setup`, is loading the model and building the
    environments), evaluation's total and its share of the whole."""
    total = now - budget.t0
    out = {f"{phase}_s": round(seconds, 1) for phase, seconds in sorted(budget.spent.items())}
    out["setup_s"] = round(max(0.0, total - sum(budget.spent.values())), 1)
    out["eval_s"] = round(budget.eval_spent, 1)
    out["total_s"] = round(total, 1)
    out["eval_share"] = round(budget.eval_spent / total, 3) if total > 0 else math.nan
    return out


def run_summary(
    run_dir: Path, budget: TimeBudget, steps_done: int, before_rl: Metrics | None, after_rl: Metrics | None
) -> dict[str, Any]:
    """The summary of a run that just ended: its evals by phase (this process's, else the records'), the
    gains, the steps and the time split."""
    base = base_eval_row(run_dir)
    if before_rl is None:
        before_rl = before_rl_row(run_dir)
    evals: dict[str, Any] = {}
    if base is not None:
        evals["base"] = eval_figures(base)
    if before_rl is not None:
        evals["warm_start"] = eval_figures(before_rl)
    if after_rl is not None:
        evals["rl"] = eval_figures(after_rl)
    gain = {}
    for phase, (a, b) in {"warm_start": ("base", "warm_start"), "rl": ("warm_start", "rl")}.items():
        if a in evals and b in evals:
            gain[phase] = gains(evals[a], evals[b])
    return {
        "rl_steps": steps_done,
        "base_eval": {"cached": bool(base.get("cached")), "kind": base.get("kind", "full")} if base else None,
        "evals": evals,
        "gain": gain,
        "problems": problem_changes(eval_rows(run_dir, 0), eval_rows(run_dir, steps_done)),
        "time": time_split(budget, time.time()),
    }


def sandbox_counts(envs: dict[str, EnvDatasets]) -> dict[str, dict[str, Any]]:
    """What the run's sandbox providers did, by provider name (the harbor provider: sandboxes started, failed to
    start, start retries); empty when no environment made a provider that counts."""
    out: dict[str, dict[str, Any]] = {}
    for env in envs.values():
        counts = env.sandboxes() if env.sandboxes is not None else {}
        if counts:
            out[str(counts["provider"])] = {k: v for k, v in counts.items() if k != "provider"}
    return out


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """Write `summary.json` (NaN as null)."""
    path = run_dir / SUMMARY_FILE
    text = json.dumps(_nan_to_none(summary), indent=2) + "\n"
    with writing(path):
        path.write_text(text)


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


def summary_lines(summary: dict[str, Any], trained: str = "RL") -> list[str]:
    """The summary for people: each phase's gain on the held-out rewards (with standard errors), then
    where the time went; `trained` names the main phase (RL, or DPO for `tinkrl dpo`)."""
    lines = []
    for phase, figures in summary["gain"].items():
        parts = [
            f"{name} {g['before']:.3f} -> {g['after']:.3f} ({g['gain']:+.3f} ± {g['stderr']:.3f})"
            for name, g in figures.items()
            if name.endswith("_reward")
        ]
        if parts:
            lines.append(f"{trained.lower() if phase == 'rl' else phase.replace('_', ' ')}: " + "; ".join(parts))
    for tag, p in summary.get("problems", {}).items():
        changed = "".join(f"; {k}: {', '.join(_few(p[k]))}" for k in ("gained", "lost") if p[k])
        lines.append(f"{tag}: solved {p['before']}/{p['of']} before {trained}, {p['after']}/{p['of']} after{changed}")
    for provider, counts in summary.get("sandboxes", {}).items():
        lines.append(f"sandboxes ({provider}): " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    t = summary["time"]
    phases = ", ".join(f"{k[:-2]} {v:.0f}s" for k, v in t.items() if k.endswith("_s") and k not in ("total_s",))
    lines.append(f"time: {t['total_s']:.0f}s ({phases}); evaluation {100 * t['eval_share']:.0f}% of it")
    return lines


def _few(names: list[str], k: int = 6) -> list[str]:
    """The first `k` names, and how many more there are."""
    return names[:k] + ([f"{len(names) - k} more"] if len(names) > k else [])
