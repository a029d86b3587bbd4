"""The limits and prompt of one agent episode, declared once.

`EpisodeLimits` is what `TaskSession` reads. The environments' configs (`env=tasks`, `env=shell`)
are episode limits with their own defaults and further fields, and a harness agent (Harbor,
terminal-bench) builds one from its kwargs. Kept light (pydantic only), so a config error answers
without loading the SDK.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ActionFormat = Literal["tools", "shell"]


class EpisodeLimits(BaseModel):
    """How long an agent episode may run, how its actions are read, and what it is told first."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(10, ge=1)
    """Assistant turns per episode; the last one ends the episode and it is graded."""
    max_tokens_per_turn: int | None = Field(None, ge=1)
    """Tokens sampled per turn (None: the trainer's max_tokens)."""
    max_context_tokens: int = Field(8192, ge=64)
    """Prompt + all turns must fit; an episode that overflows ends with reward 0."""
    max_total_tokens: int | None = Field(None, ge=1)
    """Sampled tokens per episode, all turns together (None: no limit besides the context)."""
    episode_timeout_s: float | None = Field(None, gt=0)
    """Time limit of an episode (None: the task's agent timeout); see `timeout_includes_sampling`."""
    timeout_includes_sampling: bool = False
    """Count the model's sampling time against the limit (wall clock, as terminal-bench does). Off by
    default: sampling latency depends on the trainer's batch and hardware, not on the policy, so only
    the time the agent's commands take in the sandbox is counted."""
    command_timeout_s: float = Field(60.0, gt=0)
    """Ceiling on one command (the model may ask for less); a timeout is an observation."""
    end_on_repeated_failure: bool = True
    """End the episode (graded as it stands) when a command fails the same way a second time: the same
    command with the same output, which repeating will not change."""
    max_observation_chars: int = Field(8000, ge=200)
    """A tool result longer than this keeps its head and tail."""
    action_format: ActionFormat = "tools"
    """How the agent acts: `tools` (tool calls in the renderer's format, the tool list in the system
    prompt) or `shell` (one ```bash block per turn, DONE when finished; its output comes back as the
    next turn: a short prompt small models follow)."""
    system_prompt: str | None = None
    """System prompt (before the tool list in the tools format); `{workdir}` and `{max_turns}` are filled in;
    None: the action format's own."""
