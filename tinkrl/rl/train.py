"""The RL loop, top to bottom: sample groups, select, datums, train, refresh weights, checkpoint.

A new run with `warm_start.steps` first runs the supervised warm start (`rl/warm_start.py`).
With a teacher (`teacher.model`), the same loop is on-policy distillation: the teacher scores the
student's sampled tokens and the per-token reverse KL to it is the advantage (`rl/teacher.py`).

Each step: every environment's share of groups is rolled out concurrently with the current
sampling client; groups that failed too often (and, if asked, constant-reward groups) are
dropped; rewards become advantages and trajectories become datums; `forward_backward` and
`optim_step` are submitted back to back; then comes a sampling client for the new weights.
Held-out evals run every `eval_every` steps, checkpoints every `save_every`. With
`eval_sample_size`, the full held-out eval runs before the first RL step and after the last, and
the evals between are a fixed sample, greedy (`rl/evaluation.py`). In async mode the next steps'
rollouts are sampled while this step trains, never from weights more than
`async.max_steps_off_policy` steps old.

The job's clock (`rl/schedule.TimeBudget`) keeps the ledger of where the time went; the run ends
with `summary.json` (`rl/summary.py`): the evals before the warm start, before RL and after it,
what each phase gained, and the time split.

The loop knows environments only as `EnvDatasets`; `main` gets them from a factory (the
`tinkrl train` command builds them from the config's `environments:` map).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from tinkrl.backends import local_compute
from tinkrl.config import TrainConfig
from tinkrl.errors import ConfigError
from tinkrl.progress import progress_bar
from tinkrl.rl.checkpointer import Checkpointer
from tinkrl.rl.data import add_kl_penalty, add_observation_logprobs, build_sequences, select_groups
from tinkrl.rl.evaluation import evaluate
from tinkrl.rl.metrics import episode_rows, group_metrics, optim_metrics, rollout_rows, summary_line, timed
from tinkrl.rl.rollouts import sample_groups
from tinkrl.rl.run_dir import record_compute
from tinkrl.rl.run_plan import RunPlan
from tinkrl.rl.run_setup import EnvFactory, open_run
from tinkrl.rl.schedule import RolloutQueue, TimeBudget, lr_multiplier, run_progress
from tinkrl.rl.summary import before_rl_row, run_summary, sandbox_counts, summary_lines, write_summary
from tinkrl.rl.supervised import adam_params
from tinkrl.rl.teacher import Teacher
from tinkrl.rl.teacher import sampling_client as teacher_client
from tinkrl.rl.types import EnvDatasets, Metrics
from tinkrl.rl.warm_start import warm_start
from tinkrl.traces.docent import export_traces
from tinkrl.tracking import RunLogger


async def main(plan: RunPlan, make_envs: EnvFactory, user_metadata: dict[str, str] | None = None) -> Metrics:
    """Open the planned run (`rl/run_setup.open_run`: service, training client, environments, logging), run
    the warm start when a new run asks for one, train it, and close it. The plan's backend and renderer are
    the run's (`tinkrl train` stops on the plan's problems before calling this). `user_metadata` goes with
    the training run (and its checkpoints), as the Tinker API keeps it."""
    async with open_run(plan, make_envs, user_metadata) as run:
        if run is None:
            return {}
        config, tc = run.config, run.training_client
        budget = TimeBudget(config.time_budget_s, run.t0, config.eval_max_share)
        if run.start == 0 and config.warm_start.steps:
            sc = await asyncio.to_thread(tc.save_weights_and_get_sampling_client)
            await warm_start(config, tc, run.renderer, run.envs, sc, run.logger, budget)
            run.checkpointer.commit(await run.checkpointer.save_sampler(tc, "warm_start", 0))
        return await train(
            config,
            run.service,
            tc,
            run.start,
            run.envs,
            run.logger,
            run.checkpointer,
            budget,
            run.renderer.tokenizer,
            plan.teacher,
        )


async def train(
    c: TrainConfig,
    service: Any,
    tc: Any,
    start: int,
    envs: dict[str, EnvDatasets],
    logger: RunLogger,
    checkpointer: Checkpointer,
    budget: TimeBudget,
    tokenizer: Any,
    teacher: Teacher | None = None,
) -> Metrics:
    """Steps `start`..`c.max_steps` (or until the time budget ends them); returns the last step's metrics
    and writes the run's summary. `budget` is the job's clock; `tokenizer` (the renderer's) decodes the
    rollouts for the logs; with a `teacher`, the reverse KL to it on the student's samples is the advantage
    (on-policy distillation), the reward's weighted by `teacher.reward_coef`."""
    t0 = budget.t0
    semaphore = asyncio.Semaphore(c.max_concurrent_rollouts)
    reference = await asyncio.to_thread(kl_reference_client, c, service, checkpointer) if c.kl_penalty_coef else None
    scorer = await asyncio.to_thread(teacher_client, service, teacher) if teacher is not None else None
    reward_coef = c.teacher.reward_coef if teacher is not None else 1.0
    remove_constant = c.remove_constant_reward_groups and teacher is None
    sc = await asyncio.to_thread(tc.save_weights_and_get_sampling_client)
    sc_step = start  # the optimizer step whose weights `sc` samples
    compute = local_compute(tc)
    if compute:
        record_compute(c.run_dir, compute)
    how = f" ({compute['line']})" if compute else ""
    print(
        f"run {c.run_dir}: {c.model_name} on {c.backend}{how}, "
        f"steps {start}..{c.max_steps}, "
        f"{sum(n * c.group_size_for(k) for k, n in c.groups_per_env().items())} rollouts/step, "
        f"ready in {time.time() - t0:.1f}s"
    )
    max_failing = {key: entry.max_failing_rollouts for key, entry in c.environments.items()}
    max_lag = c.async_.max_steps_off_policy if c.async_ else 0
    rollouts = RolloutQueue(lambda step, client: sample_groups(envs, step, client, c, semaphore), c.max_steps, max_lag)
    budget.start_rl()
    recorded = before_rl_row(c.run_dir) if start > 0 else None
    if recorded is not None and recorded.get("time/eval"):  # a resumed run: the final eval costs as that one did
        budget.expect_final_eval(recorded["time/eval"])
    if c.time_budget_s:
        left = c.time_budget_s - (time.time() - t0)
        print(f"time budget: {left:.0f}s of {c.time_budget_s:.0f}s left for RL and its evals before and after")
    progress = progress_bar(c.max_steps, "train", unit="step", initial=start)
    final_sampler = None
    metrics: Metrics = {}
    before_rl: Metrics | None = None  # the full eval before the first RL step, when this process ran it
    final_eval: Metrics | None = None
    exported = start  # episodes of steps before this one went to Docent (docent.export_every)
    try:
        for step in range(start, c.max_steps):
            t_step = time.time()
            lr = c.learning_rate * lr_multiplier(c.lr_schedule, run_progress(step, start, c.max_steps, budget))
            metrics = {
                "progress/step": step,
                "progress/done_frac": (step + 1) / max(1, c.max_steps),
                "optim/lr": lr,
            }
            if c.eval_every and step % c.eval_every == 0:
                result = await _in_run_eval(c, envs, sc, step, budget, metrics, logger)
                before_rl = result if step == 0 else before_rl

            # Sample: this step's groups (already in flight in async mode); select those worth training on.
            with timed(metrics, "time/sample"):
                keyed_groups, sampled_with = await rollouts.take(step, sc, sc_step)
            if max_lag:  # how many optimizer steps behind the trained weights the sampling weights were
                metrics["async/staleness"] = step - sampled_with
            metrics.update(group_metrics(keyed_groups))
            kept, selection = select_groups(keyed_groups, max_failing, remove_constant)
            metrics.update(selection)

            # Datums: advantages per group, trajectories laid out as token sequences.
            seq_infos = build_sequences(kept, c.adv_estimator, c.adv_beta, reward_coef)
            seqs = [s for s, _ in seq_infos]
            if c.loss_fn == "dro" and seqs:
                await add_observation_logprobs(seqs, sc)
            if reference is not None and seqs:
                metrics.update(await add_kl_penalty(seqs, reference, c.kl_penalty_coef, c.kl_reference))
            if scorer is not None and seqs:  # on-policy distillation: the teacher scores every sampled token
                with timed(metrics, "time/teacher"):
                    t = c.teacher
                    kl = await add_kl_penalty(
                        seqs, scorer, t.kl_coef, "teacher", centred=False, discount=t.kl_discount_factor
                    )
                metrics.update(kl)

            # Train: forward_backward and optim_step submitted back to back.
            with timed(metrics, "time/train"):
                if seqs:
                    fwd_future = tc.forward_backward([s.to_datum(c.loss_fn) for s in seqs], c.loss_fn, c.loss_fn_config)
                    optim_future = tc.optim_step(adam_params(c, lr))
                    fwd, opt = await fwd_future, await optim_future
                    metrics.update(optim_metrics(seqs, fwd, c.loss_fn_config))
                    metrics.update({f"optim/{k.split(':')[0]}": v for k, v in (opt.metrics or {}).items()})
            for key, env in envs.items():
                if env.on_step is not None:
                    metrics.update(env.on_step(step, [g for k, g in keyed_groups if k == key]))
            logger.write_rollouts(step, rollout_rows(seq_infos, tokenizer, step))
            trained = {id(g) for _, g in kept}
            episodes = episode_rows(keyed_groups, step, tokenizer, trained, c.adv_estimator, c.adv_beta)
            logger.write_rollouts(step, episodes, kind="episodes")

            # New weights -> a new sampling client, from a checkpoint when one is due.
            done = step + 1
            budget.note_step(done - start)
            last = done == c.max_steps or budget.exhausted(steps_run=done - start)
            checkpoint = None
            if (c.save_every and done % c.save_every == 0) or last:
                checkpoint = await checkpointer.save(tc, "final" if last else f"{done:06d}", done, final=last)
                final_sampler = checkpoint["sampler_path"]
                sc = await asyncio.to_thread(service.create_sampling_client, model_path=final_sampler)
            else:
                sc = await asyncio.to_thread(tc.save_weights_and_get_sampling_client)
            sc_step = done
            if last and (c.eval_every or c.eval_problems):
                with timed(metrics, "time/final_eval"):
                    rows: list[dict] = []
                    final_eval = await evaluate(
                        envs, sc, c.max_tokens, c.temperature, c.eval_modes, seed=c.seed, rows=rows
                    )
                logger.write_rollouts(done, rows, kind="evals")
                metrics.update(final_eval)
                budget.note("eval/final", metrics["time/final_eval"])

            metrics["time/step"] = time.time() - t_step
            budget.note(
                "rl", metrics["time/step"] - metrics.get("time/eval", 0.0) - metrics.get("time/final_eval", 0.0)
            )
            metrics["time/total"] = time.time() - t0
            logger.log(step, metrics)
            if checkpoint is not None:  # the commit point: a resume starts after a logged step
                checkpointer.commit(checkpoint)
            progress.set_postfix(reward=f"{metrics.get('env/all/reward/total', float('nan')):.3f}")
            progress.update(1)
            print(summary_line(step, metrics), flush=True)
            if c.docent.export_every and (done % c.docent.export_every == 0 or last):
                await _export_docent(c, exported, done)
                exported = done
            if last:
                if done < c.max_steps:
                    print(f"stopping after step {step}: time_budget_s={c.time_budget_s:.0f} would be exceeded")
                break
    finally:  # also when a step fails: the bar's last repaint comes before the error
        rollouts.cancel()
        progress.close()
    if final_sampler:
        print(f"final sampler weights: {final_sampler}")
    summary = run_summary(c.run_dir, budget, checkpointer.steps_done(), before_rl, final_eval)
    summary["sandboxes"] = sandbox_counts(envs)
    write_summary(c.run_dir, summary)
    for line in summary_lines(summary):
        print(line)
    return metrics


async def _in_run_eval(
    c: TrainConfig,
    envs: dict[str, EnvDatasets],
    sc: Any,
    step: int,
    budget: TimeBudget,
    metrics: Metrics,
    logger: RunLogger,
) -> Metrics | None:
    """The eval at the start of `step`: the full one at step 0 (before RL) and, without eval_sample_size,
    at every eval; else the fixed sample, greedy, skipped (`eval_sample/skipped`) when it would take
    evaluation past eval_max_share of the budget. Its figures go into `metrics`, its episodes into
    `evals/step_*.jsonl`; returns the figures (None when skipped)."""
    full = step == 0 or c.eval_sample_size is None
    if step > 0 and not budget.eval_fits(sample=not full):
        metrics[f"{'eval' if full else 'eval_sample'}/skipped"] = 1.0
        return None
    with timed(metrics, "time/eval"):
        rows: list[dict] = []
        sample_size = None if full else c.eval_sample_size
        result = await evaluate(envs, sc, c.max_tokens, c.temperature, c.eval_modes, sample_size, c.seed, rows)
    logger.write_rollouts(step, rows, kind="evals")
    metrics.update(result)
    phase = "eval/before_rl" if step == 0 else ("eval/during_rl" if full else "eval/sample")
    budget.note(phase, metrics["time/eval"])
    return result


def kl_reference_client(c: TrainConfig, service: Any, checkpointer: Checkpointer) -> Any:
    """The sampling client the KL penalty measures against: the base model, or the warm start's weights."""
    if c.kl_reference == "base":
        return service.create_sampling_client(base_model=c.model_name)
    row = checkpointer.named("warm_start")
    if row is None:
        raise ConfigError(
            f"kl_reference: warm_start, but {checkpointer.path} lists no warm_start checkpoint (this run's warm "
            "start was not saved there); use kl_reference=base"
        )
    return service.create_sampling_client(model_path=row["sampler_path"])


async def _export_docent(c: TrainConfig, first: int, end: int) -> None:
    """Steps first..end-1's episodes to Docent (`docent.export_every`); a failure is printed, never fatal."""
    out = c.run_dir / "docent" / f"steps_{first:06d}-{end - 1:06d}.json"
    try:
        line = await asyncio.to_thread(
            export_traces, c.run_dir, range(first, end), c.docent.collection or c.run_name, out
        )
        print(line, flush=True)
    except Exception as e:  # an unreachable Docent must not stop training
        print(f"Docent export of steps {first}..{end - 1} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
