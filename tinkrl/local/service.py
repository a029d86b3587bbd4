"""The embedded engine behind Tinker's client API: ServiceClient, TrainingClient, SamplingClient.

Drop-in for `tinker.ServiceClient` (SDK 0.38 types and call shapes). Every call returns a
`LocalFuture` at once (`.result()` blocks, `await` works). One engine thread per loaded base
model runs all work for it: training requests in submission order, and sampling requests
merged into shared batches (`sampler.sample_batch`). A SamplingClient holds a frozen copy of
the LoRA weights it was made from, so later optim_steps never change what it samples.

Checkpoints live under `$TINKRL_HOME/checkpoints/<run_id>/{weights,sampler_weights}/<name>`
and are addressed as `tinker://<run_id>/{weights,sampler_weights}/<name>` (absolute
directory paths work too). Sampler weights are PEFT adapter directories.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import math
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MethodType
from typing import Any

import torch
from tinker import types
from torch import nn

from tinkrl.errors import TinkrlError
from tinkrl.local import losses
from tinkrl.local.models import (
    DEFAULT_MODEL,
    cpu_has_bf16_math,
    default_dtype,
    known_models,
    load_model,
    pick_device,
    tinkrl_home,
)
from tinkrl.local.packing import MIN_SHARED, batch_packs, pack_sequences, pack_tensors, shared_opening
from tinkrl.local.sampler import SampleJob, sample_batch
from tinkrl.local.transformer import CausalLM, build_causal_lm, compile_layers, lora_head_forward

LORA_ALPHA = 32  # scaling = alpha / rank, as in Tinker: the best learning rate barely moves with rank
ATTN_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP_MODULES = ["gate_proj", "up_proj", "down_proj"]
# Padded tokens per forward/backward micro-batch. On the 2-core CPU a 32x4 arithmetic batch
# ran 14.1 s in one 3.5k-token micro-batch and 10.9 s in two; 16x4 is fastest whole (~1.7k).
MAX_TOKENS_PER_MICROBATCH = 2048
# On CUDA, kernel launches rather than tokens bound a small model's step: every datum runs as its
# own row, unpacked, in micro-batches this large (the head's fp32 logits: 8192 x vocab x 4 bytes).
MAX_TOKENS_PER_MICROBATCH_CUDA = 8192
# Concurrent sample() calls are batched: gathered until none arrives for GAP, at most MAX after the first.
SAMPLE_GATHER_GAP_S = 0.01
SAMPLE_GATHER_MAX_S = 0.1


class LocalFuture(concurrent.futures.Future):
    """A concurrent future that is also awaitable, like the SDK's APIFuture."""

    def __await__(self):
        return asyncio.wrap_future(self).__await__()

    async def result_async(self, timeout: float | None = None):
        return await asyncio.wait_for(asyncio.wrap_future(self), timeout)

    def future(self) -> concurrent.futures.Future:
        return self


def _done(value) -> LocalFuture:
    fut = LocalFuture()
    fut.set_result(value)
    return fut


class CheckpointNotFound(TinkrlError):
    pass


def resolve_path(path: str) -> Path:
    """`tinker://<run>/<kind>/<name>` or an absolute directory -> the checkpoint directory."""
    if path.startswith("tinker://"):
        rest = path[len("tinker://") :]
        local = tinkrl_home() / "checkpoints" / rest
    else:
        local = Path(path).expanduser()
    if not (local / "tinkrl_meta.json").is_file():
        raise CheckpointNotFound(f"checkpoint {path!r} not found (looked for {local}/tinkrl_meta.json)")
    return local


def _token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[target] per row, without materialising the vocabulary-wide log_softmax."""
    return logits.gather(-1, targets[:, None])[:, 0] - logits.logsumexp(-1)


# With compile=True: one fused pass per row instead of logsumexp's several over [tokens, vocab]
# temporaries (memory-bound: ~1.5 s of a 16x4 arithmetic step on a 2-core CPU).
compiled_token_logprobs = torch.compile(_token_logprobs, dynamic=True)


# ---------------------------------------------------------------------------------------------
# The engine: one per (base model, device, dtype), one worker thread.


@dataclass
class _Snapshot:
    """Frozen LoRA tensors (None for the base model) that a SamplingClient samples from."""

    key: str
    lora: dict[str, torch.Tensor] | None
    config: dict | None  # {"rank", "train_mlp", "train_attn", "train_unembed"}


@dataclass
class _Forwarded:
    """A training micro-batch's final hidden states [B, S, d] and where each datum's positions lie."""

    hidden: torch.Tensor
    members: list[tuple[int, int, list[int]]]  # (datum index, pack row, the datum's positions in that row)
    shared: int  # leading positions every row shares (run once; identical in every row)

    def sizes(self) -> list[int]:
        """Each member datum's number of positions, in member order."""
        return [len(idx) for _, _, idx in self.members]

    def coordinates(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, position) of every datum position, members in order."""
        rows = [r for _, r, idx in self.members for _ in idx]
        cols = [c for _, _, idx in self.members for c in idx]
        dev = self.hidden.device
        return torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)


def use_reduced_precision_matmuls(device: torch.device, dtype: torch.dtype) -> None:
    """bf16 compute with fp32 inputs and outputs: oneDNN's bf16 math mode on CPU, TF32 on CUDA.

    Weights and activations stay fp32; only the multiplications run at reduced precision,
    and their fp32 accumulators are never rounded to bf16. Rounded bf16 activations make the
    forward chaotic (one rounding flip at layer 12 moves logprobs by ~0.1 at the head), so the
    sampler and trainer would disagree; this way they agree to ~1e-3 at about bf16 speed.
    The setting is process-wide, so each engine sets its own before each of its operations.
    """
    reduced = dtype != torch.float32
    if device.type == "cuda":
        torch.backends.cuda.matmul.fp32_precision = "tf32" if reduced else "ieee"
    else:
        torch.backends.mkldnn.matmul.fp32_precision = "bf16" if reduced else "ieee"


class Engine:
    _engines: dict[tuple, Engine] = {}
    _lock = threading.Lock()

    @classmethod
    def get(cls, model_name: str, device: str | None = None, dtype: torch.dtype | None = None) -> Engine:
        dev = pick_device(device)
        dt = dtype or default_dtype(dev)
        key = (model_name, str(dev), dt)
        with cls._lock:
            if key not in cls._engines:
                cls._engines[key] = Engine(model_name, dev, dt)
            return cls._engines[key]

    def __init__(self, model_name: str, device: torch.device, dtype: torch.dtype):
        if device.type == "cpu" and dtype != torch.float32 and not cpu_has_bf16_math():
            warnings.warn(
                "bfloat16 on a CPU without AMX: oneDNN keeps fp32 matrix products there, so this engine "
                "computes in fp32; float32 is as fast and merges LoRA adapters for sampling",
                stacklevel=3,
            )
        loaded = load_model(model_name, device, torch.float32)
        self.model_name, self.device, self.dtype = model_name, device, dtype
        self.tokenizer = loaded.tokenizer
        self.config = loaded.model.config
        use_reduced_precision_matmuls(device, dtype)
        self.base = build_causal_lm(loaded.model, torch.float32, device)
        del loaded
        self.eos_id = self.tokenizer.eos_token_id
        self.max_context = int(getattr(self.config, "max_position_embeddings", 4096))
        self._sampler_trees: dict[tuple, CausalLM] = {}
        self._loaded_in_tree: dict[tuple, str] = {}
        self._merged_tree: CausalLM | None = None  # fp32: adapters merged into the weights (_merged_tree_for)
        self._merged_own: set[str] = set()  # its modules whose weight is its own (not the base's)
        self._merged_key: str | None = None
        self._work: list[tuple[Callable, LocalFuture]] = []
        self._samples: list[tuple[_Snapshot, SampleJob, LocalFuture]] = []
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=f"tinkrl-engine-{model_name}", daemon=True)
        self._thread.start()

    # -- scheduling -----------------------------------------------------------------------
    def submit(self, fn: Callable[[], Any]) -> LocalFuture:
        fut = LocalFuture()
        with self._cv:
            self._work.append((fn, fut))
            self._cv.notify()
        return fut

    def submit_sample(self, snapshot: _Snapshot, job: SampleJob) -> LocalFuture:
        fut = LocalFuture()
        with self._cv:
            self._samples.append((snapshot, job, fut))
            self._cv.notify()
        return fut

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._work and not self._samples:
                    self._cv.wait()
                samples = bool(self._samples)
            use_reduced_precision_matmuls(self.device, self.dtype)
            if samples:
                self._run_samples()
            else:
                with self._cv:
                    fn, fut = self._work.pop(0)
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as e:  # delivered to the caller through the future
                        fut.set_exception(e)

    def _run_samples(self) -> None:
        # Requests from many rollouts arrive over a few milliseconds (32 rollouts render and submit
        # in ~10 ms, with pauses of up to ~3 ms): gather until none has come for SAMPLE_GATHER_GAP_S.
        # A request that misses the batch waits for it to finish and then runs as a batch of its
        # own, nearly as long as the whole batch (a 26 + 6 split cost 1.4 s of a 2.3 s step).
        deadline, last = time.monotonic() + SAMPLE_GATHER_MAX_S, -1
        while time.monotonic() < deadline:
            with self._cv:
                n = len(self._samples)
            if n == last:
                break
            last = n
            time.sleep(SAMPLE_GATHER_GAP_S)
        with self._cv:
            batch, self._samples = self._samples, []
        groups: dict[str, list] = {}
        for item in batch:
            groups.setdefault(item[0].key, []).append(item)
        for items in groups.values():
            live = [(s, j, f) for s, j, f in items if f.set_running_or_notify_cancel()]
            if not live:
                continue
            try:
                tree = self._tree_for(live[0][0])
                sample_batch(tree, [j for _, j, _ in live], self.tokenizer, self.eos_id, self.max_context)
                for _, j, f in live:
                    f.set_result(j.result)
            except BaseException as e:
                for _, _, f in live:
                    f.set_exception(e)

    # -- model trees ------------------------------------------------------------------------
    def new_tree(self) -> CausalLM:
        """A fresh module tree sharing the base weights (no copy)."""
        with torch.device("meta"):
            tree = CausalLM(
                self.config,
                rotary=None,
                qkv_bias=self.base.model.layers[0].self_attn.q_proj.bias is not None,
                mlp_bias=self.base.model.layers[0].mlp.gate_proj.bias is not None,
            )
        tree.load_state_dict(self.base.state_dict(), assign=True)
        tree.rotary = self.base.rotary
        tree.lm_head.compute_dtype = self.dtype
        tree.lm_head._fast_weight = self.base.lm_head._fast_weight
        return tree.requires_grad_(False)

    def lora_tree(
        self, rank: int, seed: int | None, train_mlp: bool, train_attn: bool, train_unembed: bool
    ) -> CausalLM:
        from peft import LoraConfig, inject_adapter_in_model

        targets = (
            (ATTN_MODULES if train_attn else [])
            + (MLP_MODULES if train_mlp else [])
            + (["lm_head"] if train_unembed else [])
        )
        if not targets:
            raise TinkrlError("LoRA needs at least one of train_attn, train_mlp, train_unembed")
        tree = self.new_tree()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0 if seed is None else seed)
            inject_adapter_in_model(
                LoraConfig(r=rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=targets), tree
            )
        for name, p in tree.named_parameters():
            if "lora_" in name:
                p.data = p.data.float()  # adapters and their optimizer state stay fp32
            p.requires_grad_("lora_" in name)
        if train_unembed:
            tree.lm_head.forward = MethodType(lora_head_forward, tree.lm_head)
        return tree.to(self.device)

    def _tree_for(self, snap: _Snapshot) -> CausalLM:
        if snap.lora is None:
            return self.base
        if self.dtype == torch.float32:
            return self._merged_tree_for(snap)
        cfg_key = tuple(sorted(snap.config.items()))
        tree = self._sampler_trees.get(cfg_key)
        if tree is None:
            c = snap.config
            tree = self._sampler_trees[cfg_key] = self.lora_tree(
                c["rank"], 0, c["train_mlp"], c["train_attn"], c["train_unembed"]
            )
        if self._loaded_in_tree.get(cfg_key) != snap.key:
            params = dict(tree.named_parameters())
            with torch.no_grad():
                for name, t in snap.lora.items():
                    params[name].copy_(t)
            self._loaded_in_tree[cfg_key] = snap.key
        return tree

    def _merged_tree_for(self, snap: _Snapshot) -> CausalLM:
        """In fp32, a sampling tree with the adapter merged into its own copy of each adapted
        weight (W + scale * B @ A), once per weight version.

        A decode step then runs the base model's matrix products only: with the adapter apart,
        LoRA's two extra small products per projection cost ~15-40 % of a CPU decode step. The
        merge is exact to fp32 rounding (~1e-6 from the trainer's W x + scale * B (A x)) and takes
        ~0.1 s. In reduced precision the adapter stays apart: a merged weight would round to bf16
        (or TF32) differently from the trainer's W and B @ A, and the sampler and the trainer
        must compute the same logprobs.
        """
        tree = self._merged_tree
        if tree is None:
            tree = self._merged_tree = self.new_tree()
        if self._merged_key == snap.key:
            return tree
        modules, base_modules = dict(tree.named_modules()), dict(self.base.named_modules())
        scale = LORA_ALPHA / snap.config["rank"]
        adapted = set()
        with torch.no_grad():
            for name, a in snap.lora.items():
                if ".lora_A." not in name:
                    continue
                module = name.split(".lora_A.")[0]
                b = snap.lora[name.replace(".lora_A.", ".lora_B.")]
                if module not in self._merged_own:  # shares the base weight until first adapted
                    modules[module].weight = nn.Parameter(
                        torch.empty_like(base_modules[module].weight), requires_grad=False
                    )
                    self._merged_own.add(module)
                torch.addmm(
                    base_modules[module].weight,
                    b.to(self.device),
                    a.to(self.device),
                    alpha=scale,
                    out=modules[module].weight,
                )
                adapted.add(module)
            for module in self._merged_own - adapted:  # adapted by an earlier version's config only
                modules[module].weight.copy_(base_modules[module].weight)
        self._merged_key = snap.key
        return tree


# ---------------------------------------------------------------------------------------------
# Clients


class ServiceClient:
    """`tinker.ServiceClient` for the embedded engine. `device`/`dtype` default to the hardware's best.

    `compile=True` torch.compiles the training clients' forward (faster steps after a
    one-time compile; see transformer.compile_layers). Sampling always runs eager.
    """

    def __init__(
        self, *, device: str | None = None, dtype: str | torch.dtype | None = None, compile: bool = False, **_ignored
    ):
        self.device = device
        self.compile = compile
        names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
        if isinstance(dtype, str) and dtype not in names:  # was passed through and failed deep in the head
            raise TinkrlError(f"dtype {dtype!r} is not supported; use float32 or bfloat16")
        self.dtype = names.get(dtype, dtype) if dtype else None

    def _engine(self, model: str) -> Engine:
        return Engine.get(model, self.device, self.dtype)

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
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
        return TrainingClient(self._engine(base_model), rank, seed, train_mlp, train_attn, train_unembed, self.compile)

    def create_training_client_from_state(self, path: str, **_ignored) -> TrainingClient:
        return self._from_state(path, with_optimizer=False)

    def create_training_client_from_state_with_optimizer(self, path: str, **_ignored) -> TrainingClient:
        return self._from_state(path, with_optimizer=True)

    def _from_state(self, path: str, with_optimizer: bool) -> TrainingClient:
        ckpt = resolve_path(path)
        meta = json.loads((ckpt / "tinkrl_meta.json").read_text())
        lora = meta["lora"]
        tc = TrainingClient(
            self._engine(meta["base_model"]),
            lora["rank"],
            lora.get("seed"),
            lora["train_mlp"],
            lora["train_attn"],
            lora["train_unembed"],
            self.compile,
        )
        tc._load(ckpt, with_optimizer).result()
        return tc

    def create_sampling_client(
        self, model_path: str | None = None, base_model: str | None = None, **_ignored
    ) -> SamplingClient:
        if model_path is None:
            return SamplingClient(self._engine(base_model or DEFAULT_MODEL), _Snapshot("base", None, None))
        ckpt = resolve_path(model_path)
        meta = json.loads((ckpt / "tinkrl_meta.json").read_text())
        from safetensors.torch import load_file

        engine = self._engine(meta["base_model"])
        lora = {k: v.to(engine.device) for k, v in load_file(ckpt / "lora.safetensors").items()}
        config = {k: meta["lora"][k] for k in ("rank", "train_mlp", "train_attn", "train_unembed")}
        # A key per client, not per path: a checkpoint name saved again holds new weights, and the
        # engine reloads a sampler tree only when the snapshot key changes.
        return SamplingClient(engine, _Snapshot(f"path:{ckpt}:{uuid.uuid4().hex[:12]}", lora, config))

    # async variants (the SDK's older spelling)
    async def create_lora_training_client_async(self, *args, **kwargs) -> TrainingClient:
        return await asyncio.to_thread(self.create_lora_training_client, *args, **kwargs)

    async def create_sampling_client_async(self, *args, **kwargs) -> SamplingClient:
        return await asyncio.to_thread(self.create_sampling_client, *args, **kwargs)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _ClientHandle:
    """Lets `client.result()` / `await client` work as on the SDK's client futures."""

    def result(self, timeout: float | None = None):
        return self

    def __await__(self):
        async def _self():
            return self

        return _self().__await__()


class TrainingClient(_ClientHandle):
    _counter = itertools.count()

    def __init__(
        self,
        engine: Engine,
        rank: int,
        seed: int | None,
        train_mlp: bool,
        train_attn: bool,
        train_unembed: bool,
        compile: bool = False,
    ):
        self.engine = engine
        self.run_id = f"local-{uuid.uuid4().hex[:12]}"
        self.lora_config = dict(
            rank=rank, seed=seed, train_mlp=train_mlp, train_attn=train_attn, train_unembed=train_unembed
        )
        self.model = engine.submit(lambda: engine.lora_tree(rank, seed, train_mlp, train_attn, train_unembed)).result()
        if compile:
            compile_layers(self.model)
        self.params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        self.optimizer = torch.optim.AdamW(
            self.params.values(), lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0
        )
        self.step = 0
        self._snapshot_seq = itertools.count()

    # -- helpers ------------------------------------------------------------------------------
    def get_tokenizer(self):
        return self.engine.tokenizer

    def get_info(self) -> types.GetInfoResponse:
        return types.GetInfoResponse(
            model_id=self.run_id,
            model_name=self.engine.model_name,
            is_lora=True,
            lora_rank=self.lora_config["rank"],
            model_data=types.ModelData(
                arch=self.engine.config.model_type,
                model_name=self.engine.model_name,
                tokenizer_id=self.engine.model_name,
            ),
        )

    def _snapshot(self) -> _Snapshot:
        lora = {n: p.detach().clone() for n, p in self.params.items()}
        config = {k: self.lora_config[k] for k in ("rank", "train_mlp", "train_attn", "train_unembed")}
        return _Snapshot(f"{self.run_id}:{next(self._snapshot_seq)}", lora, config)

    # -- forward / backward ---------------------------------------------------------------------
    def forward(
        self, data: Sequence[types.Datum], loss_fn: str = "cross_entropy", loss_fn_config: dict | None = None
    ) -> LocalFuture:
        data = list(data)
        return self.engine.submit(lambda: self._forward_backward(data, loss_fn, loss_fn_config, backward=False))

    def forward_backward(
        self, data: Sequence[types.Datum], loss_fn: str = "cross_entropy", loss_fn_config: dict | None = None
    ) -> LocalFuture:
        data = list(data)
        return self.engine.submit(lambda: self._forward_backward(data, loss_fn, loss_fn_config, backward=True))

    def forward_backward_custom(self, data: Sequence[types.Datum], loss_fn: Callable) -> LocalFuture:
        """`loss_fn(data, logprobs_list) -> (loss, metrics)` on torch tensors, as in the SDK."""
        data = list(data)
        return self.engine.submit(lambda: self._forward_backward_custom(data, loss_fn))

    @staticmethod
    def _inputs(data: list[types.Datum]) -> list[dict[str, torch.Tensor]]:
        inputs = []
        for i, d in enumerate(data):
            n = d.model_input.length
            tensors = {k: v.to_torch() for k, v in d.loss_fn_inputs.items()}
            for k, t in tensors.items():
                if t.shape[0] != n:
                    raise losses.LossInputError(
                        f"datum {i}: loss_fn_inputs[{k!r}] has length {t.shape[0]} but "
                        f"model_input has {n} tokens (targets are inputs shifted by one)"
                    )
            inputs.append(tensors)
        return inputs

    def _hidden_states(self, data: list[types.Datum], grad: bool, max_tokens: int | None = None):
        """Yield each micro-batch as a `_Forwarded`, shared prefixes run once (packing.py).

        On CUDA nothing is packed and micro-batches are larger: there the extra launches of packed
        attention and of the two-pass shared opening cost more than the tokens they save (H100,
        SmolLM2 shape, 64 datums: 0.47 s packed -> 0.28 s; docs/performance.md).
        """
        seqs = [d.model_input.to_ints() for d in data]
        cuda = self.engine.device.type == "cuda"
        max_tokens = max_tokens or (MAX_TOKENS_PER_MICROBATCH_CUDA if cuda else MAX_TOKENS_PER_MICROBATCH)
        packs = pack_sequences(seqs, min_shared=1 << 30 if cuda else MIN_SHARED, max_tokens=max_tokens)
        for mb in batch_packs(packs, max_tokens):
            ids, positions, mask = pack_tensors(mb, self.engine.device)
            # Packs of different prompts still open alike (the chat template's system turn): run that once.
            shared = 0 if cuda else shared_opening(mb)
            with torch.set_grad_enabled(grad):
                if shared:
                    hidden = self.model.forward_shared_prefix(ids, positions, mask, shared)
                else:
                    hidden = self.model(ids, positions, mask)
            yield _Forwarded(hidden, [(i, r, idx) for r, p in enumerate(mb) for i, idx in p.members], shared)

    def _logprobs(self, fwd: _Forwarded, targets: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """Target logprobs of every position of the micro-batch's datums, in member order: the exact
        fp32 head where the loss can be non-zero; elsewhere (no loss, no gradient) the faster
        compute-dtype head, without grad, once per distinct (hidden state, target)."""
        rows, cols = fwd.coordinates()
        lp = fwd.hidden.new_zeros(targets.shape[0])
        idle = ~active
        token_logprobs = compiled_token_logprobs if self.model.compiled else _token_logprobs
        if bool(idle.any()):
            with torch.no_grad():
                # A group's datums repeat their prompt's positions (one pack row), and every row
                # repeats the shared opening (row 0 holds it): ~90 % of a GRPO batch's idle positions.
                S, V = fwd.hidden.shape[1], self.model.config.vocab_size
                r, c, t = torch.where(cols[idle] < fwd.shared, 0, rows[idle]), cols[idle], targets[idle]
                keys, inverse = torch.unique((r * S + c) * V + t, return_inverse=True)
                r, c, t = keys // V // S, keys // V % S, keys % V
                logits = self.model.logits(fwd.hidden[r, c].detach(), exact=False)
                lp[idle] = token_logprobs(logits, t)[inverse]
        if bool(active.any()):
            logits = self.model.logits(fwd.hidden[rows[active], cols[active]])
            lp = lp.index_put((active,), token_logprobs(logits, targets[active]))
        return lp

    def _forward_backward(
        self, data: list[types.Datum], loss_fn: str, config: dict | None, backward: bool
    ) -> types.ForwardBackwardOutput:
        if not data:
            raise losses.LossInputError("forward_backward needs at least one datum")
        for i, d in enumerate(data):  # every datum, so a later one missing a key is a clear error too
            try:
                losses.check_loss(loss_fn, config, set(d.loss_fn_inputs))
            except losses.LossInputError as e:
                raise losses.LossInputError(f"datum {i}: {e}" if i else str(e)) from None
        inputs = self._inputs(data)
        out_lp: list[torch.Tensor | None] = [None] * len(data)
        total = 0.0
        dev = self.engine.device
        for fwd in self._hidden_states(data, grad=backward):
            with torch.set_grad_enabled(backward):
                dev_inputs = [{k: v.to(dev) for k, v in inputs[i].items()} for i, _, _ in fwd.members]
                # One head pass over every datum of the micro-batch, then each datum's loss.
                targets = torch.cat([d["target_tokens"].long() for d in dev_inputs])
                active = torch.cat([losses.active_positions(loss_fn, d) for d in dev_inputs])
                all_lps = self._logprobs(fwd, targets, active)
                sizes = fwd.sizes()
                loss = torch.zeros((), device=dev)
                for lp, d in zip(all_lps.split(sizes), dev_inputs):
                    loss = loss + losses.datum_loss(loss_fn, lp, d, config)
                # one device-to-host copy per micro-batch (a copy per datum is a sync each on CUDA)
                for (i, _, _), lp in zip(fwd.members, all_lps.detach().float().cpu().split(sizes)):
                    out_lp[i] = lp
            if backward and loss.requires_grad:
                loss.backward()
            total += float(loss.detach())
        outputs = [{"logprobs": types.TensorData.from_torch(lp)} for lp in out_lp]
        return types.ForwardBackwardOutput(
            loss_fn_output_type=loss_fn, loss_fn_outputs=outputs, metrics={"loss:sum": total}
        )

    def _forward_backward_custom(self, data: list[types.Datum], loss_fn: Callable) -> types.ForwardBackwardOutput:
        inputs = self._inputs(data)
        lps: list[torch.Tensor | None] = [None] * len(data)
        for fwd in self._hidden_states(data, grad=True, max_tokens=1 << 30):  # one graph for the user's loss
            targets = torch.cat([inputs[i]["target_tokens"].long() for i, _, _ in fwd.members]).to(fwd.hidden.device)
            all_lps = self._logprobs(fwd, targets, torch.ones_like(targets, dtype=torch.bool))
            for (i, _, _), lp in zip(fwd.members, all_lps.split(fwd.sizes())):
                lps[i] = lp
        # As the SDK does: the user's loss sees CPU tensors (whatever the device), and its gradient
        # with respect to them flows back into the model.
        host = [lp.detach().cpu().requires_grad_() for lp in lps]
        loss, metrics = loss_fn(data, host)
        loss.backward()
        torch.autograd.backward(
            lps, [h.grad.to(lp.device) if h.grad is not None else torch.zeros_like(lp) for h, lp in zip(host, lps)]
        )
        outputs = [{"logprobs": types.TensorData.from_torch(lp.detach())} for lp in host]
        return types.ForwardBackwardOutput(
            loss_fn_output_type="custom",
            loss_fn_outputs=outputs,
            metrics={"loss:sum": float(loss.detach()), **dict(metrics or {})},
        )

    # -- optimizer ------------------------------------------------------------------------------
    def optim_step(self, adam_params: types.AdamParams | None = None, **kwargs) -> LocalFuture:
        params = adam_params or kwargs.get("optim_params") or types.AdamParams()
        return self.engine.submit(lambda: self._optim_step(params))

    def _optim_step(self, p: types.AdamParams) -> types.OptimStepResponse:
        for group in self.optimizer.param_groups:
            group.update(lr=p.learning_rate, betas=(p.beta1, p.beta2), eps=p.eps, weight_decay=p.weight_decay)
        grads = [q for q in self.params.values() if q.grad is not None]
        clip = p.grad_clip_norm if p.grad_clip_norm and p.grad_clip_norm > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(grads, clip)) if grads else 0.0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return types.OptimStepResponse(
            metrics={"grad_norm:mean": norm, "learning_rate:mean": p.learning_rate, "step:max": float(self.step)}
        )

    # -- checkpoints ------------------------------------------------------------------------------
    def _write(self, kind: str, name: str, with_optimizer: bool) -> Path:
        from safetensors.torch import save_file

        from tinkrl.local.checkpoints import write_peft_adapter

        out = tinkrl_home() / "checkpoints" / self.run_id / kind / name
        out.mkdir(parents=True, exist_ok=True)
        lora = {n: p.detach().contiguous().cpu() for n, p in self.params.items()}
        save_file(lora, out / "lora.safetensors")
        meta = {
            "base_model": self.engine.model_name,
            "lora": self.lora_config,
            "step": self.step,
            "kind": kind,
            "run_id": self.run_id,
            "lora_alpha": LORA_ALPHA,
        }
        if with_optimizer:
            torch.save(self.optimizer.state_dict(), out / "optimizer.pt")
        write_peft_adapter(out, lora, meta)
        (out / "tinkrl_meta.json").write_text(json.dumps(meta, indent=2))
        return out

    def save_state(self, name: str, **_ignored) -> LocalFuture:
        return self.engine.submit(
            lambda: types.SaveWeightsResponse(
                path=(self._write("weights", name, True), f"tinker://{self.run_id}/weights/{name}")[1]
            )
        )

    def save_weights_for_sampler(self, name: str, **_ignored) -> LocalFuture:
        return self.engine.submit(
            lambda: types.SaveWeightsForSamplerResponse(
                path=(self._write("sampler_weights", name, False), f"tinker://{self.run_id}/sampler_weights/{name}")[1]
            )
        )

    def save_weights_and_get_sampling_client(self, name: str | None = None, **_ignored) -> SamplingClient:
        """A sampling client pinned to the current weights (no checkpoint written unless `name`)."""
        snap = self.engine.submit(self._snapshot).result()
        if name:
            self.save_weights_for_sampler(name).result()
        return SamplingClient(self.engine, snap)

    def create_sampling_client(self, model_path: str, **kwargs) -> SamplingClient:
        return ServiceClient(device=str(self.engine.device), dtype=self.engine.dtype).create_sampling_client(model_path)

    def _load(self, ckpt: Path, with_optimizer: bool) -> LocalFuture:
        def load():
            from safetensors.torch import load_file

            state = load_file(ckpt / "lora.safetensors")
            with torch.no_grad():
                for n, p in self.params.items():
                    p.copy_(state[n].to(p.device))
            if with_optimizer:
                opt = ckpt / "optimizer.pt"
                if not opt.is_file():
                    raise CheckpointNotFound(f"{ckpt} holds no optimizer state (saved with save_weights_for_sampler?)")
                self.optimizer.load_state_dict(torch.load(opt, map_location=self.engine.device))
            self.step = json.loads((ckpt / "tinkrl_meta.json").read_text()).get("step", 0)

        return self.engine.submit(load)

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
    def __init__(self, engine: Engine, snapshot: _Snapshot):
        self.engine = engine
        self.snapshot = snapshot

    def get_tokenizer(self):
        return self.engine.tokenizer

    def get_base_model(self) -> str:
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
