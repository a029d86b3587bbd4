"""The Tinker API seam: `make_service_client(config)` gives the local engine or the Tinker service.

`backend: auto` (the default) is settled by `choose_backend`, the one place that decides it for
every command: the Tinker service when `base_url` is set, or when TINKER_API_KEY is set and either
TINKER_BASE_URL is or the model (or the checkpoint to load) is not on this machine; else the local
engine.

`backend: local` is the embedded engine in this process (`tinkrl.local.ServiceClient`).
`backend: tinker` is the official SDK (`tinker.ServiceClient`) talking HTTP to the hosted
service, or to `tinkrl serve tinker` when `base_url`/`TINKER_BASE_URL` points there. Both hand
out the same clients, so nothing above this module knows which one it got.

Two things differ between them, and are settled here once, by adapters that hold the SDK's objects
(`TinkerService`, `TinkerTrainingClient`, `TinkerSamplingClient`; every other attribute is the
SDK's own, and the SDK's objects are never changed):
- The SDK's `create_*_client` and `save_weights_and_get_sampling_client` calls return client futures;
  the adapters wait for them, so every caller gets a client, as from the local engine.
- The SDK's `get_tokenizer` downloads the tokenizer from the Hugging Face hub by model name
  (retrying for a minute when offline); the adapted clients read a local copy first.

Both service clients are context managers, and both have `close(status="success", detail=None)` returning a future.
On the Tinker service, leaving the `with` block finishes the SDK session with the run's outcome
(`exit_status`: success, errored, interrupted) so the service records how the run ended; the wait is
bounded (`FINISH_TIMEOUT_S`), since the SDK retries an unreachable service for minutes: past it, one
line on stderr says the service will expire the session, and the program goes on.

The SDK connects lazily, so a missing key or a wrong URL would otherwise surface minutes
into a run, at the first training call. `make_service_client` checks both before any work
and fails with one line. Transient errors later on are the SDK's to retry (connection
errors and 408/409/429/5xx with backoff; a lost `retrieve_future` re-polls), and the
protocol numbers each training request (`seq_id`), so a request re-sent after a lost
response is recognised by the server instead of accumulating gradients twice: a retry
never loses or doubles a step.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, Literal

from tinkrl.access import looks_like_tinker_key
from tinkrl.config import BackendConfig
from tinkrl.errors import ConfigError, TinkrlError

DEFAULT_TINKER_URL = "https://tinker.thinkingmachines.dev/services/tinker-prod"
PREFLIGHT_TIMEOUT_S = 15.0
# How long leaving a Tinker service's `with` block waits for the service to record the session's end.
FINISH_TIMEOUT_S = 30.0

SessionStatus = Literal["success", "errored", "interrupted"]


class BackendUnavailable(TinkrlError):
    """The Tinker service cannot be reached or refuses the key; raised before any work."""


def resolve_base_url(base_url: str | None) -> str:
    """The service URL: the config's, else $TINKER_BASE_URL, else the hosted service."""
    return (base_url or os.environ.get("TINKER_BASE_URL") or DEFAULT_TINKER_URL).rstrip("/")


def resolve_api_key(api_key: str | None) -> str:
    """The API key: the given one, else $TINKER_API_KEY; a missing or malformed key is a ConfigError."""
    key = api_key or os.environ.get("TINKER_API_KEY")
    if not key:
        raise ConfigError(
            "backend=tinker needs an API key: set TINKER_API_KEY (for `tinkrl serve tinker`, any "
            "tml-… key such as tml-local), or use backend=local"
        )
    if not looks_like_tinker_key(key):
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


def service_failure(exc: BaseException) -> str | None:
    """One line for an SDK error that ends a run on the Tinker service, or None for any other error.

    The service keeps a training run's state in memory: after it restarts, the SDK reconnects and finds
    the request it waits for unknown there (410: it raises for the caller to re-send it) and the run's
    models unknown (404). Nothing is applied twice, but what was trained since the last checkpoint is
    gone, so the way on is to start the run again, which resumes from that checkpoint. The same holds
    for a service that stays unreachable, or keeps answering 429 or 5xx, until the SDK's retries (about
    five minutes of them) give up."""
    try:
        import tinker
        from tinker.lib.retryable_exception import RetryableException
    except ImportError:
        return None
    how = "run the same command again to resume from the last checkpoint"
    if isinstance(exc, (RetryableException, tinker.NotFoundError)):
        return f"the Tinker service lost this run's state (restarted?): {_short(str(exc))}; {how}"
    if isinstance(exc, tinker.APIConnectionError):
        return f"the Tinker service stopped answering: {_short(str(exc))}; once it is back, {how}"
    if isinstance(exc, tinker.APIStatusError) and (exc.status_code in (408, 409, 429) or exc.status_code >= 500):
        return (
            f"the Tinker service kept answering HTTP {exc.status_code} past the SDK's retries: "
            f"{_short(exc.message)}; once it answers again, {how}"
        )
    return None


def exit_status(exc_type: type[BaseException] | None) -> SessionStatus:
    """How a session ended, as the SDK's own `with ServiceClient()` says it: `success` without an
    exception, `errored` for an Exception, `interrupted` for anything else (KeyboardInterrupt, a
    cancelled task, SystemExit)."""
    if exc_type is None:
        return "success"
    return "errored" if issubclass(exc_type, Exception) else "interrupted"


def finish_session(sdk: Any, status: SessionStatus, detail: str | None = None) -> bool:
    """Finish the SDK ServiceClient `sdk`'s session with `status`, waiting at most `FINISH_TIMEOUT_S`;
    True once the service recorded it. Else (no answer in time, or an error) one line on stderr, the
    SDK's retries stopped, and False: the service expires the session once its heartbeats stop. A
    service that no longer knows the session (404: it restarted, and the run's own error says so) has
    nothing to record: False, without a line. Never raises, so it cannot hide the exception that ended
    a run."""
    import tinker

    timeout_s = FINISH_TIMEOUT_S
    try:
        future = sdk.close(status, detail)
        try:
            future.result(timeout=timeout_s)
        except TimeoutError:
            future.future().cancel()  # the SDK would retry for minutes; this also stops its heartbeats
            raise
        return True
    except tinker.NotFoundError:
        return False
    except TimeoutError:
        why = f"no answer within {timeout_s:g}s"
    except Exception as e:
        why = f"{type(e).__name__}: {_short(str(e))}"
    print(
        f"tinkrl: could not finish the Tinker session ({status}): {why}; the service will expire it once "
        "its heartbeats stop",
        file=sys.stderr,
        flush=True,
    )
    return False


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


# The options of the embedded engine only.
LOCAL_ONLY = ("device", "precision", "sampler_precision", "compile")


def choose_backend(config: BackendConfig, checkpoint: str | None = None) -> tuple[str, str]:
    """(local or tinker, why) for a config, and for the checkpoint to be loaded when there is one: the one
    place `backend: auto` is settled (`tinkrl train`'s plan, `tinkrl eval`, `make_service_client`).
    `auto`: tinker when `base_url` is set, local when a local-engine option (`LOCAL_ONLY`) is; for a
    checkpoint, local when it is on this machine (`checkpoint_paths.is_local_checkpoint`), else tinker
    when TINKER_API_KEY is set; without one, tinker when TINKER_API_KEY is set and either TINKER_BASE_URL
    is or the model is not on this machine; else local. Reads only files and the environment: no
    service is contacted, nothing is downloaded, torch is not loaded."""
    if config.backend != "auto":
        return config.backend, "set in the config"
    if config.base_url:
        return "tinker", "base_url names a Tinker service"
    local_only = [n for n in LOCAL_ONLY if n in config.model_fields_set]
    if local_only:
        return "local", f"{local_only[0]} is set (an option of the local engine)"
    if checkpoint is not None:
        from tinkrl.local.checkpoint_paths import is_local_checkpoint

        if is_local_checkpoint(checkpoint):
            return "local", f"{checkpoint} is on this machine"
    if not os.environ.get("TINKER_API_KEY"):
        return "local", "TINKER_API_KEY is not set"
    if checkpoint is not None:
        return "tinker", f"TINKER_API_KEY is set and {checkpoint} is not on this machine"
    if os.environ.get("TINKER_BASE_URL"):
        return "tinker", "TINKER_API_KEY and TINKER_BASE_URL are set"
    from tinkrl.local.model_files import find_local_model

    if find_local_model(config.model_name) is None:
        return "tinker", f"TINKER_API_KEY is set and {config.model_name} is not on this machine"
    return "local", f"{config.model_name} is on this machine (backend=tinker trains it on the Tinker service)"


def make_service_client(config: BackendConfig | None = None, *, api_key: str | None = None) -> Any:
    """A ServiceClient for `config.backend` (`auto` settled by `choose_backend`; a training run's plan
    has settled it already); for `tinker`, checked to be reachable with the key."""
    config = config or BackendConfig()
    if config.backend == "auto":
        config = config.model_copy(update={"backend": choose_backend(config)[0]})
    if config.backend == "local":
        from tinkrl.local import ServiceClient

        precision = None if config.precision == "auto" else config.precision
        sampler = None if config.sampler_precision == "auto" else config.sampler_precision
        return ServiceClient(device=config.device, dtype=precision, compile=config.compile, sampler_precision=sampler)
    if config.backend == "tinker":
        local_only = sorted(
            name for name in LOCAL_ONLY if getattr(config, name) != BackendConfig.model_fields[name].default
        )
        if local_only:
            raise ConfigError(f"options {local_only} apply to backend=local only, not backend=tinker")
        url = resolve_base_url(config.base_url)
        key = resolve_api_key(api_key)
        check_service(url, key)
        import tinker

        return TinkerService(tinker.ServiceClient(base_url=url, api_key=key))
    raise ConfigError(f"backend must be 'local' or 'tinker', got {config.backend!r}")


def local_compute(training_client: Any) -> dict | None:
    """The compute plan of the embedded engine behind a local training client (`tinkrl.local.compute_plan`:
    device, precisions and the sampler's paths, each with its reason), for a run's first lines and
    its run.json; None for the Tinker service's clients."""
    from tinkrl.local.service import TrainingClient

    if not isinstance(training_client, TrainingClient):
        return None
    return training_client.engine.plan.as_dict()


def checkpoint_metadata(service: Any, path: str) -> dict[str, str]:
    """The `user_metadata` of the training run that saved checkpoint `path` ({} when it has none or
    the service cannot say): from the checkpoint itself on the embedded engine, else from the Tinker
    service's record of the run."""
    if not isinstance(service, TinkerService):
        from tinkrl.local.checkpoints import read_meta, resolve_path

        return dict(read_meta(resolve_path(path)).get("user_metadata") or {})
    return run_metadata(service.create_rest_client, path)


def run_metadata(rest_client: Callable[[], Any], path: str) -> dict[str, str]:
    """The `user_metadata` of the training run that saved checkpoint `path`, as the Tinker service
    behind the `RestClient` that `rest_client()` makes reports it ({} when it has none or the service
    cannot say). Blocking."""
    try:
        run = rest_client().get_training_run_by_tinker_path(path).result()
    except Exception:  # an older service, or a path it does not know: the caller's defaults apply
        return {}
    return dict(getattr(run, "user_metadata", None) or {})


class SdkAdapter:
    """An SDK object held as `sdk`: what a subclass defines is tinkrl's, every other attribute the SDK
    object's own. The SDK object itself is never changed."""

    def __init__(self, sdk: Any):
        self.sdk = sdk

    def __getattr__(self, name: str) -> Any:
        if name == "sdk" or name.startswith("__"):  # not set yet (copy, unpickling), or a protocol lookup
            raise AttributeError(name)
        return getattr(self.sdk, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.sdk!r})"


class TinkerService(SdkAdapter):
    """The SDK's ServiceClient, handing out finished clients (not client futures) whose tokenizer
    is read from a local copy when there is one, and finishing its session in bounded time on leaving
    a `with` block. Everything else is the SDK's own."""

    def __enter__(self) -> TinkerService:
        self.sdk.__enter__()  # the SDK refuses a closed client here
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        finish_session(self.sdk, exit_status(exc_type))

    def close(self, status: SessionStatus = "success", detail: str | None = None) -> Any:
        """Finish the session with `status` (the SDK's future: `.result()` waits, unbounded); a second
        close does nothing, as the service keeps the first reason."""
        return self.sdk.close(status, detail)

    def create_lora_training_client(self, *args: Any, **kwargs: Any) -> TinkerTrainingClient:
        """The SDK's new LoRA training client, finished (its future waited for) and adapted."""
        return TinkerTrainingClient(self.sdk.create_lora_training_client(*args, **kwargs).result())

    def create_training_client_from_state(self, *args: Any, **kwargs: Any) -> TinkerTrainingClient:
        """The SDK's training client with a checkpoint's weights, finished and adapted."""
        return TinkerTrainingClient(self.sdk.create_training_client_from_state(*args, **kwargs).result())

    def create_training_client_from_state_with_optimizer(self, *args: Any, **kwargs: Any) -> TinkerTrainingClient:
        """The SDK's training client with a checkpoint's weights and optimizer state, finished and adapted."""
        return TinkerTrainingClient(self.sdk.create_training_client_from_state_with_optimizer(*args, **kwargs).result())

    def create_sampling_client(self, *args: Any, **kwargs: Any) -> TinkerSamplingClient:
        """The SDK's sampling client (a base model or a checkpoint), finished and adapted."""
        return TinkerSamplingClient(self.sdk.create_sampling_client(*args, **kwargs).result())


class TinkerClient(SdkAdapter):
    """An SDK training or sampling client whose `get_tokenizer` reads the model's tokenizer from a local
    copy (the engine's model cache, the HF cache) before the SDK's download, which retries for a minute
    offline."""

    def __init__(self, sdk: Any):
        super().__init__(sdk)
        self.base_model = _base_model(sdk)

    def get_tokenizer(self) -> Any:
        """The base model's tokenizer: a local copy when there is one, else the SDK's."""
        return _local_tokenizer_first(self.base_model, self.sdk.get_tokenizer)


class TinkerSamplingClient(TinkerClient):
    """An SDK sampling client (`sample`, `compute_logprobs`, `get_base_model`: the SDK's own), with the
    local-first tokenizer."""


class TinkerTrainingClient(TinkerClient):
    """An SDK training client with the local-first tokenizer, whose `save_weights_and_get_sampling_client`
    returns the finished sampling client (not the SDK's future of it), adapted likewise, as the embedded
    engine's does."""

    def save_weights_and_get_sampling_client(self, *args: Any, **kwargs: Any) -> TinkerSamplingClient:
        """Save the current weights for sampling; a sampling client for them, once it is ready."""
        return TinkerSamplingClient(self.sdk.save_weights_and_get_sampling_client(*args, **kwargs).result())


def _base_model(client: Any) -> str | None:
    get_base = getattr(client, "get_base_model", None)
    if callable(get_base):
        return get_base()
    info = client.get_info()
    return getattr(getattr(info, "model_data", None), "model_name", None)


@functools.cache
def _cached_local_tokenizer(model_name: str) -> Any:
    from tinkrl.local.models import load_tokenizer

    return load_tokenizer(model_name)


def _local_tokenizer_first(model_name: str | None, sdk_get_tokenizer: Any) -> Any:
    from tinkrl.local.models import ModelNotFoundError

    if model_name:
        try:
            return _cached_local_tokenizer(model_name)
        except ModelNotFoundError:
            pass
    return sdk_get_tokenizer()
