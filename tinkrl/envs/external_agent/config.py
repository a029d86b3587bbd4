"""`env=external_agent`: the config of training an unmodified agent program black-box (kept light: it
imports no SDK types, so a config error answers without loading torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from tinkrl.envs.agent_tasks.config import TasksEnvConfig


class ExternalAgentEnvConfig(BaseModel):
    """`env=external_agent`: each rollout is one run of an agent process talking to the run's OpenAI
    server under its own rollout id, acting on the task's sandbox, graded by the task's tests."""

    model_config = ConfigDict(extra="forbid")

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
    tool_format: Literal["hermes", "xml"] = "hermes"
    """How the server renders tool calls for the model (tool-calling agents)."""
    path: str | list[str] = "tasks"
    """Task directories or row files, as in `env=tasks`."""
    dataset: str | None = None
    """A terminal-bench registry dataset, as in `env=tasks` (replaces `path`)."""
    task_ids: list[str] | None = None
    """Only these tasks (ids or shell globs)."""
    test_task_ids: list[str] | None = None
    """Tasks held out of training and run once each as the test set."""
    gate: bool = True
    """Train only on tasks whose solution scores 1 and whose no-op scores 0 (as in `env=tasks`)."""
    epochs: int = Field(100, ge=1)
    """Passes over the training tasks."""

    @model_validator(mode="after")
    def _command_for_command_agents(self) -> ExternalAgentEnvConfig:
        if self.agent == "command" and not self.command:
            raise ValueError("agent: command needs `command`, the agent's argv (a list)")
        if self.agent != "command" and self.command is not None:
            raise ValueError(f"`command` is for agent: command; agent {self.agent!r} builds its own")
        return self

    def tasks_config(self) -> TasksEnvConfig:
        """The task selection as the `tasks` environment reads it (one loader for both)."""
        from tinkrl.envs.agent_tasks.config import TasksEnvConfig

        fields = {"path", "dataset", "task_ids", "test_task_ids", "gate", "epochs"} & self.model_fields_set
        return TasksEnvConfig(**{k: getattr(self, k) for k in fields})
