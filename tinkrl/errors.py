"""Error types shared across tinkrl.

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
