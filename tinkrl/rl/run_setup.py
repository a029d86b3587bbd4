"""What every training run opens before its first step and closes after its last.

`tinkrl train` (RL, distillation) and `tinkrl dpo` are runs alike: they claim their run directory
(a directory of another run stops here, before any work), write the resolved `config.yaml`, stop
with one line when the directory already holds `max_steps` steps, open the service, make or
resume the training client, load the renderer the plan chose, build the environments and the run
logger. `open_run` does that once for both, and on leaving closes the environments and the
logger; the service records how the run ended (success, errored, interrupted).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinkrl.aio_thread import widen_default_executor
from tinkrl.backends import make_service_client
from tinkrl.config import TrainConfig, resolved_yaml
from tinkrl.errors import ConfigError
from tinkrl.renderers import get_renderer
from tinkrl.rl.checkpointer import Checkpointer
from tinkrl.rl.run_dir import claim_run_dir, new_run_hint
from tinkrl.rl.run_plan import RunPlan
from tinkrl.rl.types import EnvDatasets
from tinkrl.tracking import RunLogger, writing

EnvFactory = Callable[[Any, Path], dict[str, EnvDatasets]]  # (renderer, run dir) -> environments by key


@dataclass
class OpenRun:
    """A run ready for its first step: the service, the training client and the step it resumes at, the
    renderer, the environments by key, the logger and the checkpointer; `t0` is when the job began."""

    config: TrainConfig
    service: Any
    training_client: Any
    start: int
    renderer: Any
    envs: dict[str, EnvDatasets]
    logger: RunLogger
    checkpointer: Checkpointer
    t0: float


@asynccontextmanager
async def open_run(
    plan: RunPlan, make_envs: EnvFactory | None, user_metadata: dict[str, str] | None = None
) -> AsyncIterator[OpenRun | None]:
    """The planned run opened (see the module docstring), or None when its directory already trained
    `max_steps` steps (said in one line, before any model or service is touched). `make_envs` None: a run
    without environments. `user_metadata` goes with the training run and its checkpoints, as the Tinker API
    keeps it."""
    import torch

    t0 = time.time()
    widen_default_executor()  # episodes waiting for a sandbox slot never starve those holding one
    config = plan.config
    torch.manual_seed(config.seed)
    run_dir = config.run_dir
    record = claim_run_dir(config)
    with writing(run_dir / "config.yaml"):
        (run_dir / "config.yaml").write_text(resolved_yaml(config))
    checkpointer = Checkpointer(run_dir)
    done = checkpointer.steps_done()
    if done >= config.max_steps:
        print(
            f"{run_dir} already trained {done} steps (max_steps={config.max_steps}): nothing to do; raise max_steps "
            f"to train it further, or start a new run with {new_run_hint(config)}"
        )
        yield None
        return
    with make_service_client(config) as service:  # leaving it, the service records how the run ended
        tc, start = await asyncio.to_thread(checkpointer.training_client, service, config, user_metadata)
        try:
            renderer = get_renderer(tc.get_tokenizer, config.model_name, name=plan.renderer)  # loaded if needed
        except ValueError as e:
            raise ConfigError(str(e)) from None
        envs = make_envs(renderer, run_dir) if make_envs is not None else {}
        logger = RunLogger(
            run_dir,
            config.model_dump(mode="json", by_alias=True),
            config.wandb,
            run_name=config.run_name or run_dir.name,
            run_id=record.run_id,
            resume_step=start,
        )
        try:
            yield OpenRun(config, service, tc, start, renderer, envs, logger, checkpointer, t0)
        finally:
            for env in envs.values():
                if env.close is not None:
                    env.close()
            logger.close()
