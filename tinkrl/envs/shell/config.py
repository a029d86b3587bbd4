"""`env=shell`: the generated shell task family's config (kept light: no SDK types; the template names
come from the templates module, which needs only numpy, so a config error answers at once)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tinkrl.agents.limits import ActionFormat, EpisodeLimits
from tinkrl.envs.shell.templates import HELD_OUT_TEMPLATES, TRAIN_TEMPLATES

TRAIN_TEMPLATE_NAMES = list(TRAIN_TEMPLATES)
HELD_OUT_TEMPLATE_NAMES = list(HELD_OUT_TEMPLATES)


class ShellEnvConfig(EpisodeLimits):
    """`env=shell`: generated shell tasks (files, directories, text tools) in sandboxes, graded on the
    whole end state of the working directory; a seeded train stream, held-out instances of the trained
    templates, and held-out templates never trained on. The episode limits (`EpisodeLimits`) with
    their defaults for short shell tasks."""

    templates: list[str] = Field(default_factory=lambda: list(TRAIN_TEMPLATE_NAMES), min_length=1)
    """Templates to train on (default: every training template)."""
    held_out_templates: list[str] = Field(default_factory=lambda: list(HELD_OUT_TEMPLATE_NAMES))
    """Templates never trained on, evaluated to measure generalisation (`eval/<key>/heldout_templates/...`)."""
    test_per_template: int = Field(4, ge=0)
    """Held-out instances per trained template in the eval set (new names and contents; never in the train stream)."""
    test_per_held_out_template: int | None = Field(None, ge=0)
    """Instances per held-out template in the eval set (None: test_per_template)."""
    paraphrase: bool = False
    """Tell each instance of a trained template in one of its template's wordings (other verbs and word
    orders), its paths relative to the working directory or absolute (both drawn per instance), in
    training, demonstrations and held-out instances alike; off: always the first wording, relative
    paths. Held-out templates have one wording."""
    downweight_constant: float = Field(0.0, ge=0.0, le=1.0)
    """Draw less often the templates that no longer teach the run: a template whose last four groups
    each scored the same on every attempt (all solved or all failed: no advantage, nothing for GRPO to
    learn) comes up this much less often, in proportion for fewer; 0: every template equally often.
    The metric `env/<key>/constant_templates` counts them."""
    max_turns: int = Field(3, ge=1)
    """Assistant turns per episode; the last one ends the episode and it is graded."""
    max_context_tokens: int = Field(1024, ge=64)
    """Prompt + all turns must fit; an episode that overflows ends with reward 0."""
    episode_timeout_s: float | None = Field(60.0, gt=0)
    """Time the agent's commands may take in all."""
    command_timeout_s: float = Field(10.0, gt=0)
    """Ceiling on one command; a timeout is an observation."""
    max_observation_chars: int = Field(600, ge=200)
    """A command's output longer than this keeps its head and tail."""
    action_format: ActionFormat = "shell"
    """`shell`: one ```bash block per turn, DONE when finished; `tools`: JSON tool calls."""
    tool_format: Literal["hermes", "xml"] = "hermes"
    """Tool-call syntax when action_format is tools."""
    recovery_demonstrations: float = Field(0.0, ge=0.0, le=1.0)
    """Share of warm-start demonstrations, among templates that have a typical mistake, that first run
    the mistake, see its error and then fix it (they need max_turns >= 3)."""
    eval_tasks: list[str] = Field(default_factory=list)
    """Tasks written by hand (Harbor or terminal-bench task directories, or folders of them) added to the
    held-out set under the tag `handwritten`: played in this environment's action format and limits,
    one episode each per eval mode, never trained on."""

    @model_validator(mode="after")
    def _known_templates(self) -> ShellEnvConfig:
        known = TRAIN_TEMPLATE_NAMES + HELD_OUT_TEMPLATE_NAMES
        for field in ("templates", "held_out_templates"):
            unknown = [t for t in getattr(self, field) if t not in known]
            if unknown:
                raise ValueError(f"{field}: unknown template(s) {', '.join(unknown)}; known: {', '.join(known)}")
        both = sorted(set(self.templates) & set(self.held_out_templates))
        if both:
            raise ValueError(f"templates both trained on and held out: {', '.join(both)}")
        return self


ShellConfig = ShellEnvConfig  # the name users type: env=ShellConfig
