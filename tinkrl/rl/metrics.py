"""What a training step reports: per-environment rollout metrics, optimizer metrics, the console line.

Names follow tinker-cookbook where it has them (`env/<key>/reward/total`, `optim/kl_sample_train_v1`,
`optim/entropy`, `by_group/frac_mixed`, `time/...`), so dashboards built for it read tinkrl's runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from tinker import types

from tinkrl.rl.advantages import compute_advantages
from tinkrl.rl.data import SequenceData
from tinkrl.rl.types import Metrics, Trajectory, TrajectoryGroup

KeyedGroups = list[tuple[str, TrajectoryGroup]]  # (environment key, group) pairs of one step


@contextmanager
def timed(metrics: Metrics, key: str) -> Iterator[None]:
    """Record the block's wall time in seconds as `metrics[key]`."""
    t0 = time.time()
    try:
        yield
    finally:
        metrics[key] = time.time() - t0


def group_metrics(keyed_groups: KeyedGroups) -> Metrics:
    """Rewards, episode shapes and failures per environment (and `all`), and how groups split by reward."""
    m: Metrics = {}
    by_env: dict[str, list[TrajectoryGroup]] = {}
    for key, g in keyed_groups:
        by_env.setdefault(key, []).append(g)
    for name, groups in [("all", [g for _, g in keyed_groups]), *by_env.items()]:
        trajs = [t for g in groups for t in g.trajectories_G]
        rewards = [r for g in groups for r in g.total_rewards()]
        turns = [tr for t in trajs for tr in t.transitions]
        p = f"env/{name}/"
        m[p + "reward/total"] = float(np.mean(rewards)) if rewards else float("nan")
        m[p + "total_episodes"] = len(trajs)
        m[p + "turns_per_episode"] = len(turns) / max(1, len(trajs))
        m[p + "ac_tokens_per_turn"] = float(np.mean([len(t.ac_tokens) for t in turns])) if turns else 0.0
        m[p + "ob_tokens_per_turn"] = float(np.mean([t.ob.length for t in turns])) if turns else 0.0
        m[p + "frac_truncated"] = float(np.mean([t.stop_reason == "length" for t in turns])) if turns else 0.0
        m[p + "failures"] = sum(len(g.failures) for g in groups)
        for k in sorted({k for t in turns for k in t.metrics}):
            m[p + k] = float(np.mean([t.metrics[k] for t in turns if k in t.metrics]))
    groups = [g for _, g in keyed_groups if g.trajectories_G]
    if groups:
        kinds = []
        for g in groups:
            r = np.array(g.total_rewards())
            kinds.append("mixed" if r.max() > r.min() else ("good" if r.max() > 0 else "bad"))
        for kind, name in (("mixed", "frac_mixed"), ("good", "frac_all_good"), ("bad", "frac_all_bad")):
            m[f"by_group/{name}"] = kinds.count(kind) / len(kinds)
    return m


def optim_metrics(
    seqs: list[SequenceData], fwd: types.ForwardBackwardOutput, loss_fn_config: dict[str, float] | None
) -> Metrics:
    """The loss, and how far the trainer's logprobs are from the sampler's on the action tokens.

    `optim/dlogprob_mean` and `optim/dlogprob_max` are the mean and max |trainer - sampler| logprob:
    on-policy (same weights) they measure the numerical sampler/trainer mismatch, which a default
    precision of the embedded engine keeps within 2e-2 (docs/engine.md); off-policy they include the
    weights' drift."""
    q_all, p_all = [], []
    for s, out in zip(seqs, fwd.loss_fn_outputs):
        mask = s.action_mask.astype(bool)
        q_all.append(np.asarray(s.logprobs[1:], dtype=np.float32)[mask])
        p_all.append(out["logprobs"].to_numpy()[mask])
    q, p = np.concatenate(q_all), np.concatenate(p_all)
    m = {"optim/loss": fwd.metrics.get("loss:sum", float("nan"))}
    if len(q):
        ratio = np.exp(p - q)
        cfg = loss_fn_config or {}
        lo, hi = cfg.get("clip_low_threshold", 0.8), cfg.get("clip_high_threshold", 1.2)
        m.update(
            {
                "optim/kl_sample_train_v1": float(np.mean(q - p)),
                "optim/kl_sample_train_v2": float(0.5 * np.mean((q - p) ** 2)),
                "optim/dlogprob_mean": float(np.mean(np.abs(p - q))),
                "optim/dlogprob_max": float(np.max(np.abs(p - q))),
                "optim/entropy": float(-np.mean(q)),
                "optim/ratio_mean": float(ratio.mean()),
                "optim/ratio_max": float(ratio.max()),
                "optim/clip_frac": float(np.mean((ratio < lo) | (ratio > hi))),
                "optim/action_tokens": float(len(q)),
            }
        )
    return m


def rollout_rows(seq_infos: list[tuple[SequenceData, dict]], tokenizer, step: int) -> list[dict]:
    """One `rollouts/step_*.jsonl` row per trained sequence: its text, tokens, mask and reward."""
    rows = []
    for seq, info in seq_infos:
        first_action = next((i for i, m in enumerate(seq.mask) if m > 0), len(seq.tokens))
        rows.append(
            {
                "step": step,
                **info,
                "prompt": tokenizer.decode(seq.tokens[:first_action]),
                "response": tokenizer.decode(seq.tokens[first_action:]),
                "tokens": seq.tokens,
                "mask": seq.mask,
            }
        )
    return rows


def token_transcript(traj: Trajectory, tokenizer) -> list[dict]:
    """An episode as text, for environments that log no transcript of their own: the first prompt as
    rendered (`prompt`), then each action (`assistant`) and the tokens its environment added before
    the next one (`observation`)."""
    turns: list[dict] = []
    context: list[int] = []
    for t in traj.transitions:
        try:
            ob = t.ob.to_ints()
        except ValueError:  # an image chunk: only its text turns can be shown
            ob = []
        new = ob[len(context) :] if ob[: len(context)] == context else ob
        if new:
            turns.append({"role": "observation" if turns else "prompt", "content": tokenizer.decode(new)})
        turns.append({"role": "assistant", "content": tokenizer.decode(t.ac_tokens)})
        context = ob + list(t.ac_tokens)
    return turns


def episode_rows(
    keyed_groups: KeyedGroups,
    step: int,
    tokenizer,
    trained: set[int],
    adv_estimator: str = "grpo",
    adv_beta: float = 2.0,
) -> list[dict]:
    """One `episodes/step_*.jsonl` row per episode of the step, trained on or not: environment, group,
    reward, its advantage within the group, token counts, truncation, failure, and what the environment
    logged (agent tasks: the transcript of commands and outputs, how the episode ended, the grade).
    `trained` holds the `id` of each group the step trained on; an environment that logs no
    `tasks/transcript` gets the episode's text as `transcript` (`token_transcript`)."""
    rows = []
    for g, (key, group) in enumerate(keyed_groups):
        rewards = group.total_rewards()
        advantages = compute_advantages(rewards, adv_estimator, adv_beta) if rewards else []
        for i, (traj, reward, adv) in enumerate(zip(group.trajectories_G, rewards, advantages)):
            logs = traj.logs
            row = {
                "step": step,
                "env": key,
                "group": g,
                "episode": i,
                "reward": reward,
                "advantage": float(adv),
                "trained": id(group) in trained,
                "turns": len(traj.transitions),
                "ac_tokens": sum(len(t.ac_tokens) for t in traj.transitions),
                "ob_tokens": traj.transitions[0].ob.length if traj.transitions else 0,
                "truncated": any(t.stop_reason == "length" for t in traj.transitions),
                "tags": group.tags,
                **logs,
            }
            if "tasks/transcript" not in logs:
                row["transcript"] = token_transcript(traj, tokenizer)
            rows.append(row)
        for traj in group.failures:
            rows.append(
                {
                    "step": step,
                    "env": key,
                    "group": g,
                    "reward": None,
                    "trained": False,
                    "tags": group.tags,
                    "failure_mode": traj.failure_mode,
                    "failure_detail": traj.failure_detail,
                }
            )
    return rows


def summary_line(step: int, m: Metrics) -> str:
    """The console line of a step: reward, held-out accuracy when evaluated, and step time."""
    parts = [f"step {step}", f"reward {m.get('env/all/reward/total', float('nan')):.3f}"]
    parts += [f"{k} {v:.3f}" for k, v in m.items() if k.startswith("eval/") and k.endswith("_correct")]
    parts.append(f"{m.get('time/step', 0):.1f}s")
    return " | ".join(parts)
