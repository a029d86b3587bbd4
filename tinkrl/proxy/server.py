"""The OpenAI-compatible HTTP server over a SamplingClient, with token capture and weight swaps.

Routes (also under `/rollouts/<rollout_id>/v1/...`, a base URL that tags every call with
that rollout id, for agents that cannot set headers):

    POST /v1/chat/completions   messages, tools, n, temperature, top_p, max_(completion_)tokens,
                                stop, seed, logprobs/top_logprobs, stream (SSE)
    POST /v1/completions        prompt (text or token ids), same sampling options
    GET  /v1/models[/<id>]      the served model
    GET  /health                liveness, the current policy version, requests in flight
    GET|DELETE /v1/rollouts/<id>  captured calls of a rollout (DELETE also forgets them)
    POST /v1/admin/weights      {"model_path": ...}: sample from new weights from now on
    POST /rollouts/<id>/sandbox/exec  {"command", "timeout", "workdir"}: run a shell command in the
                                rollout's sandbox (registered by the runner while the rollout runs)

Keys: with `api_key` every route but `/health` needs it (`Authorization: Bearer KEY`); with
`admin_key` too, the routes that change or read what the server holds for others (the weight swap,
the captured calls of a rollout) need that one instead, so an agent that holds the sampling key
can neither swap the weights nor read other rollouts. Keys are compared in constant time.

The sandbox route lets an agent process act on its rollout's tinkrl sandbox (bwrap, no network)
instead of the host: the runner registers the sandbox under the rollout id (`sandboxes`) for
as long as the agent runs; any other id is a 404.

A rollout id comes from the URL, the `X-Rollout-Id` header, or `metadata.rollout_id`.

Why aiohttp: the same stack as `tinkrl serve tinker` (one HTTP dependency), an asyncio
server where hundreds of waiting requests cost nothing, and SSE is a plain StreamResponse.
Every request awaits `SamplingClient.sample_async`; the engine merges concurrent requests
into one batch, so the server does no batching of its own. The engine samples a whole
completion before returning it, so a stream sends SSE keep-alive comments while it waits,
then the completion as chunks.

Weight swap: `set_sampling_client` replaces the policy atomically; requests already
running finish on the weights they started with, and every captured call records the
policy version it was sampled from.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import tinker
from aiohttp import web

from tinkrl.access import key_matches, request_key
from tinkrl.aio_thread import UNREADABLE_BODY, serve_app_in_thread
from tinkrl.errors import InfraFailure
from tinkrl.proxy.capture import AssistantTokens, CapturedCall, CapturedSample, CaptureStore
from tinkrl.proxy.openai_api import (
    ApiError,
    ChatChoice,
    SampleSettings,
    bad,
    build_chat_prompt,
    forced_prefix,
    parse_chat_request,
    parse_completion_request,
    sample_to_message,
    token_logprobs,
    truncate_at_stop,
    validate_messages,
    validate_tools,
)
from tinkrl.renderers import Renderer, get_renderer

log = logging.getLogger("tinkrl.proxy")

KEEPALIVE_S = 10.0
DEFAULT_CONTEXT = 32768
# Without max_tokens a completion may use the rest of the context, but no more than this.
DEFAULT_MAX_TOKENS = 4096


@dataclass
class Policy:
    """The sampling client being served, its version (bumped on every weight swap) and its label."""

    client: Any  # a SamplingClient (local engine or the tinker SDK)
    version: int
    label: str  # base model name or checkpoint path


def context_length_of(client: Any, tokenizer: Any) -> int:
    """The context length: the engine's, else a plausible tokenizer `model_max_length`, else DEFAULT_CONTEXT."""
    engine = getattr(client, "engine", None)
    if engine is not None and getattr(engine, "max_context", None):
        return int(engine.max_context)
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if isinstance(limit, int) and 0 < limit < 10_000_000 else DEFAULT_CONTEXT


class ProxyServer:
    """Serves one policy over the OpenAI API; `capture` holds what it sampled per rollout."""

    def __init__(
        self,
        sampling_client: Any,
        *,
        model_name: str,
        served_model_name: str | None = None,
        api_key: str | None = None,
        admin_key: str | None = None,
        max_context: int | None = None,
        tool_format: str = "hermes",
        service_client: Any = None,
        label: str | None = None,
    ):
        self.model_name = model_name
        self.served_model_name = served_model_name or model_name
        self.api_key = api_key
        self.admin_key = admin_key
        self.service_client = service_client
        self.tokenizer = sampling_client.get_tokenizer()
        self.renderer: Renderer = get_renderer(self.tokenizer, model_name, tool_format)
        self.max_context = max_context or context_length_of(sampling_client, self.tokenizer)
        self.capture = CaptureStore()
        self.sandboxes: dict[str, Any] = {}  # rollout id -> the Sandbox its agent acts on (see sandbox_exec)
        self.sandbox_failures: dict[str, InfraFailure] = {}  # rollout id -> its sandbox's first failure
        self._policy = Policy(sampling_client, 0, label or model_name)
        self._description: dict | None = None  # the OpenAPI description, built on its first request
        self._swap_lock = threading.Lock()
        self.started = int(time.time())
        self.in_flight = 0  # requests being handled (also those whose client went away), not counting /health
        self.app = self._make_app()

    # -- policy ---------------------------------------------------------------------------------
    @property
    def policy(self) -> Policy:
        return self._policy

    def set_sampling_client(self, client: Any, label: str | None = None) -> int:
        """Sample from `client` from now on; returns the new policy version."""
        with self._swap_lock:
            self._policy = Policy(client, self._policy.version + 1, label or self._policy.label)
            return self._policy.version

    async def load_weights(self, model_path: str) -> int:
        if self.service_client is None:
            raise ApiError(
                400, "this server was started without a service client; it cannot load weights", param="model_path"
            )
        client = await asyncio.to_thread(self.service_client.create_sampling_client, model_path=model_path)
        return self.set_sampling_client(client, model_path)

    # -- app ------------------------------------------------------------------------------------
    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._errors])
        for prefix in ("", "/rollouts/{rollout_id}"):
            app.router.add_post(prefix + "/v1/chat/completions", self.chat_completions)
            app.router.add_post(prefix + "/v1/completions", self.completions)
            app.router.add_get(prefix + "/v1/models", self.models)
            app.router.add_get(prefix + "/v1/models/{model:.+}", self.model)
        app.router.add_get("/health", self.health)
        app.router.add_post("/rollouts/{rollout_id}/sandbox/exec", self.sandbox_exec)
        app.router.add_get("/v1/rollouts/{rollout_id}", self.rollout_calls)
        app.router.add_delete("/v1/rollouts/{rollout_id}", self.rollout_calls)
        app.router.add_post("/v1/admin/weights", self.swap_weights)
        app.router.add_get("/v1/admin/weights", self.weights_info)
        app.router.add_get("/openapi.json", self.openapi)
        return app

    async def openapi(self, request: web.Request) -> web.Response:
        """This server's OpenAPI description (`describe_routes`)."""
        if self._description is None:
            self._description = describe_routes()
        return web.json_response(self._description)

    @web.middleware
    async def _errors(self, request: web.Request, handler) -> web.StreamResponse:
        counted = request.path != "/health"
        self.in_flight += counted
        try:
            if counted:
                self._check_key(request)
            return await handler(request)
        except ApiError as e:
            return web.json_response(e.body(), status=e.status)
        except web.HTTPNotFound:
            return web.json_response(
                ApiError(
                    404,
                    f"unknown path {request.path}; this server serves "
                    "/v1/chat/completions, /v1/completions, /v1/models, /health",
                    code="not_found",
                ).body(),
                status=404,
            )
        except web.HTTPMethodNotAllowed as e:
            return web.json_response(
                ApiError(
                    405,
                    f"{request.method} is not allowed on {request.path} "
                    f"(allowed: {', '.join(sorted(e.allowed_methods))})",
                    type_="invalid_request_error",
                ).body(),
                status=405,
            )
        except asyncio.CancelledError:
            raise
        except ConnectionResetError:  # the client went away (a stream cancels its sampling): no one to answer
            return web.Response(status=499)
        except Exception as e:  # an engine failure: the client gets a 500 with the reason
            log.exception("request %s failed", request.path)
            return web.json_response(ApiError(500, f"the sampler failed: {type(e).__name__}: {e}").body(), status=500)
        finally:
            self.in_flight -= counted

    def _check_key(self, request: web.Request) -> None:
        admin = self.admin_key is not None and _is_admin_route(request)
        expected = self.admin_key if admin else self.api_key
        if expected is None:
            return
        given = request_key(request.headers)
        if not key_matches(given, expected):
            which = "admin key (--admin-key)" if admin else "API key"
            hint = f"no {which} was sent" if not given else f"the {which} is not the one this server accepts"
            raise ApiError(401, f"Incorrect API key provided: {hint}", code="invalid_api_key")

    async def _json(self, request: web.Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad(f"the request body is not valid JSON: {e}") from None
        except UNREADABLE_BODY as e:
            raise bad(f"the request body cannot be read: {' '.join(str(e).split())}") from None
        if not isinstance(body, dict):
            raise bad("the request body must be a JSON object")
        return body

    def _check_model(self, body: dict) -> None:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise bad("'model' is required", "model")
        if model not in self._model_ids():
            raise ApiError(
                404,
                f"The model '{model}' does not exist; this server serves "
                f"{', '.join(repr(m) for m in self._model_ids())}",
                param="model",
                code="model_not_found",
            )

    def _model_ids(self) -> list[str]:
        return list(dict.fromkeys([self.served_model_name, self.model_name]))

    @staticmethod
    def _rollout_id(request: web.Request, settings: SampleSettings) -> str | None:
        return request.match_info.get("rollout_id") or request.headers.get("X-Rollout-Id") or settings.rollout_id

    def _budget(self, prompt_len: int, requested: int | None, param: str) -> int:
        room = self.max_context - prompt_len
        if room <= 0 or (requested is not None and requested > room):
            asked = requested if requested is not None else 1
            raise bad(
                f"This model's maximum context length is {self.max_context} tokens. However, you requested "
                f"{prompt_len + asked} tokens ({prompt_len} in the messages, {asked} in the completion). "
                "Please reduce the length of the messages or completion.",
                param,
                "context_length_exceeded",
            )
        return requested if requested is not None else min(room, DEFAULT_MAX_TOKENS)

    async def _sample(
        self, policy: Policy, prompt: list[int], s: SampleSettings, max_tokens: int, stop: list[str] | list[int] | None
    ) -> tinker.types.SampleResponse:
        params = tinker.types.SamplingParams(
            max_tokens=max_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=s.seed, stop=stop
        )
        return await policy.client.sample(
            prompt=tinker.ModelInput.from_ints(prompt), num_samples=s.n, sampling_params=params
        )

    async def _top_logprobs(
        self, policy: Policy, prompt: list[int], sequences: list[list[int]], k: int
    ) -> list[list[list[tuple[int, float]] | None]]:
        """Top-k alternatives at each sampled position: one prefill of prompt + sample per choice."""
        if k <= 0:
            return [None] * len(sequences)  # type: ignore[list-item]

        async def one(seq: list[int]):
            if not seq:
                return []
            resp = await policy.client.sample(
                prompt=tinker.ModelInput.from_ints(prompt + seq),
                num_samples=1,
                sampling_params=tinker.types.SamplingParams(max_tokens=1, temperature=0.0),
                include_prompt_logprobs=True,
                topk_prompt_logprobs=k,
            )
            top = resp.topk_prompt_logprobs or []
            return [top[len(prompt) + i] if len(prompt) + i < len(top) else None for i in range(len(seq))]

        return list(await asyncio.gather(*(one(s) for s in sequences)))

    def _stop_for(self, s: SampleSettings) -> list[str] | list[int]:
        if not s.stop:
            return self.renderer.stop_sequences()
        # The sampler takes ids or strings, not both: the end-of-turn tokens as text join the user's.
        return [*self.renderer.stop_strings(), *s.stop]

    # -- chat -----------------------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        self._check_model(body)
        s = parse_chat_request(body)
        messages = validate_messages(body.get("messages"))
        tools, tool_choice = validate_tools(body)
        rollout_id = self._rollout_id(request, s)
        forced_text = forced_prefix(self.renderer, tool_choice) if tools else ""
        prompt = build_chat_prompt(
            self.renderer, messages, tools, lambda m: self.capture.lookup(rollout_id, m), forced_text
        )
        max_tokens = self._budget(
            len(prompt.tokens),
            s.max_tokens,
            "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens",
        )
        policy = self._policy
        created, call_id = int(time.time()), "chatcmpl-" + uuid.uuid4().hex
        parse_tools = bool(tools) and tool_choice != "none"

        async def run() -> tuple[list[ChatChoice], list[Any], list[Any]]:
            resp = await self._sample(policy, prompt.tokens, s, max_tokens, self._stop_for(s))
            seqs = list(resp.sequences)
            choices = [
                sample_to_message(self.renderer, forced_text, list(q.tokens), q.stop_reason, s.stop, parse_tools, tools)
                for q in seqs
            ]
            tops = await self._top_logprobs(policy, prompt.tokens, [list(q.tokens) for q in seqs], s.top_logprobs)
            self.capture.record(
                rollout_id,
                CapturedCall(
                    call_id,
                    "chat",
                    prompt.tokens,
                    [
                        CapturedSample(list(q.tokens), [float(x) for x in q.logprobs], q.stop_reason, c.finish_reason)
                        for q, c in zip(seqs, choices)
                    ],
                    policy.version,
                    assistant_messages=prompt.assistant_messages,
                    spliced_messages=prompt.spliced_messages,
                ),
                [
                    (
                        c.message,
                        AssistantTokens(prompt.forced + list(q.tokens), self.renderer.ends_turn(list(q.tokens))),
                    )
                    for q, c in zip(seqs, choices)
                ],
            )
            return choices, seqs, tops

        def logprobs_of(c: ChatChoice, q: Any, top: Any) -> dict | None:
            if not s.logprobs:
                return None
            return {
                "content": token_logprobs(self.tokenizer, c.text_tokens, list(q.logprobs)[: len(c.text_tokens)], top),
                "refusal": None,
            }

        def usage(seqs: list[Any]) -> dict[str, int]:
            completion = sum(len(q.tokens) for q in seqs)
            return {
                "prompt_tokens": len(prompt.tokens),
                "completion_tokens": completion,
                "total_tokens": len(prompt.tokens) + completion,
            }

        base = {"id": call_id, "created": created, "model": body["model"], "system_fingerprint": f"v{policy.version}"}
        if not s.stream:
            choices, seqs, tops = await run()
            return web.json_response(
                {
                    **base,
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": i,
                            "message": c.message,
                            "finish_reason": c.finish_reason,
                            "logprobs": logprobs_of(c, q, top),
                        }
                        for i, (c, q, top) in enumerate(zip(choices, seqs, tops))
                    ],
                    "usage": usage(seqs),
                }
            )

        async def chunks(result) -> AsyncIterator[dict]:
            choices, seqs, tops = result
            chunk = {**base, "object": "chat.completion.chunk"}
            for i, (c, q, top) in enumerate(zip(choices, seqs, tops)):
                yield {
                    **chunk,
                    "choices": [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "finish_reason": None,
                            "logprobs": None,
                        }
                    ],
                }
                delta: dict[str, Any] = {}
                if c.message.get("reasoning_content"):
                    delta["reasoning_content"] = c.message["reasoning_content"]
                if c.message.get("content"):
                    delta["content"] = c.message["content"]
                if c.message.get("tool_calls"):
                    delta["tool_calls"] = [{"index": j, **call} for j, call in enumerate(c.message["tool_calls"])]
                if delta:
                    yield {
                        **chunk,
                        "choices": [
                            {"index": i, "delta": delta, "finish_reason": None, "logprobs": logprobs_of(c, q, top)}
                        ],
                    }
                yield {
                    **chunk,
                    "choices": [{"index": i, "delta": {}, "finish_reason": c.finish_reason, "logprobs": None}],
                }
            if s.include_usage:
                yield {**chunk, "choices": [], "usage": usage(seqs)}

        return await self._stream(request, run(), chunks)

    async def _stream(self, request: web.Request, work, chunks) -> web.StreamResponse:
        """SSE: headers at once, keep-alive comments while the engine samples, then the chunks."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=KEEPALIVE_S)
                if done:
                    break
                await response.write(b": keep-alive\n\n")
            result = task.result()
        except ApiError as e:
            await response.write(f"data: {json.dumps(e.body())}\n\n".encode())
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            task.cancel()
            raise
        except Exception as e:
            log.exception("streamed request failed")
            err = ApiError(500, f"the sampler failed: {type(e).__name__}: {e}")
            await response.write(f"data: {json.dumps(err.body())}\n\n".encode())
            return response
        async for chunk in chunks(result):
            await response.write(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    # -- legacy completions ---------------------------------------------------------------------
    def _completion_prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise bad("'prompt' must be a string, a list of strings, or token ids", "prompt")
        out = []
        for p in prompt:
            if isinstance(p, str):
                out.append(self.tokenizer.encode(p, add_special_tokens=False))
            elif isinstance(p, list) and all(isinstance(t, int) and 0 <= t < len(self.tokenizer) for t in p):
                out.append(list(p))
            else:
                raise bad("'prompt' must be a string, a list of strings, or token ids in the vocabulary", "prompt")
            if not out[-1]:
                raise bad("'prompt' must not be empty", "prompt")
        return out

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        self._check_model(body)
        s = parse_completion_request(body)
        prompts = self._completion_prompts(body.get("prompt"))
        budgets = [self._budget(len(p), s.max_tokens, "max_tokens") for p in prompts]
        rollout_id = self._rollout_id(request, s)
        policy = self._policy
        created, call_id = int(time.time()), "cmpl-" + uuid.uuid4().hex
        stop = s.stop or None  # plain text completion: the model's own end-of-sequence token

        async def one(prompt: list[int], budget: int):
            resp = await self._sample(policy, prompt, s, budget, stop)
            seqs = list(resp.sequences)
            tops = await self._top_logprobs(policy, prompt, [list(q.tokens) for q in seqs], s.top_logprobs)
            out = []
            for q, top in zip(seqs, tops):
                text, hit = truncate_at_stop(self.tokenizer.decode(list(q.tokens), skip_special_tokens=True), s.stop)
                finish = "length" if q.stop_reason == "length" and not hit else "stop"
                out.append((q, text, finish, top))
            self.capture.record(
                rollout_id,
                CapturedCall(
                    call_id,
                    "completions",
                    prompt,
                    [
                        CapturedSample(list(q.tokens), [float(x) for x in q.logprobs], q.stop_reason, f)
                        for q, _, f, _ in out
                    ],
                    policy.version,
                ),
                [],
            )
            return out

        async def run():
            return await asyncio.gather(*(one(p, b) for p, b in zip(prompts, budgets)))

        def legacy_logprobs(q: Any, top: Any) -> dict | None:
            if not s.logprobs:
                return None
            toks = [self.tokenizer.decode([t], skip_special_tokens=False) for t in q.tokens]
            offsets, pos = [], 0
            for t in toks:
                offsets.append(pos)
                pos += len(t)
            tops = None
            if top is not None:
                tops = [
                    {self.tokenizer.decode([a], skip_special_tokens=False): float(lp) for a, lp in (alt or [])}
                    for alt in top
                ]
            return {
                "tokens": toks,
                "token_logprobs": [float(x) for x in q.logprobs],
                "top_logprobs": tops,
                "text_offset": offsets,
            }

        def choices_of(results) -> list[dict]:
            out, idx = [], 0
            for per_prompt in results:
                for q, text, finish, top in per_prompt:
                    out.append(
                        {"index": idx, "text": text, "finish_reason": finish, "logprobs": legacy_logprobs(q, top)}
                    )
                    idx += 1
            return out

        def usage(results) -> dict[str, int]:
            p = sum(len(x) for x in prompts)
            c = sum(len(q.tokens) for per in results for q, *_ in per)
            return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

        base = {"id": call_id, "object": "text_completion", "created": created, "model": body["model"]}
        if not s.stream:
            results = await run()
            return web.json_response({**base, "choices": choices_of(results), "usage": usage(results)})

        async def chunks(results):
            for c in choices_of(results):
                yield {**base, "choices": [c]}
            if s.include_usage:
                yield {**base, "choices": [], "usage": usage(results)}

        return await self._stream(request, run(), chunks)

    # -- models, health, capture, weights --------------------------------------------------------
    def _model_obj(self, name: str) -> dict:
        return {
            "id": name,
            "object": "model",
            "created": self.started,
            "owned_by": "tinkrl",
            "max_model_len": self.max_context,
        }

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_obj(m) for m in self._model_ids()]})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name not in self._model_ids():
            raise ApiError(404, f"The model '{name}' does not exist", param="model", code="model_not_found")
        return web.json_response(self._model_obj(name))

    async def health(self, request: web.Request) -> web.Response:
        p = self._policy
        return web.json_response(
            {
                "status": "ok",
                "model": self.served_model_name,
                "policy_version": p.version,
                "weights": p.label,
                "in_flight": self.in_flight,
            }
        )

    async def rollout_calls(self, request: web.Request) -> web.Response:
        """A rollout's captured calls; a DELETE also forgets them."""
        from tinkrl.proxy.capture import chain_calls

        rid = request.match_info["rollout_id"]
        calls = self.capture.pop(rid) if request.method == "DELETE" else self.capture.calls(rid)
        return web.json_response(self._rollout_json(rid, calls, chain_calls(calls)[1]))

    async def sandbox_exec(self, request: web.Request) -> web.Response:
        """Run `command` in the rollout's sandbox: {"exit_code", "output", "timed_out", "truncated"}."""
        rid = request.match_info["rollout_id"]
        sandbox = self.sandboxes.get(rid)
        if sandbox is None:
            raise ApiError(404, f"rollout {rid!r} has no sandbox (it is not running)", code="not_found")
        body = await self._json(request)
        command, timeout, workdir = body.get("command"), body.get("timeout", 60), body.get("workdir")
        if not isinstance(command, str):
            raise bad("'command' (a shell command string) is required", "command")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout <= 3600:
            raise bad("'timeout' must be a number of seconds in (0, 3600]", "timeout")
        if workdir is not None and not (isinstance(workdir, str) and workdir.startswith("/")):
            raise bad("'workdir' must be an absolute path", "workdir")
        try:
            result = await asyncio.to_thread(sandbox.exec, command, float(timeout), None, workdir or None)
        except InfraFailure as e:  # the sandbox died: the runner records the rollout as an infra failure
            if self.sandboxes.get(rid) is sandbox:  # not a late call of a rollout that has ended
                self.sandbox_failures.setdefault(rid, e)
            raise ApiError(503, f"the rollout's sandbox failed: {e}", code="sandbox_failed") from None
        return web.json_response(
            {
                "exit_code": result.exit_code,
                "output": result.output,
                "timed_out": result.timed_out,
                "truncated": result.truncated,
            }
        )

    @staticmethod
    def _rollout_json(rid: str, calls: list[CapturedCall], stats) -> dict:
        return {
            "rollout_id": rid,
            "calls": [c.to_json() for c in calls],
            "merge": {
                "calls": stats.calls,
                "merged_calls": stats.merged_calls,
                "datums": stats.chains,
                "merge_rate": stats.merge_rate,
                "splice_rate": stats.splice_rate,
            },
        }

    async def swap_weights(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise bad("'model_path' (a tinker:// path or checkpoint directory) is required", "model_path")
        try:
            version = await self.load_weights(path)
        except ApiError:
            raise
        except Exception as e:
            raise bad(f"cannot load weights from {path!r}: {e}", "model_path") from None
        return web.json_response({"policy_version": version, "weights": path})

    async def weights_info(self, request: web.Request) -> web.Response:
        p = self._policy
        return web.json_response({"policy_version": p.version, "weights": p.label})


def describe_routes() -> dict:
    """The OpenAPI description of the routes served: the OpenAI API's chat and text completions with the
    `openai` package's own request parameters (also under `/rollouts/{rollout_id}`, where each call is
    recorded for that rollout), the models, a rollout's sandbox and captured calls, and the weight swap."""
    from openai.types import completion_create_params
    from openai.types.chat import completion_create_params as chat_params

    from tinkrl.openapi import Route, document

    exec_body = {
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}, "workdir": {"type": "string"}},
        "required": ["command"],
    }
    weights_body = {"type": "object", "properties": {"model_path": {"type": "string"}}, "required": ["model_path"]}
    routes = [Route("GET", "/health", "liveness and the policy served", refusals=())]
    for prefix in ("", "/rollouts/{rollout_id}"):
        routes += [
            Route("POST", prefix + "/v1/chat/completions", "chat completion", chat_params.CompletionCreateParams, refusals=(400, 401, 404)),
            Route("POST", prefix + "/v1/completions", "text completion", completion_create_params.CompletionCreateParams, refusals=(400, 401, 404)),
            Route("GET", prefix + "/v1/models", "the model served", refusals=(401,)),
            Route("GET", prefix + "/v1/models/{model}", "one model", refusals=(401, 404)),
        ]  # fmt: skip
    routes += [
        Route("POST", "/rollouts/{rollout_id}/sandbox/exec", "run a command in the rollout's sandbox", exec_body, refusals=(400, 401, 404)),
        Route("GET", "/v1/rollouts/{rollout_id}", "a rollout's captured calls", refusals=(401, 403, 404)),
        Route("DELETE", "/v1/rollouts/{rollout_id}", "a rollout's captured calls, dropped", refusals=(401, 403, 404)),
        Route("POST", "/v1/admin/weights", "serve other weights", weights_body, refusals=(400, 401, 403, 404)),
        Route("GET", "/v1/admin/weights", "the weights served", refusals=(401, 403)),
        Route("GET", "/openapi.json", "this description", refusals=(401,)),
    ]  # fmt: skip
    return document("tinkrl serve openai (the OpenAI API, per-rollout capture)", "1", routes)


def _is_admin_route(request: web.Request) -> bool:
    """The weight swap (and what it serves now) and a rollout's captured calls: what `admin_key` guards."""
    return request.path.startswith("/v1/admin/") or request.path.startswith("/v1/rollouts/")


@contextlib.contextmanager
def serve_in_thread(server: ProxyServer, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Run `server` on a background thread (its own event loop); yields the base URL (no /v1)."""
    with serve_app_in_thread(server.app, host, port, name="openai-proxy") as url:
        yield url
