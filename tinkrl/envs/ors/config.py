"""The fields under `env:` of a remote ORS environment (kept light: no SDK imports, so a config
error answers without loading torch)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class OpenRewardEnvConfig(BaseModel):
    """Fields under `env:` of a remote ORS environment (`environments: {Owner/Env: {env: {...}}}`)."""

    model_config = ConfigDict(extra="forbid")

    variant: str | None = None
    """Environment on the server: a hosted variant, or a self-hosted server's environment
    (its lower-cased class name). Default for a self-hosted server: the entry's name if the
    server serves it, else the server's only/default environment."""
    max_turns: int = Field(8, ge=1)
    """Assistant turns per episode; an episode that has not finished by then is non-terminal."""
    max_tool_calls_per_turn: int = Field(4, ge=1)
    """Tool calls run per assistant turn; further calls are answered with an error."""
    max_total_tokens: int | None = Field(None, ge=32)
    """Prompt + all turns must fit in this many tokens (None: no limit beyond max_turns)."""
    system_prompt: str | None = None
    """Text put before the tool list in the system turn (default: the model family's)."""
    no_tool_call_message: str = (
        'No tool call found. Call one of the tools with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.'
    )
    """Sent back when a turn has no tool call (environments without a terminal tool)."""
    secrets: dict[str, str | None] = Field(default_factory=dict)
    """Secrets for the environment's sessions; null takes the value of the same-named env var."""
    session_retries: int = Field(2, ge=0)
    """Extra attempts to open a session after a transport failure."""
    call_timeout_s: float = Field(600.0, gt=0)
    """Wall-clock limit of one server request (a tool call included); past it: infra failure."""
    api_key_env: str = "OPENREWARD_API_KEY"
    """Environment variable holding the OpenReward API key (hosted environments only)."""
    server_key_env: str | None = None
    """Environment variable holding a self-hosted server's key (`tinkrl serve env --api-key`), sent as
    X-API-Key to `base_url` only; None: send no key there."""
