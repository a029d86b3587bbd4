"""Sandboxes for agent tasks: `get_provider(name, **options)` picks a backend by name.

Backends are imported lazily (docker and kubernetes pull in client libraries); a new one
registers with one line in PROVIDERS: name -> "module:Class".
"""

from __future__ import annotations

import importlib

from tinkrl.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxProvider, SandboxSpec

PROVIDERS: dict[str, str] = {
    "bwrap": "tinkrl.sandbox.bwrap:BwrapProvider",
    "docker": "tinkrl.sandbox.docker:DockerProvider",
    "kubernetes": "tinkrl.sandbox.kubernetes:KubernetesProvider",
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


__all__ = ["ExecResult", "PROVIDERS", "Sandbox", "SandboxError", "SandboxProvider", "SandboxSpec", "get_provider"]
