"""Sandboxes for agent tasks: `get_provider(name, **options)` picks a backend by name.

Backends are imported lazily (docker and kubernetes pull in client libraries); a new one
registers with one line in PROVIDERS: name -> "module:Class". `LazyProvider` makes a run's
provider on first use and shares it between all its episodes.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable

from tinkrl.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxProvider, SandboxSpec

PROVIDERS: dict[str, str] = {
    "bwrap": "tinkrl.sandbox.bwrap:BwrapProvider",
    "docker": "tinkrl.sandbox.docker:DockerProvider",
    "kubernetes": "tinkrl.sandbox.kubernetes:KubernetesProvider",
    "harbor": "tinkrl.sandbox.harbor:HarborProvider",
}


def get_provider(name: str = "bwrap", **options) -> SandboxProvider:
    """The provider called `name`, constructed with `options` (its own keyword arguments)."""
    if name not in PROVIDERS:
        raise SandboxError(f"unknown sandbox provider {name!r}; choose one of {', '.join(PROVIDERS)}", "bad_config")
    module, cls = PROVIDERS[name].split(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            raise SandboxError(
                f"sandbox provider {name!r} is not available in this install ({module} missing)", "sandbox_unavailable"
            ) from None
        raise
    return getattr(mod, cls)(**options)


class LazyProvider:
    """A sandbox provider made on first use (from any thread) and then shared by every episode of a run.

    `source` is a provider, a function making one, or None for the default (bwrap)."""

    def __init__(self, source: Callable[[], SandboxProvider | None] | SandboxProvider | None = None):
        self._factory = source
        self._provider: SandboxProvider | None = source if isinstance(source, SandboxProvider) else None
        self._lock = threading.Lock()

    def get(self) -> SandboxProvider:
        """The provider, made now if this is the first call."""
        with self._lock:
            if self._provider is None:
                made = self._factory() if callable(self._factory) else None
                self._provider = made if made is not None else get_provider("bwrap")
            return self._provider

    def summary(self) -> dict[str, int | str]:
        """The provider's name and counts (`SandboxProvider.summary`); empty when none was made or it keeps none."""
        with self._lock:
            provider = self._provider
        counts = provider.summary() if provider is not None else {}
        return {"provider": provider.name, **counts} if counts else {}


__all__ = [
    "ExecResult",
    "LazyProvider",
    "PROVIDERS",
    "Sandbox",
    "SandboxError",
    "SandboxProvider",
    "SandboxSpec",
    "get_provider",
]
