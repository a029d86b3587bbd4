"""The HTTP side of `tinkrl serve tinker`: aiohttp routes speaking Tinker SDK 0.38.0's protocol.

Why aiohttp: the protocol is long-poll heavy (every sample and training request is
followed by `retrieve_future` calls that wait up to ~30 s), so one asyncio loop holding
thousands of cheap waiting requests beats a thread per connection; aiohttp is a mature
HTTP/1.1 keep-alive server with no ASGI layer in between, and tinker-cookbook already
depends on it.

Every endpoint the unmodified SDK calls in a training/sampling session is served; calls
the local engine cannot honour answer a 4xx with a sentence saying so (never a silent
200), and unknown paths a 404 naming the supported set. Accepted API keys: any the SDK
itself accepts (`tml-…`), or exactly `--api-key` when the server was started with one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pydantic
from aiohttp import web
from tinker import types

from tinkrl.access import key_matches, looks_like_tinker_key, request_key
from tinkrl.aio_thread import UNREADABLE_BODY, serve_app_in_thread
from tinkrl.local.checkpoint_paths import META, SCHEME, checkpoint_dir, checkpoints_root
from tinkrl.tinker_server import wire
from tinkrl.tinker_server.engine_calls import named_kwargs, settle_blocking
from tinkrl.tinker_server.futures import PromiseTable
from tinkrl.tinker_server.sessions import Registry, TrainingModel, UserError

log = logging.getLogger("tinkrl.tinker_server")

SDK_VERSION = "0.38.0"
PROTO = "application/x-protobuf"
# A retrieve_future waits this long before answering "try again" (the SDK allows 45 s).
LONG_POLL_S = 25.0
# forward_backward bodies below this are decoded on the loop (a thread hop costs more).
INLINE_DECODE_BYTES = 256 * 1024
# Sessions that stop heartbeating (the SDK beats every 10 s) are closed after this long.
SESSION_IDLE_S = 15 * 60.0

# Flags the SDK reads from /client/config. Everything a local server cannot back is off.
CLIENT_CONFIG: dict[str, Any] = {
    "pjwt_auth_enabled": False,
    "credential_default_source": "api_key",
    "use_pyqwest_transport": False,  # plain httpx; nothing to gain on loopback
    "proto_compress_fwdbwd": False,  # zstd costs more than loopback bandwidth saves
    "parallel_fwdbwd_chunks": True,  # the per-model reorder buffer handles parallel chunks
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}
DYNAMIC_CONFIG: dict[str, Any] = {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

# Known SDK endpoints this server does not implement, with the reason given to callers.
UNSUPPORTED: dict[str, str] = {
    "/api/v1/auth/token": "JWT exchange is off on this server; send the API key itself",
    "/api/v1/retrieve_futures": "session-wide polling is off (client config sample_use_retrieve_futures=false)",
    "/api/v1/join_sampling_session": "sampling-session joining is off (client config sample_join_sampling_session=false)",
    "/api/v1/create_custom_loss": "server-side custom losses are off; forward_backward_custom runs client-side",
    "/api/v1/save_weights_external": "external (HF-format) export is `tinkrl export`, not an API call, here",
    "/api/v1/copy_weights": "copying weights between projects has no meaning on a local server",
    "/api/v1/unload_model": "models are released when their session finishes",
}


def _key_ok(key: str | None, required: str | None) -> bool:
    if not key:
        return False
    if required is not None:
        return key_matches(key, required)
    return looks_like_tinker_key(key)


class TinkerServer:
    """The aiohttp application around one engine `ServiceClient`."""

    def __init__(self, engine: Any, api_key: str | None = None, long_poll_s: float = LONG_POLL_S):
        self.engine = engine
        self.api_key = api_key
        self.long_poll_s = long_poll_s
        self.promises = PromiseTable()
        self.registry = Registry(engine, self.promises)
        self.app = web.Application(middlewares=[self._errors_and_auth], client_max_size=1 << 31)
        self._routes()
        self.app.on_startup.append(self._start_background)
        self.app.on_cleanup.append(self._stop_background)
        self._janitor: asyncio.Task | None = None

    # ------------------------------------------------------------------ plumbing
    def _routes(self) -> None:
        post: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] = {
            "/api/v1/client/config": self.client_config,
            "/api/v1/client/dynamic_config": self.dynamic_config,
            "/api/v1/create_session": self.create_session,
            "/api/v1/session_heartbeat": self.session_heartbeat,
            "/api/v1/sessions/{session_id}/finish": self.finish_session,
            "/api/v1/telemetry": self.telemetry,
            "/api/v1/create_model": self.create_model,
            "/api/v1/get_info": self.get_info,
            "/api/v1/forward_backward": self.forward_backward,
            "/api/v1/optim_step": self.optim_step,
            "/api/v1/save_weights": self.save_weights,
            "/api/v1/save_weights_for_sampler": self.save_weights_for_sampler,
            "/api/v1/load_weights": self.load_weights,
            "/api/v1/create_sampling_session": self.create_sampling_session,
            "/api/v1/asample": self.asample,
            "/api/v1/retrieve_future": self.retrieve_future,
            "/api/v1/cancel_future": self.cancel_future,
        }
        get: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] = {
            "/api/v1/healthz": self.healthz,
            "/api/v1/get_server_capabilities": self.server_capabilities,
            "/api/v1/samplers/{sampler_id}": self.get_sampler,
            "/api/v1/sessions/{session_id}": self.get_session,
            "/api/v1/training_runs/{training_run_id}": self.get_training_run,
            "/api/v1/openapi.json": self.openapi,
        }
        for path, handler in post.items():
            self.app.router.add_post(path, handler)
        for path, handler in get.items():
            self.app.router.add_get(path, handler)
        self._supported = sorted([f"POST {p}" for p in post] + [f"GET {p}" for p in get])
        self.description = describe_routes(list(post), list(get))

    @web.middleware
    async def _errors_and_auth(self, request: web.Request, handler) -> web.StreamResponse:
        if request.path in UNSUPPORTED:
            return _detail(400, f"{request.path} is not supported by tinkrl serve tinker: {UNSUPPORTED[request.path]}")
        if request.path != "/api/v1/healthz":
            if not _key_ok(request_key(request.headers), self.api_key):
                why = (
                    "this server was started with --api-key; send that key" if self.api_key else "send X-API-Key: tml-…"
                )
                return _detail(401, f"invalid or missing API key ({why})")
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return _detail(
                404,
                f"{request.method} {request.path} is not part of the Tinker protocol served by tinkrl "
                f"(SDK {SDK_VERSION}); supported: {', '.join(self._supported)}",
            )
        except web.HTTPMethodNotAllowed:
            return _detail(405, f"{request.method} is not allowed on {request.path}")
        except UserError as e:
            return _detail(e.status, str(e))
        except (wire.WireError, pydantic.ValidationError, json.JSONDecodeError, *UNREADABLE_BODY) as e:
            return _detail(400, f"bad {request.path} request: {' '.join(str(e).split())}")
        except web.HTTPException:
            raise
        except Exception as e:
            log.exception("%s %s failed", request.method, request.path)
            # 5xx makes the SDK retry; an internal bug is not transient, so say 400 with the cause.
            return _detail(400, f"{request.path} failed inside tinkrl: {type(e).__name__}: {e}")

    async def _start_background(self, _app: web.Application) -> None:
        self._janitor = asyncio.ensure_future(self._janitor_loop())

    async def _stop_background(self, _app: web.Application) -> None:
        if self._janitor is not None:
            self._janitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._janitor

    async def _janitor_loop(self) -> None:
        while True:
            await asyncio.sleep(30)
            self.promises.sweep()
            self.registry.expire_idle_sessions(SESSION_IDLE_S)

    # ------------------------------------------------------------------ session endpoints
    async def client_config(self, request: web.Request) -> web.Response:
        await _json_body(request)
        return web.json_response(CLIENT_CONFIG)

    async def dynamic_config(self, request: web.Request) -> web.Response:
        return web.json_response(DYNAMIC_CONFIG)

    async def openapi(self, request: web.Request) -> web.Response:
        """This server's OpenAPI description (`describe_routes`)."""
        return web.json_response(self.description)

    async def healthz(self, request: web.Request) -> web.Response:
        """ok, and on the embedded engine how each of its engines computes (their compute plans)."""
        plans = getattr(self.engine, "compute_plans", None)
        return web.json_response({"status": "ok", **({"compute": plans()} if callable(plans) else {})})

    async def server_capabilities(self, request: web.Request) -> web.Response:
        getter = getattr(self.engine, "get_server_capabilities", None)
        caps = await asyncio.to_thread(getter) if callable(getter) else None
        if caps is not None and hasattr(caps, "result") and not hasattr(caps, "supported_models"):
            caps = await asyncio.to_thread(caps.result)
        return web.json_response(wire.to_json(caps) if caps is not None else {"supported_models": []})

    async def create_session(self, request: web.Request) -> web.Response:
        req = types.CreateSessionRequest.model_validate(await _json_body(request))
        session = self.registry.create_session(req.sdk_version, list(req.tags))
        warning = None
        if req.sdk_version != SDK_VERSION:
            warning = f"tinkrl serves the protocol of tinker {SDK_VERSION}; this client is {req.sdk_version}"
        return web.json_response(
            wire.to_json(types.CreateSessionResponse(session_id=session.session_id, warning_message=warning))
        )

    async def session_heartbeat(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        self.registry.live_session(str(body.get("session_id")))
        return web.json_response({"type": "session_heartbeat"})

    async def finish_session(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        reason = (body.get("reason") or {}).get("type", "success")
        self.registry.finish_session(request.match_info["session_id"], str(reason))
        return web.json_response({})

    async def get_session(self, request: web.Request) -> web.Response:
        session = self.registry.sessions.get(request.match_info["session_id"])
        if session is None:
            raise UserError(f"unknown session {request.match_info['session_id']!r}", status=404)
        return web.json_response(
            {
                "session_id": session.session_id,
                "training_run_ids": sorted(session.model_ids),
                "sampler_ids": sorted(session.sampler_ids),
            }
        )

    async def get_training_run(self, request: web.Request) -> web.Response:
        """A training run's record (the SDK's `RestClient.get_training_run[_by_tinker_path]`): its base
        model, LoRA rank and user_metadata (what its checkpoints' readers need, e.g. an agent's action
        format and turn cap), from the newest checkpoint it saved on this machine."""
        run_id = request.match_info["training_run_id"]
        found = newest_run_meta(run_id)
        if found is None:
            raise UserError(f"unknown training run {run_id!r}: no checkpoint of it under {checkpoints_root()}", 404)
        meta, saved = found
        record = types.TrainingRun(
            training_run_id=run_id,
            base_model=meta["base_model"],
            model_owner="local",
            is_lora=True,
            lora_rank=(meta.get("lora") or {}).get("rank"),
            last_request_time=datetime.fromtimestamp(saved, UTC),
            user_metadata=meta.get("user_metadata") or None,
        )
        return web.json_response(record.model_dump(mode="json"))

    async def telemetry(self, request: web.Request) -> web.Response:
        await request.read()  # accepted and dropped: nothing leaves this machine
        return web.json_response({"status": "accepted"})

    # ------------------------------------------------------------------ training endpoints
    async def create_model(self, request: web.Request) -> web.Response:
        req = types.CreateModelRequest.model_validate(await _json_body(request))
        optimizer = req.optimizer_config
        if getattr(optimizer, "type", "adamw") != "adamw":
            raise UserError(f"optimizer {optimizer.type!r} is not supported by tinkrl's engine (adamw only)")
        lora = req.lora_config or types.LoraConfig(rank=32)
        model = self.registry.new_model(req.session_id, req.model_seq_id, req.base_model, lora.rank)

        def create(m: TrainingModel) -> Any:
            # Runs on the model's submitter thread and blocks it: seq 1 must see the client.
            m.client = settle_blocking(
                self.engine.create_lora_training_client(
                    req.base_model,
                    rank=lora.rank,
                    seed=lora.seed,
                    train_mlp=lora.train_mlp,
                    train_attn=lora.train_attn,
                    train_unembed=lora.train_unembed,
                    user_metadata=req.user_metadata,
                )
            )
            return m.client

        def encode(_client: Any) -> tuple[str, Any]:
            return "json", {"model_id": model.model_id, "type": "create_model"}

        promise = self.registry.run_first(model, "CreateModel", create, encode)
        return _future(promise.request_id, model_id=model.model_id)

    async def get_info(self, request: web.Request) -> web.Response:
        req = types.GetInfoRequest.model_validate(await _json_body(request))
        model = self.registry.model(req.model_id)
        info = model.require_client().get_info()
        if hasattr(info, "result") and not hasattr(info, "model_data"):
            info = await asyncio.to_thread(info.result)
        payload = wire.to_json(info)
        payload["model_id"] = model.model_id
        engine = getattr(model.client, "engine", None)  # the embedded engine's: how it computes
        if engine is not None and hasattr(engine, "plan"):
            payload["compute"] = engine.plan.as_dict()
        # The SDK's get_tokenizer() loads `tokenizer_id` with AutoTokenizer; point it at the
        # engine's local tokenizer files so it works offline for any model the engine has.
        tokenizer_dir = await asyncio.to_thread(_local_tokenizer_dir, model.client)
        if tokenizer_dir is not None:
            payload.setdefault("model_data", {})["tokenizer_id"] = tokenizer_dir
        return web.json_response(payload)

    async def forward_backward(self, request: web.Request) -> web.Response:
        body = await request.read()  # decoded from its Content-Encoding (zstd, gzip) by aiohttp
        if len(body) < INLINE_DECODE_BYTES:
            call = wire.decode_forward_backward(body)
        else:  # a big batch: decode off the loop so other requests keep flowing
            call = await asyncio.to_thread(wire.decode_forward_backward, body)
        if not call.data:
            raise UserError("forward_backward needs at least one datum")
        model = self.registry.model(call.model_id)
        method = "forward" if call.forward_only else "forward_backward"

        def run(m: TrainingModel) -> Any:
            fn = getattr(m.require_client(), method)
            return fn(call.data, call.loss_fn, call.loss_fn_config)

        def encode(out: types.ForwardBackwardOutput) -> tuple[str, Any]:
            return "proto", wire.encode_forward_backward_output(out)

        kind = "Forward" if call.forward_only else "ForwardBackward"
        promise = self.registry.submit(model, call.seq_id or None, kind, run, encode, quick=True)
        return _future(promise.request_id, model_id=model.model_id)

    async def optim_step(self, request: web.Request) -> web.Response:
        req = types.OptimStepRequest.model_validate(await _json_body(request))
        if not isinstance(req.optim_params, types.AdamParams):
            raise UserError(f"{type(req.optim_params).__name__} is not supported by tinkrl's engine (AdamParams only)")
        model = self.registry.model(req.model_id)
        return self._submit_json(model, req.seq_id, "OptimStep", lambda c: c.optim_step(req.optim_params))

    async def save_weights(self, request: web.Request) -> web.Response:
        req = types.SaveWeightsRequest.model_validate(await _json_body(request))
        if not req.path:
            raise UserError("save_weights needs a checkpoint name in `path`")
        model = self.registry.model(req.model_id)
        return self._submit_json(model, req.seq_id, "SaveWeights", lambda c: c.save_state(req.path))

    async def save_weights_for_sampler(self, request: web.Request) -> web.Response:
        req = types.SaveWeightsForSamplerRequest.model_validate(await _json_body(request))
        model = self.registry.model(req.model_id)
        if req.path:
            return self._submit_json(
                model, req.seq_id, "SaveWeightsForSampler", lambda c: c.save_weights_for_sampler(req.path)
            )
        if req.sampling_session_seq_id is None:
            raise UserError("save_weights_for_sampler needs `path` or `sampling_session_seq_id`")
        # Ephemeral weights for a new sampling session. `inflight` gets snapshot
        # semantics, which meets its contract (weights as of the save, or newer).
        self.registry.live_session(model.session_id)
        sampler_id = f"{model.session_id}:sample:{req.sampling_session_seq_id}"

        def run(m: TrainingModel) -> Any:
            return m.require_client().save_weights_and_get_sampling_client()

        def register(client: Any) -> tuple[str, Any]:  # runs on the loop, before the promise resolves
            self.registry.register_sampler(sampler_id, client, model.base_model, None)
            return "json", {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}

        # Not quick: the engine snapshots the weights before returning the client.
        promise = self.registry.submit(model, req.seq_id, "SaveWeightsForSampler", run, register)
        return _future(promise.request_id, model_id=model.model_id)

    async def load_weights(self, request: web.Request) -> web.Response:
        req = types.LoadWeightsRequest.model_validate(await _json_body(request))
        if not req.path.startswith("tinker://") and not req.path.startswith("/"):
            raise UserError(f"load_weights path must be a tinker:// path, got {req.path!r}")
        if req.optimizer_config is not None and getattr(req.optimizer_config, "type", "adamw") != "adamw":
            raise UserError("only the adamw optimizer is supported by tinkrl's engine")
        load = (
            self.engine.create_training_client_from_state_with_optimizer
            if req.optimizer
            else self.engine.create_training_client_from_state
        )

        def swap(m: TrainingModel) -> Any:
            # Blocks the model's submitter: later requests must reach the loaded client.
            m.client = settle_blocking(load(req.path))
            return m.client

        def encode(_client: Any) -> tuple[str, Any]:
            return "json", {"path": req.path, "model_id": model.model_id, "type": "load_weights"}

        if req.session_id is not None:
            # 0.38's create-from-state: the load is the model's first request.
            if req.model_seq_id is None:
                raise UserError("load_weights with session_id needs model_seq_id")
            model = self.registry.new_model(req.session_id, req.model_seq_id, req.base_model, None)
            promise = self.registry.run_first(model, "LoadWeights", swap, encode)
        else:
            if req.model_id is None:
                raise UserError("load_weights needs model_id (or session_id + model_seq_id)")
            model = self.registry.model(req.model_id)
            promise = self.registry.submit(model, req.seq_id, "LoadWeights", swap, encode)
        return _future(promise.request_id, model_id=model.model_id)

    def _submit_json(
        self, model: TrainingModel, seq_id: int | None, kind: str, call: Callable[[Any], Any]
    ) -> web.Response:
        def run(m: TrainingModel) -> Any:
            return call(m.require_client())

        promise = self.registry.submit(
            model, seq_id, kind, run, lambda result: ("json", wire.to_json(result)), quick=True
        )
        return _future(promise.request_id, model_id=model.model_id)

    # ------------------------------------------------------------------ sampling endpoints
    async def create_sampling_session(self, request: web.Request) -> web.Response:
        req = types.CreateSamplingSessionRequest.model_validate(await _json_body(request))
        sampler = await self.registry.sampling_session(
            req.session_id, req.sampling_session_seq_id, req.base_model, req.model_path
        )
        return web.json_response({"sampling_session_id": sampler.sampler_id, "type": "create_sampling_session"})

    async def get_sampler(self, request: web.Request) -> web.Response:
        sampler = self.registry.sampler(request.match_info["sampler_id"])
        return web.json_response(
            {"sampler_id": sampler.sampler_id, "base_model": sampler.base_model, "model_path": sampler.model_path}
        )

    async def asample(self, request: web.Request) -> web.Response:
        req = types.SampleRequest.model_validate(await _json_body(request))
        if req.sampling_session_id is None:
            raise UserError("asample needs a sampling_session_id (create_sampling_session first)")
        sampler = self.registry.sampler(req.sampling_session_id)
        unsupported = {
            "target_prompt_logprobs": req.target_prompt_logprobs is not None,
            "prompt_alt_tokens_k": req.prompt_alt_tokens_k > 0,
            "record_stability_info": bool(req.record_stability_info),
        }
        kwargs: dict[str, Any] = {"include_prompt_logprobs": bool(req.prompt_logprobs)}
        if req.topk_prompt_logprobs:
            kwargs["topk_prompt_logprobs"] = req.topk_prompt_logprobs
        if req.topk_sample_logprobs:
            kwargs["topk_sample_logprobs"] = req.topk_sample_logprobs
        accepted = named_kwargs(sampler.client.sample)
        for name in list(kwargs):
            if name not in accepted:
                unsupported[name] = bool(kwargs.pop(name))
        asked = [name for name, used in unsupported.items() if used]
        if asked:
            raise UserError(f"sample options not supported by tinkrl's engine: {', '.join(asked)}")
        if req.num_samples < 1:
            raise UserError("num_samples must be at least 1")

        def call() -> Any:
            return sampler.client.sample(req.prompt, req.num_samples, req.sampling_params, **kwargs)

        promise = self.registry.start_sample(call, req.prompt_logprobs_last_n)
        sequence_ids = [f"{promise.request_id}:{i}" for i in range(req.num_samples)]
        return web.json_response({"request_id": promise.request_id, "sample_sequence_ids": sequence_ids})

    # ------------------------------------------------------------------ futures
    async def retrieve_future(self, request: web.Request) -> web.Response:
        req = types.FutureRetrieveRequest.model_validate(await _json_body(request))
        promise = self.promises.get(req.request_id)
        if promise is None:
            # 410 makes the SDK re-send the original request (a sample resubmits itself).
            return _detail(410, f"request {req.request_id} is unknown or expired on this server")
        if not await self.promises.wait(promise, self.long_poll_s):
            return web.json_response(
                {"type": "try_again", "request_id": promise.request_id, "queue_state": "active"}, status=408
            )
        if promise.payload_kind == "proto":
            return web.Response(body=promise.payload, content_type=PROTO)  # type: ignore[arg-type]
        return web.json_response(promise.payload)

    async def cancel_future(self, request: web.Request) -> web.Response:
        await _json_body(request)
        return web.json_response({})  # samples already merged into a batch run to the end


def _local_tokenizer_dir(client: Any) -> str | None:
    getter = getattr(client, "get_tokenizer", None)
    if not callable(getter):
        return None
    path = getattr(getter(), "name_or_path", None)
    return str(path) if path and os.path.isdir(path) and ":" not in str(path) else None


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw:
        return {}
    body = json.loads(raw)
    if not isinstance(body, dict):
        raise UserError(f"{request.path}: expected a JSON object body")
    return body


def _detail(status: int, message: str) -> web.Response:
    return web.json_response({"detail": message}, status=status)


def _future(request_id: str, model_id: str | None = None) -> web.Response:
    body: dict[str, Any] = {"request_id": request_id}
    if model_id is not None:
        body["model_id"] = model_id
    return web.json_response(body)


# Each POST route's body, as the pinned SDK's request types define it (a route not listed: any JSON object).
_BODIES: dict[str, Any] = {
    "/api/v1/client/config": types.ClientConfigRequest,
    "/api/v1/create_session": types.CreateSessionRequest,
    "/api/v1/session_heartbeat": types.SessionHeartbeatRequest,
    "/api/v1/telemetry": types.TelemetrySendRequest,
    "/api/v1/create_model": types.CreateModelRequest,
    "/api/v1/get_info": types.GetInfoRequest,
    "/api/v1/optim_step": types.OptimStepRequest,
    "/api/v1/save_weights": types.SaveWeightsRequest,
    "/api/v1/save_weights_for_sampler": types.SaveWeightsForSamplerRequest,
    "/api/v1/load_weights": types.LoadWeightsRequest,
    "/api/v1/create_sampling_session": types.CreateSamplingSessionRequest,
    "/api/v1/asample": types.SampleRequest,
    "/api/v1/retrieve_future": types.FutureRetrieveRequest,
}


def describe_routes(post: list[str], get: list[str]) -> dict:
    """The OpenAPI description of the routes served: JSON bodies by the SDK's types, `forward_backward` as the
    protobuf the SDK sends, and the refusals each answers (400 bad input, 401 key, 404 unknown id, 410
    finished session or unknown request id)."""
    from tinkrl.openapi import Route, document

    refusals = (400, 401, 404, 410)
    routes = [Route("GET", path, f"GET {path}", refusals=refusals) for path in get]
    for path in post:
        if path == "/api/v1/forward_backward":
            routes.append(Route("POST", path, "forward_backward", body=bytes, media_type=PROTO, refusals=refusals))
        else:
            routes.append(Route("POST", path, path.rsplit("/", 1)[-1], body=_BODIES.get(path, dict), refusals=refusals))
    return document("tinkrl serve tinker (the Tinker protocol)", SDK_VERSION, routes)


@contextmanager
def serve_in_thread(
    engine: Any = None,
    *,
    server: TinkerServer | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
) -> Iterator[str]:
    """Run the server (or `server`, prepared by the caller) on a background thread; yields its URL."""
    if server is None:
        server = TinkerServer(engine, api_key=api_key)
    with serve_app_in_thread(server.app, host, port, name="tinker-server") as url:
        yield url


def newest_run_meta(run_id: str) -> tuple[dict, float] | None:
    """The metadata of the newest complete checkpoint training run `run_id` saved on this machine (base
    model, LoRA settings, user_metadata) and when it was written; None when it saved none."""
    if not run_id or "/" in run_id or "\0" in run_id or run_id.startswith("."):
        return None
    try:
        metas = sorted((m.stat().st_mtime, m) for m in checkpoint_dir(SCHEME + run_id).glob(f"*/*/{META}"))
    except OSError:  # a name longer than the filesystem takes: no such run
        return None
    if not metas:
        return None
    saved, newest = metas[-1]
    return json.loads(newest.read_text()), saved
