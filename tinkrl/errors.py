"""Error types shared across tinkrl, and `short`: an exception in one line, for messages.

`ConfigError` is bad user input (exit code 2, one line). `InfraFailure` is an
infrastructure failure during a rollout (a sandbox or env server died, a transport
error): the rollout records it as a `failure_mode` and the run goes on.
"""


class TinkrlError(Exception):
    """Base class for errors tinkrl reports to the user as one clear line."""


class ConfigError(TinkrlError):
    """A bad config key or value, or a malformed config file."""


class InfraFailure(TinkrlError):
    """Something outside the policy's control broke during an episode."""

    def __init__(self, message: str, failure_mode: str = "infra_error"):
        super().__init__(message)
        self.failure_mode = failure_mode


def short(e: BaseException) -> str:
    """An exception in one short line for a message: its type and its text, whitespace folded, cut at 200
    characters."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:200]}" if text else type(e).__name__
