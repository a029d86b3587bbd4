"""`env=ErdosConfig env.n_points=200 ...`: the Erdős environment's config (kept light: it imports no
SDK types, so a config error answers without loading torch)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_CLOSING_TEXT = (
    "\n\n... I am out of thinking budget and must give my final answer now.\nFinal code:\n```python\n"
)


class ErdosEnvConfig(BaseModel):
    """`env=ErdosConfig env.n_points=200 ...`: the Erdős minimum-overlap discovery environment."""

    model_config = ConfigDict(extra="forbid")

    # Test-time discovery optimises the best sample, not the mean: TTT-Discover trains this env with
    # the entropic advantage (rl/advantages.py) at the trainer's default beta of 2.
    run_defaults: ClassVar[dict[str, Any]] = {"adv_estimator": "entropic"}

    n_points: int = Field(200, ge=2, le=5000)
    """Samples of h on [0, 2]; the model's run() must return exactly this many values."""
    buffer_size: int = Field(16, ge=1)
    """Best constructions kept for reuse (random initial starts are kept in addition)."""
    epsilon: float = Field(0.125, ge=0.0, le=1.0)
    """Probability that a group starts from a random buffer entry instead of the next best."""
    max_tokens: int | None = Field(2048, ge=1)
    """Token budget of the first response (None: the trainer's max_tokens)."""
    teacher_forcing: bool = True
    """When the first response hits max_tokens, force `closing_text` and ask for the final code."""
    context_window_tokens: int = Field(4096, ge=256)
    """Prompt + response (both phases) must fit in this many tokens."""
    sampler: Literal["greedy", "puct"] = "greedy"
    """How groups pick their starting construction (see buffer.py)."""
    puct_c: float = Field(1.0, ge=0.0)
    """Exploration constant of the PUCT rule."""
    children_per_parent: int = Field(2, ge=1)
    """Best valid children of one group that enter the buffer."""
    initial_states: int = Field(4, ge=1)
    """Random constructions the buffer starts with."""
    timeout_s: float = Field(60.0, gt=0)
    """Wall-clock limit of one program in the sandbox."""
    memory_mb: int = Field(1024, ge=128)
    """Address-space limit of one program."""
    integral_tol: float = Field(1e-6, gt=0)
    """|∫h − 1| allowed before h is normalised to integral 1."""
    parallel_runs: int | None = Field(None, ge=1)
    """Programs run at once (None: CPU count)."""
    closing_text: str = DEFAULT_CLOSING_TEXT
    """The forced text of two-phase sampling (not trained on)."""
    prompt_code_chars: int = Field(4000, ge=0)
    """The parent's code is shown up to this many characters."""
    stdout_tail_chars: int = Field(500, ge=0)
    """The tail of the parent's stdout shown in the prompt."""
    plot: bool = True
    """Write best_h.png whenever the best construction improves."""


ErdosConfig = ErdosEnvConfig  # the name users type: env=ErdosConfig
