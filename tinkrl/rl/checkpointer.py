"""A run's checkpoints: where training starts, what is saved, and when a save counts.

`checkpoints.jsonl` in the run directory lists the saved checkpoints (`name`, `batch` = steps
done, `state_path`, `sampler_path`, `final`); the weights a warm start ended with are a row of
their own, `warm_start`, with sampler weights only. A row is appended only after its step's line is
in `metrics.jsonl`, so a run killed at any point resumes after a fully logged step: it never
skips a step, nor repeats one whose line was written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tinkrl.config import TrainConfig
from tinkrl.tracking import append_jsonl, read_jsonl


class Checkpointer:
    """Saves state and sampler weights of a run, and finds where a (re)started run begins."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "checkpoints.jsonl"

    def latest(self) -> dict | None:
        """The last committed checkpoint with training state, or None."""
        rows = [r for r in read_jsonl(self.path) if r.get("state_path")]
        return rows[-1] if rows else None

    def named(self, name: str) -> dict | None:
        """The last committed checkpoint called `name` (e.g. `warm_start`), or None."""
        rows = [r for r in read_jsonl(self.path) if r.get("name") == name]
        return rows[-1] if rows else None

    def steps_done(self) -> int:
        """Steps the run has trained, by its last committed checkpoint (0 for a new run)."""
        row = self.latest()
        return int(row["batch"]) if row else 0

    def training_client(
        self, service: Any, config: TrainConfig, user_metadata: dict[str, str] | None = None
    ) -> tuple[Any, int]:
        """The training client and the step to start at: the run's own last checkpoint (weights and
        optimizer, at its step), else `resume_from`'s weights and optimizer at step 0, else a fresh LoRA
        carrying `user_metadata` (what readers of its checkpoints need, e.g. the agent's action format)."""
        row = self.latest()
        if row is not None:
            print(
                f"resuming {self.path.parent} from checkpoint {row['name']} (step {row['batch']}): {row['state_path']}"
            )
            return service.create_training_client_from_state_with_optimizer(row["state_path"]), int(row["batch"])
        if config.resume_from:
            print(f"starting from checkpoint {config.resume_from} (its weights and optimizer state), at step 0")
            return service.create_training_client_from_state_with_optimizer(config.resume_from), 0
        tc = service.create_lora_training_client(
            base_model=config.model_name, rank=config.lora_rank, seed=config.seed, user_metadata=user_metadata or None
        )
        return tc, 0

    async def save(self, training_client: Any, name: str, step: int, final: bool) -> dict:
        """Save state and sampler weights as `name`; returns the row that `commit` appends."""
        state = await training_client.save_state(name)
        sampler = await training_client.save_weights_for_sampler(name)
        return {"name": name, "batch": step, "state_path": state.path, "sampler_path": sampler.path, "final": final}

    async def save_sampler(self, training_client: Any, name: str, step: int) -> dict:
        """Save sampler weights only (no training state: a restart never resumes from it) as `name`."""
        sampler = await training_client.save_weights_for_sampler(name)
        return {"name": name, "batch": step, "state_path": None, "sampler_path": sampler.path, "final": False}

    def commit(self, row: dict) -> None:
        """Make a saved checkpoint the one a restart resumes from (after its step is logged)."""
        append_jsonl(self.path, row)
