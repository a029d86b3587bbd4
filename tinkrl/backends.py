"""Choosing the Tinker API implementation: `backend: local | tinker`.

`local` is the embedded engine in this process (`tinkrl.local.ServiceClient`). `tinker` is
the official SDK (`tinker.ServiceClient`) talking HTTP to the hosted service, or to
`tinkrl serve tinker` when `base_url`/`TINKER_BASE_URL` points there. Both hand out the
same clients, so nothing above this module knows which one it got.

The SDK connects lazily, so a missing key or a wrong URL would otherwise surface minutes
into a run, at the first training call. `make_service_client` checks both before any work
and fails with one line. Transient errors later on are the SDK's to retry (connection
errors and 408/409/429/5xx with backoff; a lost `retrieve_future` re-polls), and the
protocol numbers each training request (`seq_id`), so a request re-sent after a lost
response is recognised by the server instead of accumulating gradients twice: a retry
never loses or doubles a step.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from tinkrl.errors import ConfigError, TinkrlError

DEFAULT_TINKER_URL = "https://tinker.thinkingmachines.dev/services/tinker-prod"
PREFLIGHT_TIMEOUT_S = 15.0


class BackendUnavailable(TinkrlError):
    """The Tinker service cannot be reached or refuses the key; raised before any work."""


def resolve_base_url(base_url: str | None) -> str:
    return (base_url or os.environ.get("TINKER_BASE_URL") or DEFAULT_TINKER_URL).rstrip("/")


def resolve_api_key(api_key: str | None) -> str:
    key = api_key or os.environ.get("TINKER_API_KEY")
    if not key:
        raise ConfigError(
            "backend=tinker needs an API key: set TINKER_API_KEY (for `tinkrl serve tinker`, any "
            "tml-… key such as tml-local), or use backend=local"
        )
    if not (key.startswith("tml-") or key.startswith("eyJ")):
        raise ConfigError("the Tinker API key must start with 'tml-' (check TINKER_API_KEY)")
    return key


def check_service(base_url: str, api_key: str, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> None:
    """One request the SDK itself makes first (`client/config`): reachable, and the key accepted."""
    import httpx
    import tinker

    url = f"{base_url}/api/v1/client/config"
    try:
        response = httpx.post(
            url,
            json={"sdk_version": tinker.__version__},
            headers={"X-API-Key": api_key},
            timeout=timeout_s,
        )
    except httpx.HTTPError as e:
        raise BackendUnavailable(
            f"cannot reach the Tinker service at {base_url} ({type(e).__name__}: {e}); start one with "
            "`tinkrl serve tinker`, or check base_url / TINKER_BASE_URL"
        ) from None
    if response.status_code in (401, 403):
        raise BackendUnavailable(
            f"the Tinker service at {base_url} refused the API key (HTTP {response.status_code}): "
            f"{_short(response.text)}; check TINKER_API_KEY"
        )
    if response.status_code >= 400:
        raise BackendUnavailable(
            f"the Tinker service at {base_url} answered HTTP {response.status_code} to {url}: {_short(response.text)}"
        )


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def make_service_client(
    backend: Literal["local", "tinker"],
    base_url: str | None = None,
    api_key: str | None = None,
    **local_options: Any,
) -> Any:
    """A ServiceClient for `backend`; for `tinker`, checked to be reachable with the key."""
    if backend == "local":
        from tinkrl.local import ServiceClient

        return ServiceClient(**local_options)
    if backend == "tinker":
        if local_options:
            raise ConfigError(f"options {sorted(local_options)} apply to backend=local only, not backend=tinker")
        url = resolve_base_url(base_url)
        key = resolve_api_key(api_key)
        check_service(url, key)
        import tinker

        return tinker.ServiceClient(base_url=url, api_key=key)
    raise ConfigError(f"backend must be 'local' or 'tinker', got {backend!r}")
