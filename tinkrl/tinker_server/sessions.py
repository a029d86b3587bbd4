"""Sessions, training models and sampling sessions of `tinkrl serve tinker`, over one engine.

Ordering is the protocol's hard part. A TrainingClient numbers its requests (`seq_id`
1, 2, 3, …) and may send them concurrently (forward_backward chunks go out in parallel,
the first one last), yet the model must see them in number order. Each model therefore
keeps a small reorder buffer and one submitter thread: request *n* is handed to the engine
only after *n-1* was, and the engine (which answers with a future at once) keeps them in
flight back to back. A re-sent request (same model, same seq_id, after a lost response)
gets the original request id back instead of running twice, which is what makes the
SDK's transport retries safe for gradient accumulation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tinker import types

from tinkrl.tinker_server import wire
from tinkrl.tinker_server.engine_calls import blocking_pool, settle
from tinkrl.tinker_server.futures import Promise, PromiseTable

log = logging.getLogger("tinkrl.tinker_server")

# How many finished seq_ids a model remembers for duplicate detection.
_SEQ_MEMORY = 256


class UserError(ValueError):
    """The request is wrong (unknown model, unsupported option, bad path): a 4xx."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def error_category(exc: BaseException) -> Literal["user", "server"]:
    """Engine errors caused by the request (bad input, unknown path) are the caller's."""
    from tinkrl.errors import TinkrlError

    if isinstance(exc, (UserError, TinkrlError, ValueError, TypeError, KeyError, FileNotFoundError)):
        return "user"
    return "server"


def describe(exc: BaseException) -> str:
    """An exception as the one-line message a client sees (a UserError's message as is)."""
    text = str(exc).strip() or type(exc).__name__
    return text if isinstance(exc, (UserError,)) else f"{type(exc).__name__}: {text}"


@dataclass
class Session:
    """A client session: its SDK version, tags, liveness, and the models and samplers it created."""

    session_id: str
    sdk_version: str | None
    tags: list[str]
    created: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    finished: str | None = None
    model_ids: set[str] = field(default_factory=set)
    sampler_ids: set[str] = field(default_factory=set)


# An operation runs on the model's submitter thread; it returns an engine future (awaited
# without a thread) or, for ops that swap the client, blocks and returns a plain value.
ModelOp = Callable[["TrainingModel"], Any]
# Turns the settled engine result into (payload kind, payload) for the promise.
Encoder = Callable[[Any], tuple[str, Any]]


@dataclass
class TrainingModel:
    """A training model: its engine client, the next seq_id to submit, the reorder buffer and the submitter thread."""

    model_id: str
    session_id: str
    base_model: str | None
    lora_rank: int | None
    client: Any = None  # the engine's TrainingClient, once created
    next_seq: int = 1
    by_seq: dict[int, Promise] = field(default_factory=dict)
    waiting: dict[int, tuple[ModelOp, Encoder, Promise, bool]] = field(default_factory=dict)
    busy: int = 0  # ops handed to the submitter thread and not yet returned
    submitter: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tinker-model")
    )

    def require_client(self) -> Any:
        if self.client is None:
            raise UserError(f"model {self.model_id} failed to load; create it again", status=404)
        return self.client


@dataclass
class SamplingSession:
    """A sampler: its base model, the weights it samples (`model_path`), and the engine's SamplingClient."""

    sampler_id: str
    base_model: str
    model_path: str | None
    client: Any


def _release(model: TrainingModel) -> None:
    model.busy -= 1


class Registry:
    """All server state; every method runs on the server's event loop."""

    def __init__(self, engine: Any, promises: PromiseTable):
        self.engine = engine
        self.promises = promises
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, TrainingModel] = {}
        self.samplers: dict[str, SamplingSession] = {}
        self._sampler_creations: dict[str, asyncio.Future] = {}
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ sessions
    def create_session(self, sdk_version: str | None, tags: list[str]) -> Session:
        session = Session(f"session-{uuid.uuid4().hex[:16]}", sdk_version, tags)
        self.sessions[session.session_id] = session
        log.info("session %s opened (sdk %s)", session.session_id, sdk_version)
        return session

    def live_session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise UserError(f"unknown session {session_id!r}", status=404)
        if session.finished is not None:
            raise UserError(f"session {session_id} has finished ({session.finished})", status=410)
        session.last_seen = time.monotonic()
        return session

    def finish_session(self, session_id: str, reason: str) -> None:
        session = self.sessions.get(session_id)
        if session is None:
            raise UserError(f"unknown session {session_id!r}", status=404)
        if session.finished is not None:
            return  # first reason wins
        session.finished = reason
        for model_id in session.model_ids:
            model = self.models.pop(model_id, None)
            if model is not None:
                # Queued work still finishes; the thread exits once it has.
                model.submitter.shutdown(wait=False)
        for sampler_id in session.sampler_ids:
            self.samplers.pop(sampler_id, None)
        log.info("session %s finished (%s)", session_id, reason)

    def expire_idle_sessions(self, idle_s: float) -> None:
        now = time.monotonic()
        for session in list(self.sessions.values()):
            if session.finished is None and now - session.last_seen > idle_s:
                self.finish_session(session.session_id, "expired: no heartbeat")

    # ------------------------------------------------------------------ models
    def model(self, model_id: str) -> TrainingModel:
        model = self.models.get(model_id)
        if model is None:
            raise UserError(f"unknown model_id {model_id!r} (finished session, or never created)", status=404)
        session = self.sessions.get(model.session_id)
        if session is not None:
            session.last_seen = time.monotonic()
        return model

    def new_model(self, session_id: str, model_seq_id: int, base_model: str | None, rank: int | None) -> TrainingModel:
        session = self.live_session(session_id)
        model_id = f"{session_id}:train:{model_seq_id}"
        if model_id in self.models:
            return self.models[model_id]
        model = TrainingModel(model_id, session_id, base_model, rank)
        self.models[model_id] = model
        session.model_ids.add(model_id)
        return model

    def run_first(self, model: TrainingModel, kind: str, op: ModelOp, encode: Encoder) -> Promise:
        """The model's creating request (create_model / create-via-load): seq 0, runs before seq 1."""
        if 0 in model.by_seq:
            return model.by_seq[0]
        promise = self.promises.create(kind)
        model.by_seq[0] = promise
        self._dispatch(model, op, encode, promise, quick=False)
        return promise

    def submit(
        self, model: TrainingModel, seq_id: int | None, kind: str, op: ModelOp, encode: Encoder, quick: bool = False
    ) -> Promise:
        """Queue `op` at `seq_id`; it reaches the engine after every lower seq_id did.

        `quick` ops only enqueue work on the engine and return its future at once; they are
        called on the loop itself when nothing is pending on the submitter thread (a thread
        hop less per request). Anything that may block goes through the thread, in order.
        """
        if seq_id is None:
            seq_id = max(model.next_seq, max(model.waiting, default=0) + 1)
        if seq_id in model.by_seq:
            return model.by_seq[seq_id]  # a re-sent request: same promise, no second run
        if seq_id < model.next_seq:
            raise UserError(
                f"{kind}: seq_id {seq_id} of model {model.model_id} is older than the last "
                f"{_SEQ_MEMORY} requests and was already handled",
                status=409,
            )
        promise = self.promises.create(kind)
        model.by_seq[seq_id] = promise
        model.waiting[seq_id] = (op, encode, promise, quick)
        while model.next_seq in model.waiting:
            op_, encode_, promise_, quick_ = model.waiting.pop(model.next_seq)
            self._dispatch(model, op_, encode_, promise_, quick_)
            model.next_seq += 1
        for old in [s for s in model.by_seq if s < model.next_seq - _SEQ_MEMORY]:
            del model.by_seq[old]
        return promise

    def _dispatch(self, model: TrainingModel, op: ModelOp, encode: Encoder, promise: Promise, quick: bool) -> None:
        if quick and model.busy == 0:
            try:
                engine_future: Any = op(model)
            except Exception as exc:
                self._fail(promise, exc)
                return
            self._spawn(self._complete(engine_future, encode, promise))
            return
        try:
            submitted = model.submitter.submit(op, model)
        except RuntimeError:  # submitter shut down: the session finished meanwhile
            promise.fail(f"model {model.model_id} was closed (its session finished)", "user")
            return
        model.busy += 1
        loop = asyncio.get_running_loop()
        submitted.add_done_callback(lambda _f: loop.call_soon_threadsafe(_release, model))
        self._spawn(self._complete(asyncio.wrap_future(submitted), encode, promise, submitted=True))

    async def _complete(self, pending: Any, encode: Encoder, promise: Promise, submitted: bool = False) -> None:
        try:
            engine_future = await pending if submitted else pending
            result = await settle(engine_future)
            kind, payload = encode(result)  # small JSON or a protobuf of bytes fields: cheap
            promise.resolve(kind, payload)  # type: ignore[arg-type]
        except Exception as exc:  # the promise carries the failure to the client
            self._fail(promise, exc)

    @staticmethod
    def _fail(promise: Promise, exc: Exception) -> None:
        category = error_category(exc)
        if category == "server":
            log.error("%s %s failed", promise.kind_of_request, promise.request_id, exc_info=exc)
        promise.fail(describe(exc), category)

    # ------------------------------------------------------------------ sampling
    async def sampling_session(
        self, session_id: str, seq: int, base_model: str | None, model_path: str | None
    ) -> SamplingSession:
        """Create (once per (session, seq)) an engine sampling client."""
        self.live_session(session_id)
        sampler_id = f"{session_id}:sample:{seq}"
        if sampler_id in self.samplers:
            return self.samplers[sampler_id]
        creation = self._sampler_creations.get(sampler_id)
        if creation is None:
            creation = asyncio.ensure_future(self._create_sampler(sampler_id, base_model, model_path))
            self._sampler_creations[sampler_id] = creation
            creation.add_done_callback(lambda _f: self._sampler_creations.pop(sampler_id, None))
        return await asyncio.shield(creation)

    async def _create_sampler(self, sampler_id: str, base_model: str | None, model_path: str | None) -> SamplingSession:
        if model_path is not None and not model_path.startswith("tinker://"):
            raise UserError(f"model_path must be a tinker:// path, got {model_path!r}")
        if model_path is None and base_model is None:
            raise UserError("create_sampling_session needs base_model or model_path")
        loop = asyncio.get_running_loop()
        pending = await loop.run_in_executor(
            blocking_pool(), lambda: self.engine.create_sampling_client(model_path=model_path, base_model=base_model)
        )
        client = await settle(pending)
        return self.register_sampler(sampler_id, client, base_model, model_path)

    def register_sampler(
        self, sampler_id: str, client: Any, base_model: str | None, model_path: str | None
    ) -> SamplingSession:
        session_id = sampler_id.split(":sample:")[0]
        if base_model is None:
            getter = getattr(client, "get_base_model", None)
            base_model = getter() if callable(getter) else None
        sampler = SamplingSession(sampler_id, base_model or "", model_path, client)
        session = self.sessions.get(session_id)
        if session is None or session.finished is not None:
            raise UserError(f"session {session_id} has finished", status=410)
        self.samplers[sampler_id] = sampler
        session.sampler_ids.add(sampler_id)
        return sampler

    def sampler(self, sampler_id: str) -> SamplingSession:
        sampler = self.samplers.get(sampler_id)
        if sampler is None:
            raise UserError(f"unknown sampling_session_id {sampler_id!r}", status=404)
        session = self.sessions.get(sampler_id.split(":sample:")[0])
        if session is not None:
            session.last_seen = time.monotonic()
        return sampler

    def start_sample(self, call: Callable[[], Any], last_n: int | None) -> Promise:
        promise = self.promises.create("Sample")
        self._spawn(self._sample(call, promise, last_n))
        return promise

    async def _sample(self, call: Callable[[], Any], promise: Promise, last_n: int | None) -> None:
        try:
            # The engine enqueues the request and answers with a future at once; concurrent
            # requests are merged into one decode batch by its sampler.
            response: types.SampleResponse = await settle(call())
            if last_n is not None:
                response = wire.mask_prompt_logprobs(response, last_n)
            promise.resolve("proto", wire.encode_sample_response(response))
        except Exception as exc:
            self._fail(promise, exc)

    # ------------------------------------------------------------------ helpers
    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
