"""The warm start: a short supervised phase before RL, measured on its own.

A new run with `warm_start.steps > 0` first evaluates the untrained model (the `base` line of
`warm_start.jsonl`; `warm_start.base_eval`: the full held-out eval, the in-run sample, or none,
read from the eval cache when an earlier run kept it), then trains `steps` cross_entropy steps on
reference transcripts (the environments' own `demonstrations`, e.g. the shell family's reference
solutions run in sandboxes, or a JSONL file), then hands over to RL, whose step-0 eval measures
the warm start and whose last eval measures RL. So each phase's gain is visible.
"""

from __future__ import annotations

import math
import time
from typing import Any

from tinkrl.config import TrainConfig
from tinkrl.errors import ConfigError
from tinkrl.rl.eval_cache import eval_digest, read_eval, write_eval
from tinkrl.rl.evaluation import evaluate
from tinkrl.rl.schedule import TimeBudget
from tinkrl.rl.supervised import (
    Message,
    adam_params,
    conversation_datums,
    load_conversations,
    to_datum,
    train_supervised,
)
from tinkrl.rl.types import EnvDatasets, Metrics
from tinkrl.tracking import RunLogger


async def gather_demonstrations(envs: dict[str, EnvDatasets], n: int) -> list[list[Message]]:
    """About `n` reference transcripts, split evenly over the environments that offer them."""
    sources = [e.demonstrations for e in envs.values() if e.demonstrations is not None]
    if not sources:
        raise ConfigError(
            "warm_start: none of the run's environments has reference demonstrations; set warm_start.data=FILE.jsonl"
        )
    each = math.ceil(n / len(sources))
    out: list[list[Message]] = []
    for source in sources:
        out += await source(each)
    return out


def eval_settings(c: TrainConfig, sample_size: int | None) -> dict[str, Any]:
    """What, besides the model and the held-out set, decides an eval's result (the eval cache's key)."""
    modes = list(c.eval_modes) if sample_size is None else ["greedy"]
    return {
        "max_tokens": c.max_tokens,
        "modes": modes,
        "temperature": c.temperature if "sampled" in modes else None,
        "sample_size": sample_size,
        "seed": c.seed if sample_size is not None else None,
    }


async def base_eval(
    c: TrainConfig, envs: dict[str, EnvDatasets], sampling_client, logger: RunLogger, budget: TimeBudget
) -> Metrics:
    """The untrained model's eval (`warm_start.base_eval`: full or the in-run sample), read from the eval
    cache when an earlier run with the same model, held-out set and settings kept it, else run and kept;
    logged as the `base` line of warm_start.jsonl."""
    sample_size = c.eval_sample_size if c.warm_start.base_eval == "sample" else None
    settings = eval_settings(c, sample_size)
    digest = eval_digest(c.model_name, settings, envs)
    t = time.time()
    metrics = read_eval(digest) if digest else None
    cached = metrics is not None
    if metrics is None:
        metrics = await evaluate(envs, sampling_client, c.max_tokens, c.temperature, c.eval_modes, sample_size, c.seed)
        if digest:
            write_eval(digest, metrics, {"model": c.model_name, **settings})
    seconds = time.time() - t
    budget.note("eval/base", seconds)
    kind = c.warm_start.base_eval
    row = {"phase": "base", "kind": kind, "cached": cached, **metrics, "time/eval": seconds}
    logger.write_phase({**row, "time/total": time.time() - budget.t0})
    rewards = " | ".join(f"{k} {v:.3f}" for k, v in metrics.items() if k.endswith("_reward"))
    print(f"before the warm start ({kind} eval{', kept from an earlier run' if cached else ''}): {rewards}")
    return metrics


async def warm_start(
    c: TrainConfig, tc, renderer, envs: dict[str, EnvDatasets], sampling_client, logger: RunLogger, budget: TimeBudget
) -> None:
    """Evaluate the untrained model, then run the supervised steps (logged to warm_start.jsonl); `budget`
    is the job's clock, which records both."""
    ws = c.warm_start
    if ws.base_eval != "off" and (c.eval_every or c.eval_problems):
        await base_eval(c, envs, sampling_client, logger, budget)
    t = time.time()
    conversations = load_conversations(ws.data) if ws.data else await gather_demonstrations(envs, ws.demonstrations)
    datums = [
        to_datum(tokens, weights) for conv in conversations for tokens, weights in conversation_datums(renderer, conv)
    ]
    print(
        f"warm start: {ws.steps} supervised steps on {len(conversations)} transcripts ({len(datums)} datums, "
        f"gathered in {time.time() - t:.1f}s)"
    )
    adam = adam_params(c, ws.learning_rate)

    def on_step(step: int, m: dict[str, float]) -> None:
        logger.write_phase({"phase": "sft", "sft_step": step, **m, "time/total": time.time() - budget.t0})
        if step % 10 == 0 or step == ws.steps - 1:
            print(f"warm start step {step}: nll {m['sft/nll']:.4f}", flush=True)

    await train_supervised(tc, datums, ws.steps, ws.batch_size, adam, c.seed, on_step)
    budget.note("warm_start", time.time() - t)
