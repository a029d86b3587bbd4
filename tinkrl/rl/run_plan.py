"""What a training run resolves to, decided once: the object `tinkrl train` prints and the loop runs.

`tinkrl.commands.plan.make_plan` builds it from a config before any work (it reads files and the
environment only). `--dry-run` prints `as_dict()`, every run prints `line()` first, and
`tinkrl.rl.train.main` receives it: the backend, the renderer and the run directory it names are the
ones the run uses, and nothing in the loop decides them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tinkrl.config import TrainConfig
from tinkrl.rl.teacher import Teacher


@dataclass(frozen=True)
class RunPlan:
    """A resolved training run. `config.backend` is settled (`local` or `tinker`, never `auto`);
    `renderer` is the canonical renderer name the run renders with (None only with a problem saying
    why); `environments` and `wandb` are the JSON-able sections `--dry-run` shows; `problems` stop a
    real run before any work; `teacher` is the model distilled from (`teacher.model`), None for plain RL. A
    config with `dpo.pairs` plans a `tinkrl dpo` run, whose environments only evaluate."""

    config: TrainConfig
    backend_reason: str
    model: str
    renderer: str | None
    renderer_reason: str
    environments: dict[str, dict[str, Any]]
    wandb: dict[str, Any]
    start: str
    problems: list[str] = field(default_factory=list)
    teacher: Teacher | None = None

    @property
    def backend(self) -> str:
        return self.config.backend

    @property
    def finished(self) -> bool:
        """The run directory holds this run trained to `max_steps`: nothing to do."""
        return self.start.startswith("finished")

    def as_dict(self) -> dict[str, Any]:
        """The plan as `--dry-run` prints it."""
        c = self.config
        return {
            "dialect": c.dialect,
            "dialect_reason": c.dialect_reason,
            "backend": self.backend,
            "backend_reason": self.backend_reason,
            "model_name": c.model_name,
            "model": self.model,
            "renderer": self.renderer,
            "renderer_reason": self.renderer_reason,
            "groups_per_step": sum(e["groups_per_step"] for e in self.environments.values()),
            "rollouts_per_step": sum(e["groups_per_step"] * e["group_size"] for e in self.environments.values()),
            "max_steps": c.max_steps,
            "learning_rate": c.learning_rate,
            "loss_fn": c.loss_fn,
            "adv_estimator": c.adv_estimator,
            "lora_rank": c.lora_rank,
            "max_tokens": c.max_tokens,
            "environments": self.environments,
            "teacher": self._teacher(),
            "dpo": c.dpo.model_dump() if c.dpo.pairs else None,
            "wandb": self.wandb,
            "openreward": c.openreward.model_dump(),
            "log_path": str(c.run_dir),
            "start": self.start,
            "problems": self.problems,
        }

    def _teacher(self) -> dict[str, Any] | None:
        """The teacher as `--dry-run` shows it: what it resolved to and its settings."""
        if self.teacher is None:
            return None
        where = {"base_model": self.teacher.base_model, "model_path": self.teacher.model_path}
        return where | self.config.teacher.model_dump(exclude={"model", "base_model"})

    def line(self) -> str:
        """The plan in one line, the first line of every run."""
        p = self.as_dict()
        envs = " + ".join(f"{k} {e['groups_per_step']}x{e['group_size']}" for k, e in self.environments.items())
        w = self.wandb
        logs = f"W&B {w['project']}/{w['run_name']} ({w['mode']})" if w["enabled"] else "no W&B"
        distils = f", distils from {self.teacher.line()}" if self.teacher is not None else ""
        if self.config.dpo.pairs:
            d = self.config.dpo
            evals = f", held-out eval of {', '.join(self.environments)}" if self.environments else ""
            what = (
                f"DPO on {d.pairs} (beta {d.beta}, reference {d.reference}{evals}), {self.config.batch_size} pairs/step"
            )
        else:
            what = f"{p['groups_per_step']} groups ({envs}) = {p['rollouts_per_step']} rollouts/step"
        return (
            f"plan: {what}, "
            f"{p['max_steps']} steps of {p['model_name']}{distils} on backend {p['backend']} ({p['backend_reason']}), "
            f"renderer {p['renderer']}, {p['dialect']} dialect ({p['dialect_reason']}), {logs}, {p['start']} "
            f"in {p['log_path']}"
        )
