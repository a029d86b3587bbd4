"""The RL loop, top to bottom: sample groups, score, advantages, datums, train, repeat.

Each step: take every environment's share of groups for this step, roll them out
concurrently with the current sampling client, drop groups that failed too often (and,
if asked, constant-reward groups), turn rewards into advantages, trajectories into datums,
submit `forward_backward` and `optim_step` back to back, then get a sampling client for
the new weights. Evals run every `eval_every` steps on held-out problems; checkpoints every
`save_every`. In async mode the next step's rollouts are sampled while this step trains,
never from weights more than `async.max_steps_off_policy` steps old.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tinker import types

from tinkrl.config import TrainConfig, load_config, load_dotenv_file, resolved_yaml
from tinkrl.errors import ConfigError, TinkrlError
from tinkrl.rl.advantages import compute_advantages
from tinkrl.rl.data import SequenceData, fill_observation_logprobs, trajectory_to_sequences
from tinkrl.rl.rollouts import do_group_rollout, do_rollout
from tinkrl.rl.types import TrajectoryGroup
from tinkrl.tracking import RunLogger, append_jsonl, read_jsonl

log = logging.getLogger("tinkrl.train")


# ---------------------------------------------------------------------------------------------
# Setup


def make_service(config: TrainConfig):
    from tinkrl.backends import make_service_client

    if config.backend == "local":
        precision = None if config.precision == "auto" else config.precision
        return make_service_client("local", device=config.device, dtype=precision, compile=config.compile)
    return make_service_client("tinker", base_url=config.base_url)


def _client(x):
    """Clients come back directly (local) or as client futures (SDK 0.38)."""
    return x.result() if hasattr(x, "result") else x


@dataclass
class EnvRun:
    key: str
    train: object
    test: object | None
    on_step: object | None
    groups_per_step: int
    max_failing: int


def build_envs(config: TrainConfig, renderer, run_dir: Path) -> list[EnvRun]:
    from tinkrl.envs import EnvContext, make_env_config

    sandbox_cache: list = []

    def sandbox_provider():
        if not sandbox_cache:
            from tinkrl.sandbox import get_provider

            sandbox_cache.append(get_provider(config.sandbox.provider, **config.sandbox.provider_options()))
        return sandbox_cache[0]

    runs = []
    for key, groups in config.groups_per_env().items():
        entry = config.environments[key]
        ctx = EnvContext(
            key=key,
            entry=entry,
            renderer=renderer,
            model_name=config.model_name,
            group_size=config.group_size_for(key),
            groups_per_batch=groups,
            max_tokens=config.max_tokens,
            run_dir=run_dir,
            seed=config.seed,
            sandbox_provider=sandbox_provider,
            eval_problems=config.eval_problems,
        )
        ds = make_env_config(key, entry).build(ctx)
        runs.append(EnvRun(key, ds.train, ds.test, ds.on_step, groups, entry.max_failing_rollouts))
    return runs


# ---------------------------------------------------------------------------------------------
# One step's pieces


async def sample_groups(
    envs: list[EnvRun], step: int, sampling_client, config: TrainConfig, sem: asyncio.Semaphore
) -> list[tuple[str, TrajectoryGroup]]:
    tasks = []
    for er in envs:
        for builder in er.train.get_batch(step):
            builder.max_failing_rollouts = max(builder.max_failing_rollouts, er.max_failing)
            tasks.append((er.key, builder))
    groups = await asyncio.gather(
        *(
            do_group_rollout(b, sampling_client, config.max_tokens, config.temperature, config.top_p, sem)
            for _, b in tasks
        )
    )
    return [(key, g) for (key, _), g in zip(tasks, groups)]


def group_metrics(keyed_groups: list[tuple[str, TrajectoryGroup]]) -> dict[str, float]:
    m: dict[str, float] = {}
    by_env: dict[str, list] = {}
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
        keys = sorted({k for t in turns for k in t.metrics})
        for k in keys:
            vals = [t.metrics[k] for t in turns if k in t.metrics]
            m[p + k] = float(np.mean(vals))
    groups = [g for _, g in keyed_groups if g.trajectories_G]
    if groups:
        kinds = []
        for g in groups:
            r = np.array(g.total_rewards())
            kinds.append("mixed" if r.max() > r.min() else ("good" if r.max() > 0 else "bad"))
        for kind, name in (("mixed", "frac_mixed"), ("good", "frac_all_good"), ("bad", "frac_all_bad")):
            m[f"by_group/{name}"] = kinds.count(kind) / len(kinds)
    return m


def select_groups(keyed_groups, envs: list[EnvRun], remove_constant: bool) -> tuple[list, dict[str, float]]:
    limits = {er.key: er.max_failing for er in envs}
    kept, dropped_failing, dropped_constant = [], 0, 0
    for key, g in keyed_groups:
        if len(g.failures) > limits[key] or len(g.trajectories_G) < 1:
            dropped_failing += 1
            continue
        r = g.total_rewards()
        if remove_constant and max(r) == min(r):
            dropped_constant += 1
            continue
        kept.append((key, g))
    if remove_constant and not kept and keyed_groups:  # keep one so the step still happens
        kept = [next((kg for kg in keyed_groups if kg[1].trajectories_G), keyed_groups[0])]
    return kept, {
        "groups/dropped_failing": dropped_failing,
        "groups/dropped_constant": dropped_constant,
        "groups/kept": len(kept),
    }


def build_sequences(kept, config: TrainConfig) -> list[tuple[SequenceData, dict]]:
    out = []
    for key, g in kept:
        advantages = compute_advantages(g.total_rewards(), config.adv_estimator, config.adv_beta)
        for i, (traj, adv) in enumerate(zip(g.trajectories_G, advantages)):
            for seq in trajectory_to_sequences(traj, float(adv)):
                if len(seq.tokens) > 1:
                    last = traj.transitions[-1] if traj.transitions else None
                    out.append(
                        (
                            seq,
                            {
                                "env": key,
                                "reward": g.total_rewards()[i],
                                "advantage": float(adv),
                                "stop_reason": last.stop_reason if last else "",
                                "logs": dict(last.logs) if last else {},
                            },
                        )
                    )
    return out


async def add_kl_penalty(seqs: list[SequenceData], base_client, coef: float) -> dict[str, float]:
    """KL to the base model enters the advantages: A += coef * (mean(d) - d), d = q - p_base on actions."""
    refs = await asyncio.gather(*(base_client.compute_logprobs(types.ModelInput.from_ints(s.tokens)) for s in seqs))
    diffs = []
    for s, ref in zip(seqs, refs):
        d = [(q - (b or 0.0)) * m for q, b, m in zip(s.logprobs, ref, s.mask)]
        diffs.append(d)
    total_mask = sum(sum(s.mask) for s in seqs)
    avg = sum(sum(d) for d in diffs) / max(1.0, total_mask)
    for s, d in zip(seqs, diffs):
        s.advantages = [a + coef * m * (avg - di) for a, m, di in zip(s.advantages, s.mask, d)]
    return {"kl_policy_base": avg}


def optim_metrics(seqs: list[SequenceData], fwd: types.ForwardBackwardOutput, config: TrainConfig) -> dict[str, float]:
    q_all, p_all = [], []
    for s, out in zip(seqs, fwd.loss_fn_outputs):
        mask = s.action_mask.astype(bool)
        p = out["logprobs"].to_numpy()
        q = np.asarray(s.logprobs[1:], dtype=np.float32)
        q_all.append(q[mask])
        p_all.append(p[mask])
    q, p = np.concatenate(q_all), np.concatenate(p_all)
    m = {"optim/loss": fwd.metrics.get("loss:sum", float("nan"))}
    if len(q):
        ratio = np.exp(p - q)
        lo, hi = (
            (config.loss_fn_config or {}).get("clip_low_threshold", 0.8),
            (config.loss_fn_config or {}).get("clip_high_threshold", 1.2),
        )
        m.update(
            {
                "optim/kl_sample_train_v1": float(np.mean(q - p)),
                "optim/kl_sample_train_v2": float(0.5 * np.mean((q - p) ** 2)),
                "optim/entropy": float(-np.mean(q)),
                "optim/ratio_mean": float(ratio.mean()),
                "optim/ratio_max": float(ratio.max()),
                "optim/clip_frac": float(np.mean((ratio < lo) | (ratio > hi))),
                "optim/action_tokens": float(len(q)),
            }
        )
    return m


async def evaluate(envs: list[EnvRun], sampling_client, config: TrainConfig) -> dict[str, float]:
    """Greedy accuracy and mean sampled reward on each environment's held-out problems."""
    out = {}
    for er in envs:
        if er.test is None:
            continue
        builders = list(er.test.get_batch(0))
        for label, temperature in (("greedy", 0.0), ("sampled", config.temperature)):
            envs_ = []
            for b in builders:  # one episode per held-out problem
                first, *rest = await b.make_envs()
                envs_.append(first)
                for extra in rest:
                    await extra.close()
            trajs = await asyncio.gather(
                *(do_rollout(e, sampling_client, config.max_tokens, temperature) for e in envs_)
            )
            rewards = [t.total_reward for t in trajs if t.failure_mode is None]
            out[f"eval/{er.key}/{label}_reward"] = float(np.mean(rewards)) if rewards else float("nan")
            correct = [tr.metrics["correct"] for t in trajs for tr in t.transitions if "correct" in tr.metrics]
            if correct:
                out[f"eval/{er.key}/{label}_correct"] = float(np.mean(correct))
    return out


def rollout_rows(seq_infos, tokenizer, step: int) -> list[dict]:
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


# ---------------------------------------------------------------------------------------------
# The loop


class Run:
    def __init__(self, config: TrainConfig):
        self.config = config
        self.run_dir = config.run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt_path = self.run_dir / "checkpoints.jsonl"
        self._first_eval_s = 0.0

    def _start_training_client(self, service):
        c = self.config
        last = [r for r in read_jsonl(self.ckpt_path) if r.get("state_path")]
        if last:
            row = last[-1]
            print(f"resuming {self.run_dir} from checkpoint {row['name']} (step {row['batch']}): {row['state_path']}")
            return _client(service.create_training_client_from_state_with_optimizer(row["state_path"])), int(
                row["batch"]
            )
        if c.resume_from:
            print(f"starting from weights {c.resume_from} (fresh optimizer, step 0)")
            return _client(service.create_training_client_from_state(c.resume_from)), 0
        return _client(service.create_lora_training_client(base_model=c.model_name, rank=c.lora_rank, seed=c.seed)), 0

    async def _checkpoint(self, tc, name: str, step: int, final: bool) -> dict:
        """Save state and sampler weights; returns the checkpoints.jsonl row, appended by the caller
        only after the step's metrics line (a resume never skips a step whose line was not written)."""
        state = await tc.save_state(name)
        sampler = await tc.save_weights_for_sampler(name)
        return {"name": name, "batch": step, "state_path": state.path, "sampler_path": sampler.path, "final": final}

    def _out_of_time(self, t0: float, steps_run: int) -> bool:
        """Would another step (plus the final eval, estimated like the first one) overrun the budget?"""
        budget = self.config.time_budget_s
        if budget is None:
            return False
        elapsed = time.time() - t0
        per_step = (elapsed - self._first_eval_s) / max(1, steps_run)
        return elapsed + per_step + self._first_eval_s > budget

    async def run(self) -> dict[str, float]:
        c = self.config
        (self.run_dir / "config.yaml").write_text(resolved_yaml(c))
        t0 = time.time()
        service = make_service(c)
        tc, start = self._start_training_client(service)
        tokenizer = tc.get_tokenizer()
        from tinkrl.renderers import get_renderer

        renderer = get_renderer(tokenizer, c.model_name)
        envs = build_envs(c, renderer, self.run_dir)
        logger = RunLogger(
            self.run_dir, c.model_dump(mode="json", by_alias=True), c.wandb, c.run_name or self.run_dir.name, start
        )
        base_client = _client(service.create_sampling_client(base_model=c.model_name)) if c.kl_penalty_coef else None
        sem = asyncio.Semaphore(c.max_concurrent_rollouts)
        sc = await asyncio.to_thread(lambda: _client(tc.save_weights_and_get_sampling_client()))
        sc_step = start
        print(
            f"run {self.run_dir}: {c.model_name} on {c.backend}, steps {start}..{c.max_steps}, "
            f"{c.batch_size} rollouts/step, ready in {time.time() - t0:.1f}s"
        )
        adam = types.AdamParams(
            learning_rate=c.learning_rate,
            beta1=c.adam_beta1,
            beta2=c.adam_beta2,
            eps=c.adam_eps,
            weight_decay=c.weight_decay,
            grad_clip_norm=c.grad_clip_norm,
        )
        max_lag = c.async_.max_steps_off_policy if c.async_ else 0
        inflight: dict[int, tuple[asyncio.Future, int]] = {}  # step -> (its rollouts, weights version used)
        metrics: dict[str, float] = {}
        from tqdm import tqdm

        bar = tqdm(
            total=c.max_steps,
            initial=start,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            disable=not sys.stderr.isatty() and not c.run_name,
        )
        final_sampler = None
        for step in range(start, c.max_steps):
            t_step = time.time()
            metrics = {
                "progress/step": step,
                "progress/done_frac": (step + 1) / max(1, c.max_steps),
                "optim/lr": c.learning_rate,
            }
            if c.eval_every and step % c.eval_every == 0:
                t = time.time()
                metrics.update(await evaluate(envs, sc, c))
                metrics["time/eval"] = time.time() - t
                self._first_eval_s = self._first_eval_s or metrics["time/eval"]
            # Rollouts: this step's (already in flight in async mode) and, in async mode, the next ones.
            t = time.time()
            if step not in inflight:
                inflight[step] = (asyncio.ensure_future(sample_groups(envs, step, sc, c, sem)), sc_step)
            rollouts, sampled_with = inflight.pop(step)
            keyed_groups = await rollouts
            for ahead in range(step + 1, min(step + 1 + max_lag, c.max_steps)):
                if ahead not in inflight:
                    inflight[ahead] = (asyncio.ensure_future(sample_groups(envs, ahead, sc, c, sem)), sc_step)
            metrics["time/sample"] = time.time() - t
            if max_lag:  # how many optimizer steps behind the trained weights the sampling weights were
                metrics["async/staleness"] = step - sampled_with
            metrics.update(group_metrics(keyed_groups))
            kept, gm = select_groups(keyed_groups, envs, c.remove_constant_reward_groups)
            metrics.update(gm)
            seq_infos = build_sequences(kept, c)
            seqs = [s for s, _ in seq_infos]
            if c.loss_fn == "dro" and seqs:  # observation positions carry the sampler's own logprobs
                prompt_lps = await asyncio.gather(
                    *(sc.compute_logprobs(types.ModelInput.from_ints(s.tokens)) for s in seqs)
                )
                for s, lps in zip(seqs, prompt_lps):
                    fill_observation_logprobs(s, lps)
            if base_client is not None and seqs:
                metrics.update(await add_kl_penalty(seqs, base_client, c.kl_penalty_coef))
            # Train: forward_backward and optim_step submitted back to back.
            t = time.time()
            if seqs:
                datums = [s.to_datum() for s in seqs]
                fwd_future = tc.forward_backward(datums, c.loss_fn, c.loss_fn_config)
                optim_future = tc.optim_step(adam)
                fwd, opt = await fwd_future, await optim_future
                metrics.update(optim_metrics(seqs, fwd, c))
                metrics.update({f"optim/{k.split(':')[0]}": v for k, v in (opt.metrics or {}).items()})
            metrics["time/train"] = time.time() - t
            for er in envs:
                if er.on_step is not None:
                    metrics.update(er.on_step(step, [g for k, g in keyed_groups if k == er.key]))
            if c.openreward.upload:
                from tinkrl.envs.openreward import upload_rollouts

                metrics.update(
                    upload_rollouts(
                        keyed_groups,
                        step=step,
                        run_name=c.openreward.run_name or c.run_name or self.run_dir.name,
                        model_name=c.model_name,
                        lora_rank=c.lora_rank,
                        batch_size=c.batch_size,
                        lr=c.learning_rate,
                    )
                )
            logger.write_rollouts(step, rollout_rows(seq_infos, tokenizer, step))
            # New weights -> new sampling client (a checkpoint when one is due).
            done = step + 1
            last = done == c.max_steps or self._out_of_time(t0, step - start + 1)
            ckpt_row = None
            if (c.save_every and done % c.save_every == 0) or last:
                name = "final" if last else f"{done:06d}"
                ckpt_row = await self._checkpoint(tc, name, done, last)
                final_sampler = ckpt_row["sampler_path"]
                sc = _client(service.create_sampling_client(model_path=final_sampler))
            else:
                sc = await asyncio.to_thread(lambda: _client(tc.save_weights_and_get_sampling_client()))
            sc_step = done
            if last and (c.eval_every or c.eval_problems):
                t = time.time()
                metrics.update(await evaluate(envs, sc, c))
                metrics["time/final_eval"] = time.time() - t
            metrics["time/step"] = time.time() - t_step
            metrics["time/total"] = time.time() - t0
            logger.log(step, metrics)
            if ckpt_row is not None:  # the commit point: resuming starts after a logged step
                append_jsonl(self.ckpt_path, ckpt_row)
            bar.set_postfix(reward=f"{metrics.get('env/all/reward/total', float('nan')):.3f}")
            bar.update(1)
            print(_summary(step, metrics), flush=True)
            if last:
                if done < c.max_steps:
                    print(f"stopping after step {step}: time_budget_s={c.time_budget_s:.0f} would be exceeded")
                break
        for task, _ in inflight.values():
            task.cancel()
        bar.close()
        logger.close()
        if c.openreward.upload:
            from tinkrl.envs.openreward import close_uploads

            close_uploads()
        if final_sampler:
            print(f"final sampler weights: {final_sampler}")
        return metrics


def _summary(step: int, m: dict[str, float]) -> str:
    parts = [f"step {step}", f"reward {m.get('env/all/reward/total', float('nan')):.3f}"]
    for k, v in m.items():
        if k.startswith("eval/") and k.endswith("_correct"):
            parts.append(f"{k} {v:.3f}")
    parts.append(f"{m.get('time/step', 0):.1f}s")
    return " | ".join(parts)


def main(config: TrainConfig) -> dict[str, float]:
    torch.manual_seed(config.seed)
    return asyncio.run(Run(config).run())


USAGE = """usage: tinkrl train [CONFIG.yaml] [key=value ...]
       tinkrl train --config_path CONFIG.yaml --overrides key=value ...

Keys are TrainConfig fields (see tinkrl/config.py and README); dotted keys reach nested fields
(wandb.project=x), env=NAME env.field=value picks one environment."""


def parse_cli(argv: list[str]) -> tuple[str | None, list[str]]:
    config_path, overrides, i = None, [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            raise SystemExit(print(USAGE) or 0)
        if a in ("--config_path", "--config-path", "--config"):
            config_path, i = argv[i + 1], i + 2
            continue
        if a == "--overrides":
            i += 1
            while i < len(argv) and not argv[i].startswith("--"):
                overrides.append(argv[i])
                i += 1
            continue
        if "=" not in a and (a.endswith((".yaml", ".yml")) or Path(a).is_file()) and config_path is None:
            config_path = a
        else:
            overrides.append(a)
        i += 1
    return config_path, overrides


def cli_main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    load_dotenv_file()
    try:
        config_path, overrides = parse_cli(argv)
        config = load_config(config_path, overrides)
    except ConfigError as e:
        print(f"tinkrl train: error: {e}", file=sys.stderr)
        return 2
    try:
        main(config)
    except ConfigError as e:
        print(f"tinkrl train: error: {e}", file=sys.stderr)
        return 2
    except TinkrlError as e:
        print(f"tinkrl train: {e}", file=sys.stderr)
        return 1
    return 0
