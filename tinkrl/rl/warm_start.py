"""The warm start: a short supervised phase before RL, measured on its own.

A new run with `warm_start.steps > 0` first evaluates the untrained model (the `base` line of
`warm_start.jsonl`), then trains `steps` cross_entropy steps on reference transcripts (the
environments' own `demonstrations`, e.g. the shell family's reference solutions run in
sandboxes, or a JSONL file), then hands over to RL, whose step-0 eval measures the warm start
and whose last eval measures RL. So each phase's gain is visible.
"""

from __future__ import annotations

import math
import time

from tinkrl.config import TrainConfig
from tinkrl.errors import ConfigError
from tinkrl.rl.evaluation import evaluate
from tinkrl.rl.supervised import (
    Message,
    adam_params,
    conversation_datums,
    load_conversations,
    to_datum,
    train_supervised,
)
from tinkrl.rl.types import EnvDatasets
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


async def warm_start(
    c: TrainConfig, tc, renderer, envs: dict[str, EnvDatasets], sampling_client, logger: RunLogger, t0: float
) -> None:
    """Evaluate the untrained model, then run the supervised steps (logged to warm_start.jsonl)."""
    ws = c.warm_start
    if c.eval_every or c.eval_problems:
        t = time.time()
        m = await evaluate(envs, sampling_client, c.max_tokens, c.temperature)
        logger.write_phase({"phase": "base", **m, "time/eval": time.time() - t, "time/total": time.time() - t0})
        print("before the warm start: " + " | ".join(f"{k} {v:.3f}" for k, v in m.items() if k.endswith("_reward")))
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
        logger.write_phase({"phase": "sft", "sft_step": step, **m, "time/total": time.time() - t0})
        if step % 10 == 0 or step == ws.steps - 1:
            print(f"warm start step {step}: nll {m['sft/nll']:.4f}", flush=True)

    await train_supervised(tc, datums, ws.steps, ws.batch_size, adam, c.seed, on_step)
