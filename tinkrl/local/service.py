"""Tinker's client API over the embedded engine: ServiceClient, TrainingClient, SamplingClient.

Drop-in for `tinker.ServiceClient` (SDK 0.38 types and call shapes). Every call returns a
`LocalFuture` at once (`.result()` blocks, `await` works). The clients are thin handles: a
TrainingClient submits operations on its `training.Trainer` to the engine thread
(engine.py), which runs them in submission order, and a SamplingClient submits sample
requests, which the engine merges into shared batches. A SamplingClient holds a frozen copy
of the LoRA weights it was made from, so later optim_steps never change what it samples.
Checkpoint paths (`tinker://...`) are checkpoints.py's.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence

import torch
from tinker import types

from tinkrl.errors import TinkrlError
from tinkrl.local.checkpoints import read_lora, read_meta, resolve_path
from tinkrl.local.engine import Engine, Snapshot
from tinkrl.local.futures import LocalFuture
from tinkrl.local.lora import LoraSpec
from tinkrl.local.model_files import unsupported_reason
from tinkrl.local.models import DEFAULT_MODEL, known_models, parse_dtype, parse_sampler_precision
from tinkrl.local.sampler import SampleJob
from tinkrl.local.training import Trainer


class ServiceClient:
    """`tinker.ServiceClient` for the embedded engine. `device`, `dtype` and `sampler_precision` ("matched"
    or "bfloat16") default to the hardware class's rules (compute_plan.py).

    `compile=True` torch.compiles the training clients' forward (faster steps after a
    one-time compile; see transformer.compile_layers). Sampling always runs eager.
    """

    def __init__(
        self,
        *,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        compile: bool = False,
        sampler_precision: str | None = None,
        **_ignored,
    ):
        self.device = device
        self.compile = compile
        self.dtype = parse_dtype(dtype) if dtype else None
        self.sampler_precision = parse_sampler_precision(sampler_precision) if sampler_precision else None

    def _engine(self, model: str) -> Engine:
        """The engine holding `model`; a one-line TinkrlError naming backend=tinker, before anything loads, for
        an architecture the engine does not implement (a mixture of experts, a vision tower, ...)."""
        if reason := unsupported_reason(model):
            raise TinkrlError(reason)
        return Engine.get(model, self.device, self.dtype, self.sampler_precision)

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        """The models this engine can load without a download."""
        return types.GetServerCapabilitiesResponse(
            supported_models=[types.SupportedModel(model_name=m, max_context_length=None) for m in known_models()]
        )

    def create_lora_training_client(
        self,
        base_model: str = DEFAULT_MODEL,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict | None = None,
        **_ignored,
    ) -> TrainingClient:
        """A training client with a fresh LoRA adapter on `base_model` (B starts at 0, so it equals the base);
        `user_metadata` is kept with its checkpoints (`checkpoint_metadata` reads it back)."""
        spec = LoraSpec(rank, train_mlp, train_attn, train_unembed)
        tc = TrainingClient(self._engine(base_model), spec, seed, self.compile)
        tc.trainer.user_metadata = {str(k): str(v) for k, v in (user_metadata or {}).items()}
        return tc

    def create_training_client_from_state(self, path: str, **_ignored) -> TrainingClient:
        """A training client with a checkpoint's weights and step, and a fresh optimizer."""
        return self._from_state(path, with_optimizer=False)

    def create_training_client_from_state_with_optimizer(self, path: str, **_ignored) -> TrainingClient:
        """A training client resumed from a `save_state` checkpoint: weights, step and optimizer."""
        return self._from_state(path, with_optimizer=True)

    def _from_state(self, path: str, with_optimizer: bool) -> TrainingClient:
        ckpt = resolve_path(path)
        meta = read_meta(ckpt)
        spec = LoraSpec.from_meta(meta["lora"])
        tc = TrainingClient(self._engine(meta["base_model"]), spec, meta["lora"].get("seed"), self.compile)
        tc.engine.submit(tc.trainer.load, ckpt, with_optimizer).result()
        return tc

    def create_sampling_client(
        self, model_path: str | None = None, base_model: str | None = None, **_ignored
    ) -> SamplingClient:
        """A sampling client for a checkpoint's weights (`model_path`) or a base model's."""
        if model_path is None:
            return SamplingClient(self._engine(base_model or DEFAULT_MODEL), Snapshot("base", None, None))
        ckpt = resolve_path(model_path)
        meta = read_meta(ckpt)
        engine = self._engine(meta["base_model"])
        lora = {k: v.to(engine.device) for k, v in read_lora(ckpt).items()}
        config = LoraSpec.from_meta(meta["lora"])
        # A key per client, not per path: a checkpoint name saved again holds new weights, and the
        # engine reloads a sampler tree only when the snapshot key changes.
        return SamplingClient(engine, Snapshot(f"path:{ckpt}:{uuid.uuid4().hex[:12]}", lora, config))

    # async variants (the SDK's older spelling)
    async def create_lora_training_client_async(self, *args, **kwargs) -> TrainingClient:
        return await asyncio.to_thread(self.create_lora_training_client, *args, **kwargs)

    async def create_sampling_client_async(self, *args, **kwargs) -> SamplingClient:
        return await asyncio.to_thread(self.create_sampling_client, *args, **kwargs)

    def compute_plans(self) -> dict[str, dict]:
        """How each engine of this process computes (`plan.ComputePlan.as_dict()`), by model and device."""
        return {f"{e.model_name} on {e.device}": e.plan.as_dict() for e in list(Engine._engines.values())}

    def close(self, status: str = "success", detail: str | None = None) -> LocalFuture:
        """The SDK's `close(status, detail)`, already done: there is no session to finish and nothing to
        release (engines live as long as the process). `.result()` returns None at once."""
        done = LocalFuture()
        done.set_result(None)
        return done

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ClientHandle:
    """Lets `client.result()` / `await client` work as on the SDK's client futures."""

    def result(self, timeout: float | None = None):
        """The client itself (it is ready at once)."""
        return self

    def __await__(self):
        async def _self():
            return self

        return _self().__await__()


class TrainingClient(_ClientHandle):
    """`tinker.TrainingClient` for the embedded engine: a handle on one `Trainer`."""

    def __init__(self, engine: Engine, spec: LoraSpec, seed: int | None, compile: bool = False):
        self.engine = engine
        self.trainer: Trainer = engine.submit(Trainer, engine, spec, seed, compile).result()

    @property
    def run_id(self) -> str:
        """The training run's id: `get_info().model_id` and the `<run>` of its tinker:// paths."""
        return self.trainer.run_id

    def get_tokenizer(self):
        """The base model's tokenizer."""
        return self.engine.tokenizer

    def get_info(self) -> types.GetInfoResponse:
        """The training run's id, base model and LoRA rank."""
        return types.GetInfoResponse(
            model_id=self.run_id,
            model_name=self.engine.model_name,
            is_lora=True,
            lora_rank=self.trainer.spec.rank,
            model_data=types.ModelData(
                arch=self.engine.config.model_type,
                model_name=self.engine.model_name,
                tokenizer_id=self.engine.model_name,
            ),
        )

    # -- forward / backward ---------------------------------------------------------------------
    def forward(
        self, data: Sequence[types.Datum], loss_fn: str = "cross_entropy", loss_fn_config: dict | None = None
    ) -> LocalFuture:
        """Per-datum logprobs and the loss, without gradients."""
        return self.engine.submit(self.trainer.forward_backward, list(data), loss_fn, loss_fn_config, backward=False)

    def forward_backward(
        self, data: Sequence[types.Datum], loss_fn: str = "cross_entropy", loss_fn_config: dict | None = None
    ) -> LocalFuture:
        """Per-datum logprobs and the loss; gradients accumulate until the next optim_step."""
        return self.engine.submit(self.trainer.forward_backward, list(data), loss_fn, loss_fn_config, backward=True)

    def forward_backward_custom(self, data: Sequence[types.Datum], loss_fn: Callable) -> LocalFuture:
        """`loss_fn(data, logprobs_list) -> (loss, metrics)` on torch tensors, as in the SDK."""
        return self.engine.submit(self.trainer.forward_backward_custom, list(data), loss_fn)

    def optim_step(self, adam_params: types.AdamParams | None = None, **kwargs) -> LocalFuture:
        """One AdamW step on the accumulated gradients (AdamParams as `adam_params` or `optim_params`)."""
        params = adam_params or kwargs.get("optim_params") or types.AdamParams()
        return self.engine.submit(self.trainer.optim_step, params)

    # -- checkpoints ------------------------------------------------------------------------------
    def save_state(self, name: str, **_ignored) -> LocalFuture:
        """Save weights and optimizer state as `tinker://<run>/weights/<name>`."""
        return self.engine.submit(self.trainer.save_state, name)

    def save_weights_for_sampler(self, name: str, **_ignored) -> LocalFuture:
        """Save weights as `tinker://<run>/sampler_weights/<name>` (also a PEFT adapter directory)."""
        return self.engine.submit(self.trainer.save_weights_for_sampler, name)

    def save_weights_and_get_sampling_client(self, name: str | None = None, **_ignored) -> SamplingClient:
        """A sampling client pinned to the current weights (no checkpoint written unless `name`)."""
        snap = self.engine.submit(self.trainer.snapshot).result()
        if name:
            self.save_weights_for_sampler(name).result()
        return SamplingClient(self.engine, snap)

    def create_sampling_client(self, model_path: str, **kwargs) -> SamplingClient:
        """A sampling client for a saved checkpoint, on this client's device and precision."""
        return ServiceClient(
            device=str(self.engine.device), dtype=self.engine.dtype, sampler_precision=self.engine.sampler
        ).create_sampling_client(model_path)

    # SDK 0.38's deprecated async spellings: `await (await tc.forward_backward_async(...))`
    async def forward_backward_async(self, *a, **k):
        return self.forward_backward(*a, **k)

    async def forward_async(self, *a, **k):
        return self.forward(*a, **k)

    async def optim_step_async(self, *a, **k):
        return self.optim_step(*a, **k)

    async def save_state_async(self, *a, **k):
        return self.save_state(*a, **k)

    async def save_weights_for_sampler_async(self, *a, **k):
        return self.save_weights_for_sampler(*a, **k)

    async def save_weights_and_get_sampling_client_async(self, *a, **k):
        return await asyncio.to_thread(self.save_weights_and_get_sampling_client, *a, **k)


class SamplingClient(_ClientHandle):
    """`tinker.SamplingClient` for the embedded engine: samples one frozen weight version."""

    def __init__(self, engine: Engine, snapshot: Snapshot):
        self.engine = engine
        self.snapshot = snapshot

    def get_tokenizer(self):
        """The base model's tokenizer."""
        return self.engine.tokenizer

    def get_base_model(self) -> str:
        """The base model's name."""
        return self.engine.model_name

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int = 1,
        sampling_params: types.SamplingParams | None = None,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        **options,
    ) -> LocalFuture:
        """`num_samples` continuations of `prompt`; merged with the requests that arrive with it."""
        if num_samples < 1:
            raise ValueError("sample: num_samples must be >= 1")
        unsupported = sorted(k for k, v in options.items() if v not in (None, 0, False))
        if unsupported:
            raise TinkrlError(
                f"sample options {unsupported} are not supported by the embedded engine "
                "(supported: num_samples, sampling_params, include_prompt_logprobs, topk_prompt_logprobs)"
            )
        tokens = prompt.to_ints()
        # Checked here, not in the batch: one bad request must not fail the requests merged with it.
        vocab = int(self.engine.config.vocab_size)
        if not tokens:
            raise ValueError("sample: the prompt is empty")
        if min(tokens) < 0 or max(tokens) >= vocab:
            bad = next(t for t in tokens if t < 0 or t >= vocab)
            raise ValueError(f"sample: prompt token id {bad} is outside the vocabulary [0, {vocab})")
        job = SampleJob(
            tokens,
            num_samples,
            sampling_params or types.SamplingParams(),
            include_prompt_logprobs,
            topk_prompt_logprobs,
        )
        return self.engine.submit_sample(self.snapshot, job)

    def compute_logprobs(self, prompt: types.ModelInput) -> LocalFuture:
        """The prompt's per-token logprobs (None for the first token)."""
        fut = self.sample(prompt, 1, types.SamplingParams(max_tokens=1, temperature=0.0), include_prompt_logprobs=True)
        out = LocalFuture()
        fut.add_done_callback(
            lambda f: out.set_exception(f.exception()) if f.exception() else out.set_result(f.result().prompt_logprobs)
        )
        return out

    async def sample_async(self, *a, **k):
        return await self.sample(*a, **k)

    async def compute_logprobs_async(self, *a, **k):
        return await self.compute_logprobs(*a, **k)
