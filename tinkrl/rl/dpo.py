"""The DPO loop, top to bottom: pairs, the reference's logprobs, then steps of the DPO loss.

`tinkrl dpo` runs it on a run config whose `dpo:` section names the pairs (`rl/preference.py`).
It is a run like an RL run: the same run directory (`run.json`, `config.yaml`, `metrics.jsonl`,
`checkpoints.jsonl`, W&B), so it resumes after its last committed checkpoint, shows in the viewer
and refuses a directory of another run. The pairs are tokenized once; the frozen reference (the
base model or a checkpoint) scores every completion once, kept in `dpo_reference.json` for a
resumed run to read back; then each step takes
`batch_size` pairs in a seeded order (a fresh permutation per pass over the pairs, so a resumed
run takes the same batches) and runs `forward_backward_custom` with the DPO loss and an
`optim_step`. With `environments:`, the held-out eval runs before the first step and after the
last (`eval/...` in metrics.jsonl, `evals/step_*.jsonl`, `summary.json`), as around RL.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from tinkrl.config import TeacherConfig, TrainConfig
from tinkrl.errors import ConfigError
from tinkrl.progress import progress_bar
from tinkrl.rl.checkpointer import Checkpointer
from tinkrl.rl.evaluation import evaluate
from tinkrl.rl.metrics import timed
from tinkrl.rl.preference import (
    TextPair,
    TokenPair,
    dpo_loss,
    load_pairs,
    pair_datums,
    pairs_from_run,
    reference_logprobs,
    tokenize_pair,
)
from tinkrl.rl.run_dir import holds_run
from tinkrl.rl.run_plan import RunPlan
from tinkrl.rl.run_setup import open_run
from tinkrl.rl.schedule import TimeBudget, lr_multiplier, run_progress
from tinkrl.rl.summary import run_summary, summary_lines, write_summary
from tinkrl.rl.supervised import adam_params
from tinkrl.rl.teacher import resolve_teacher
from tinkrl.rl.teacher import sampling_client as checkpoint_client
from tinkrl.rl.types import EnvDatasets, Metrics
from tinkrl.tracking import RunLogger, writing


def read_pairs(config: TrainConfig) -> list[TextPair | TokenPair]:
    """The run's pairs, read and checked before any model loads: a run directory's own rollouts (tokens), else
    the file's or the dataset's records (messages, tokenized once the renderer is there)."""
    d = config.dpo
    if d.pairs is None:
        raise ConfigError("tinkrl dpo needs dpo.pairs: a JSONL file of pairs, hf:DATASET, or a tinkrl run directory")
    run_dir = Path(d.pairs).expanduser()
    if holds_run(run_dir):
        each = d.group_pairs == "best_each"
        return list(pairs_from_run(run_dir, config.model_name, d.run_steps, each))
    return list(load_pairs(d.pairs, d.split))


def reference_client(config: TrainConfig, service: Any) -> Any:
    """The frozen reference's sampling client: the base model, or the checkpoint `dpo.reference` names."""
    if config.dpo.reference == "base":
        return service.create_sampling_client(base_model=config.model_name)
    resolved = resolve_teacher(TeacherConfig(model=config.dpo.reference))
    assert resolved is not None
    return checkpoint_client(service, resolved)


REFERENCE_FILE = "dpo_reference.json"


async def scored_pairs(c: TrainConfig, service: Any, datums: list[Any]) -> tuple[list[float], str]:
    """Each datum's completion logprob under the reference, and how it was had: read from the run directory's
    `dpo_reference.json` when it holds these very datums and reference (a resumed run), else scored now and
    kept there."""
    digest = hashlib.sha256(
        json.dumps(
            [c.dpo.reference, c.model_name]
            + [[d.model_input.to_ints(), d.loss_fn_inputs["weights"].data] for d in datums]
        ).encode()
    ).hexdigest()
    path = c.run_dir / REFERENCE_FILE
    if path.is_file():
        kept = json.loads(path.read_text())
        if kept.get("digest") == digest:
            return [float(x) for x in kept["logprobs"]], f"read from {path}"
    scores = await reference_logprobs(await asyncio.to_thread(reference_client, c, service), datums)
    with writing(path):
        path.write_text(json.dumps({"digest": digest, "logprobs": scores}) + "\n")
    return scores, "scored them"


def batch_indices(n_pairs: int, batch_size: int, step: int, seed: int) -> list[int]:
    """The pairs of `step`: positions step*batch_size.. of the concatenated seeded permutations of the pairs
    (one per pass), so any step's batch is known without replaying the ones before it."""
    size = min(batch_size, n_pairs)
    out = []
    for k in range(step * size, (step + 1) * size):
        epoch, at = divmod(k, n_pairs)
        out.append(int(np.random.default_rng([seed, 0xD90, epoch]).permutation(n_pairs)[at]))
    return out


async def main(
    plan: RunPlan, pairs: list[TextPair | TokenPair], make_envs: Any, user_metadata: dict[str, str] | None = None
) -> Metrics:
    """Open the planned DPO run on `pairs` (`read_pairs`; `rl/run_setup.open_run`: service, training client,
    environments when the config has them, logging), tokenize the pairs, train it, and close it."""
    async with open_run(plan, make_envs if plan.config.environments else None, user_metadata) as run:
        if run is None:
            return {}
        config = run.config
        tokens = [tokenize_pair(run.renderer, p) if isinstance(p, TextPair) else p for p in pairs]
        datums = pair_datums(tokens, config.dpo.max_length)
        budget = TimeBudget(None, run.t0)
        return await train(
            config, run.service, run.training_client, run.start, datums, run.envs, run.logger, run.checkpointer, budget
        )


async def train(
    c: TrainConfig,
    service: Any,
    tc: Any,
    start: int,
    datums: list[Any],
    envs: dict[str, EnvDatasets],
    logger: RunLogger,
    checkpointer: Checkpointer,
    budget: TimeBudget,
) -> Metrics:
    """Steps `start`..`c.max_steps` of DPO on `datums` (chosen, rejected, ... per pair); returns the last
    step's metrics and writes the run's summary."""
    t0 = budget.t0
    n_pairs = len(datums) // 2
    metrics: Metrics = {}
    with timed(metrics, "time/reference"):
        reference, how = await scored_pairs(c, service, datums)
    print(
        f"dpo {c.run_dir}: {c.model_name} on {c.backend}, {n_pairs} pairs, steps {start}..{c.max_steps} of "
        f"{min(c.batch_size, n_pairs)} pairs, beta {c.dpo.beta}; reference {c.dpo.reference} {how} in "
        f"{metrics['time/reference']:.1f}s"
    )
    budget.start_rl()
    evaluating = bool(envs) and bool(c.eval_every or c.eval_problems)
    before: Metrics | None = None
    final_eval: Metrics | None = None
    final_sampler = None
    progress = progress_bar(c.max_steps, "dpo", unit="step", initial=start)
    try:
        for step in range(start, c.max_steps):
            t_step = time.time()
            lr = c.learning_rate * lr_multiplier(c.lr_schedule, run_progress(step, start, c.max_steps, budget))
            metrics.update({"progress/step": step, "progress/done_frac": (step + 1) / c.max_steps, "optim/lr": lr})
            if step == 0 and evaluating:
                sc = await asyncio.to_thread(tc.save_weights_and_get_sampling_client)
                before = await _eval(c, envs, sc, 0, metrics, logger, budget)

            with timed(metrics, "time/train"):
                picked = batch_indices(n_pairs, c.batch_size, step, c.seed)
                batch = [datums[2 * i + side] for i in picked for side in (0, 1)]
                refs = [reference[2 * i + side] for i in picked for side in (0, 1)]
                fwd_future = tc.forward_backward_custom(batch, dpo_loss(c.dpo.beta, refs))
                optim_future = tc.optim_step(adam_params(c, lr))
                fwd, opt = await fwd_future, await optim_future
            metrics.update({k: v for k, v in (fwd.metrics or {}).items() if k.startswith("dpo/")})
            metrics.update({f"optim/{k.split(':')[0]}": v for k, v in (opt.metrics or {}).items()})

            done = step + 1
            last = done == c.max_steps
            checkpoint = None
            if (c.save_every and done % c.save_every == 0) or last:
                checkpoint = await checkpointer.save(tc, "final" if last else f"{done:06d}", done, final=last)
                final_sampler = checkpoint["sampler_path"]
            if last and evaluating:
                sc = await asyncio.to_thread(service.create_sampling_client, model_path=final_sampler)
                final_eval = await _eval(c, envs, sc, done, metrics, logger, budget)
            metrics["time/step"] = time.time() - t_step
            metrics["time/total"] = time.time() - t0
            budget.note("rl", metrics["time/train"])
            logger.log(step, metrics)
            if checkpoint is not None:  # the commit point: a resume starts after a logged step
                checkpointer.commit(checkpoint)
            progress.set_postfix(loss=f"{metrics['dpo/loss']:.3f}", acc=f"{metrics['dpo/accuracy']:.2f}")
            progress.update(1)
            print(_line(step, metrics), flush=True)
            metrics = {}
    finally:
        progress.close()
    print(f"final sampler weights: {final_sampler}")
    summary = run_summary(c.run_dir, budget, checkpointer.steps_done(), before, final_eval)
    write_summary(c.run_dir, summary)
    for line in summary_lines(summary, trained="DPO"):
        print(line)
    return metrics


async def _eval(
    c: TrainConfig,
    envs: dict[str, EnvDatasets],
    sc: Any,
    step: int,
    metrics: Metrics,
    logger: RunLogger,
    budget: TimeBudget,
) -> Metrics:
    """The full held-out eval of the weights after `step` steps (before the first, or after the last), into
    `metrics`, `evals/step_*.jsonl` and the job's clock."""
    name, phase = ("time/eval", "eval/before_rl") if step == 0 else ("time/final_eval", "eval/final")
    with timed(metrics, name):
        rows: list[dict] = []
        result = await evaluate(envs, sc, c.max_tokens, c.temperature, c.eval_modes, seed=c.seed, rows=rows)
    logger.write_rollouts(step, rows, kind="evals")
    metrics.update(result)
    budget.note(phase, metrics[name])
    return result


def _line(step: int, m: Metrics) -> str:
    """The console line of a DPO step."""
    parts = [
        f"step {step}",
        f"loss {m['dpo/loss']:.4f}",
        f"margin {m['dpo/margin']:.3f}",
        f"acc {m['dpo/accuracy']:.2f}",
    ]
    parts += [f"{k} {v:.3f}" for k, v in m.items() if k.startswith("eval/") and k.endswith("_correct")]
    parts.append(f"{m.get('time/step', 0):.1f}s")
    return " | ".join(parts)
