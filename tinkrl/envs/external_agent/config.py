"""`env=external_agent`: the config of training an unmodified agent program black-box (kept light: it
imports no SDK types, so a config error answers without loading torch)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tinkrl.envs.agent_tasks.config import TaskSelection


class ExternalAgentEnvConfig(TaskSelection):
    """`env=external_agent`: each rollout is one run of an agent process talking to the run's OpenAI
    server under its own rollout id, acting on the task's sandbox, graded by the task's tests; its tasks
    chosen as in `env=tasks` (`TaskSelection`)."""

    agent: Literal["mini-swe-agent", "command"] = "mini-swe-agent"
    """`mini-swe-agent` (its `mini` CLI, `pip install 'tinkrl[agents]'`) or `command` (any program: `command`)."""
    command: list[str] | None = None
    """The agent's argv for `agent: command`; placeholders {base_url} {api_key} {model} {rollout_id}
    {instruction} {sandbox_url} {workdir} {log_dir} {temperature} {max_tokens} are filled per rollout."""
    agent_env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables of the agent process (placeholders filled as in `command`)."""
    mini_mode: Literal["text", "tools"] = "text"
    """mini-swe-agent's action format: `text` (its mini_textbased.yaml: one ```mswea_bash_command block
    per reply, small models can produce it) or `tools` (its mini.yaml: OpenAI tool calls of a bash tool)."""
    mini_config: str | None = None
    """A mini-swe-agent config file or built-in name replacing the one `mini_mode` picks."""
    mini_overrides: list[str] = Field(default_factory=list)
    """Extra mini-swe-agent `-c key=value` settings (e.g. agent.max_consecutive_format_errors=5)."""
    step_limit: int = Field(5, ge=1)
    """Model calls per rollout (mini-swe-agent's agent.step_limit; a command agent gets TINKRL_STEP_LIMIT)."""
    max_tokens_per_call: int | None = Field(None, ge=1)
    """Tokens the agent asks for per call (None: the run's max_tokens)."""
    command_timeout_s: int = Field(30, ge=1)
    """Seconds one of the agent's commands may run in the sandbox (mini-swe-agent's environment.timeout)."""
    timeout_s: float | None = Field(None, gt=0)
    """Wall-clock limit of one agent run, sampling included (None: the task's agent timeout); the
    process is killed and the sandbox graded as it stands."""
    max_context_tokens: int | None = Field(None, ge=64)
    """Context the run's server allows (None: the model's)."""

    @model_validator(mode="after")
    def _command_for_command_agents(self) -> ExternalAgentEnvConfig:
        if self.agent == "command" and not self.command:
            raise ValueError("agent: command needs `command`, the agent's argv (a list)")
        if self.agent != "command" and self.command is not None:
            raise ValueError(f"`command` is for agent: command; agent {self.agent!r} builds its own")
        return self
