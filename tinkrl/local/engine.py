"""The engine: one worker thread per (base model, device, precision) that runs all of its work.

Training operations run in submission order; `sample()` requests that arrive while the thread
is busy, or within a short gathering window, are merged into one batch (`sampler.sample_batch`)
per weight version. The engine owns the frozen base model and the module trees that share its
weights: one per sampling LoRA config (adapter apart, in reduced precision), one with adapters
merged into copies of the adapted weights (fp32, or bf16 under bf16 sampling, whose base model
also has a bf16 copy), and the training trees it makes for `training.Trainer`. PyTorch's
reduced-precision matmul setting is process-wide, so the thread sets its engine's own before
every operation.
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tinkrl.local.compute_plan import (
    Choice,
    ComputePlan,
    default_rule,
    make_plan,
    probe,
    resolve_precision,
    resolve_sampler,
    with_training_memory,
)
from tinkrl.local.futures import LocalFuture
from tinkrl.local.kernels.paths import for_plan
from tinkrl.local.lora import LoraSpec, add_lora
from tinkrl.local.memory import step_memory
from tinkrl.local.models import load_model, parse_dtype, pick_device
from tinkrl.local.prefix_cache import PrefixCache, Prefixes, budget_from_env
from tinkrl.local.sampler import SampleJob, sample_batch
from tinkrl.local.transformer import (
    CausalLM,
    Linear,
    build_causal_lm,
    fuse_projections,
    head_dim,
    to_bf16_sampling,
)

# Concurrent sample() calls are batched: gathered until none arrives for GAP, at most MAX after the first.
SAMPLE_GATHER_GAP_S = 0.01
SAMPLE_GATHER_MAX_S = 0.1


@dataclass
class Snapshot:
    """Frozen LoRA tensors (None for the base model) that a SamplingClient samples from.

    `key` names one weight version: the engine reloads or re-merges a sampling tree only when
    it changes.
    """

    key: str
    lora: dict[str, torch.Tensor] | None
    config: LoraSpec | None


def use_reduced_precision_matmuls(device: torch.device, products: str) -> None:
    """The plan's products: bf16 compute with fp32 inputs and outputs (oneDNN's bf16 math mode on CPU,
    "bf16 math mode"; TF32 on CUDA, "tf32"), or fp32.

    Weights and activations stay fp32; only the multiplications run at reduced precision,
    and their fp32 accumulators are never rounded to bf16. Rounded bf16 activations make the
    forward chaotic (a single rounding flip grows through the layers), so the sampler and the
    trainer would disagree; this way they agree at about bf16 speed (docs/engine.md).
    The setting is process-wide, so each engine sets its own before each of its operations.
    """
    if device.type == "cuda":
        torch.backends.cuda.matmul.fp32_precision = "tf32" if products == "tf32" else "ieee"
    else:
        torch.backends.mkldnn.matmul.fp32_precision = "bf16" if products == "bf16 math mode" else "ieee"


class Engine:
    """One loaded base model and the worker thread that runs every operation on it."""

    _engines: dict[tuple, Engine] = {}
    _lock = threading.Lock()

    @classmethod
    def get(
        cls,
        model_name: str,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        sampler: str | None = None,
    ) -> Engine:
        """The process's engine for this model, device, precision and sampler precision (defaults: the
        hardware class's rules, `compute_plan.py`)."""
        dev = pick_device(device)
        cuda_bf16 = dev.type == "cuda" and torch.cuda.is_bf16_supported()
        asked = None if dtype is None else str(dtype).removeprefix("torch.")
        precision = resolve_precision(probe(), dev.type, asked, cuda_bf16)
        sampling = resolve_sampler(probe(), dev.type, sampler)
        key = (model_name, str(dev), precision.path, sampling.path)
        with cls._lock:
            if key not in cls._engines:
                cls._engines[key] = Engine(model_name, dev, precision, sampling)
            return cls._engines[key]

    def __init__(self, model_name: str, device: torch.device, precision: Choice, sampler: Choice):
        machine, cuda_bf16 = probe(), device.type == "cuda" and torch.cuda.is_bf16_supported()
        rule = default_rule(machine, device.type, cuda_bf16)
        if device.type == "cpu" and precision.path != rule.precision:
            warnings.warn(
                f"{precision.path} on this {machine.cpu_class} CPU, whose default is {rule.precision}: {rule.measured}",
                stacklevel=3,
            )
        if device.type == "cpu" and not machine.kernels:
            why = machine.kernels_why
            warnings.warn(f"the sampler's kernels: {why}; sampling runs the reference forward (slower)", stacklevel=3)
        loaded = load_model(model_name, device, torch.float32)
        self.config = loaded.model.config
        plan = make_plan(
            machine,
            device.type,
            precision,
            sampler,
            head_dim(self.config),
            self.config.model_type == "qwen3",
            cuda_bf16,
        )
        memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else machine.memory
        self.plan: ComputePlan = with_training_memory(plan, device.type, memory, step_memory(self.config))
        self.model_name, self.device, self.sampler = model_name, device, sampler.path
        self.dtype = parse_dtype(precision.path)
        self.paths = for_plan(self.plan)  # how the sampler runs its steps
        self.tokenizer = loaded.tokenizer
        use_reduced_precision_matmuls(device, self.plan.products.path)
        self.base = build_causal_lm(loaded.model, torch.float32, device)
        del loaded
        self.eos_id = self.tokenizer.eos_token_id
        self.max_context = int(getattr(self.config, "max_position_embeddings", 4096))
        self._sampler_trees: dict[LoraSpec, CausalLM] = {}
        self._loaded_in_tree: dict[LoraSpec, str] = {}
        # bf16 sampling: the base model with bf16 copies of its products' weights (_sampling_base)
        self._bf16_base: CausalLM | None = None
        self._merged_tree: CausalLM | None = None  # adapters merged into the weights (_merged_tree_for)
        self._merged_own: set[str] = set()  # its modules whose weight is its own (not the base's)
        self._merged_adapted: set[str] = set()  # its modules holding the loaded version's merged weights
        self._merged_key: str | None = None
        # keys/values of sequences sampled before, per weight version (prefix_cache.py)
        self.prefix_cache = PrefixCache(budget_from_env())
        self._work: list[tuple[Callable, LocalFuture]] = []
        self._samples: list[tuple[Snapshot, SampleJob, LocalFuture]] = []
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=f"tinkrl-engine-{model_name}", daemon=True)
        self._thread.start()

    # -- scheduling -----------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> LocalFuture:
        """Run `fn(*args, **kwargs)` on the engine thread after the work submitted before it."""
        fut = LocalFuture()
        with self._cv:
            self._work.append((functools.partial(fn, *args, **kwargs), fut))
            self._cv.notify()
        return fut

    def submit_sample(self, snapshot: Snapshot, job: SampleJob) -> LocalFuture:
        """Sample `job` from `snapshot`'s weights, batched with the requests that arrive with it."""
        fut = LocalFuture()
        self.prefix_cache.watch(snapshot, snapshot.key)  # its prefixes go when its clients do
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
            use_reduced_precision_matmuls(self.device, self.plan.products.path)
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
        # Requests from many rollouts arrive spread over some milliseconds, with short pauses:
        # gather until none has come for SAMPLE_GATHER_GAP_S. A request that misses the batch
        # waits for it to finish and then runs as a batch of its own, nearly as long as the whole.
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
                snap = live[0][0]
                tree = self.sampler_tree(snap)
                prefixes = Prefixes(self.prefix_cache, snap.key) if self.prefix_cache.enabled else None
                jobs = [j for _, j, _ in live]
                sample_batch(tree, self.paths, jobs, self.tokenizer, self.eos_id, self.max_context, prefixes=prefixes)
                for _, j, f in live:
                    f.set_result(j.result)
            except BaseException as e:
                for _, _, f in live:
                    f.set_exception(e)

    # -- model trees ------------------------------------------------------------------------
    def new_tree(self) -> CausalLM:
        """A fresh module tree sharing the base weights (no copy)."""
        tree = copy_tree(self.base)
        tree.lm_head.compute_dtype = self.dtype
        return tree

    def lora_tree(self, spec: LoraSpec, seed: int | None) -> CausalLM:
        """A fresh tree sharing the base weights, with new trainable adapters on this engine's device."""
        return add_lora(self.new_tree(), spec, seed).to(self.device)

    def sampler_tree(self, snap: Snapshot) -> CausalLM:
        """The tree that samples `snap`'s weights: the base model (or its bf16 copy), the merged tree,
        or the config's LoRA tree with `snap`'s adapter loaded (each loaded once per weight version)."""
        bf16 = self.sampler == "bfloat16"
        if snap.lora is None:
            return self._sampling_base() if bf16 else self.base
        if bf16 or self.dtype == torch.float32:
            return self._merged_tree_for(snap)
        tree = self._sampler_trees.get(snap.config)
        if tree is None:
            tree = self._sampler_trees[snap.config] = self.lora_tree(snap.config, 0)
        if self._loaded_in_tree.get(snap.config) != snap.key:
            params = dict(tree.named_parameters())
            with torch.no_grad():
                for name, t in snap.lora.items():
                    params[name].copy_(t)
            self._loaded_in_tree[snap.config] = snap.key
        return tree

    def _sampling_base(self) -> CausalLM:
        """The base model as the sampler runs it: `self.base`, or under bf16 sampling a tree with a bf16
        copy of every projection's weight (made once), whose products then run on bf16 activations."""
        if self.sampler != "bfloat16":
            return self.base
        if self._bf16_base is None:
            self._bf16_base = to_bf16_sampling(self.new_tree())
        return self._bf16_base

    def _merged_tree_for(self, snap: Snapshot) -> CausalLM:
        """A sampling tree with the adapter merged into its own copy of each adapted weight
        (W + scale * B @ A, in fp32, then stored in the sampler's precision), once per weight version.

        A decode step then runs the base model's matrix products only: with the adapter apart,
        LoRA's two extra small products per projection are a large share of a CPU decode step.
        In fp32 the merge is exact to fp32 rounding against the trainer's W x + scale * B (A x),
        and cheap. Under the engine's reduced-precision products (bf16 math mode, TF32) the adapter
        stays apart (`sampler_tree`): a merged weight would round differently from the trainer's W
        and B @ A. bf16 sampling stores the merged weight in bf16, one rounding more of a sampler
        that is already off-policy by its rounding. The tree's q/k/v and gate/up projections are
        fused (`fuse_projections`), so it owns those weights from the start; a bf16 sampler's tree
        owns a bf16 copy of every projection, made from the fp32 base, so a run that never samples
        the base model never holds the bf16 base (`_sampling_base`) beside it.
        """
        tree = self._merged_tree
        if tree is None:
            tree = self._merged_tree = copy_tree(self.base)
            if self.sampler == "bfloat16":  # its own bf16 copy of every projection, not the bf16 base's
                to_bf16_sampling(tree)
                self._merged_own = {n for n, m in tree.named_modules() if isinstance(m, Linear)}
            else:
                self._merged_own = set(fuse_projections(tree))  # own copies from the start; the rest on first merge
        if self._merged_key == snap.key:
            return tree
        modules, fp32_modules = dict(tree.named_modules()), dict(self.base.named_modules())
        scale = snap.config.scale
        adapted = set()
        with torch.no_grad():
            for name, a in snap.lora.items():
                if ".lora_A." not in name:
                    continue
                module = name.split(".lora_A.")[0]
                b = snap.lora[name.replace(".lora_A.", ".lora_B.")]
                if module not in self._merged_own:  # shares the base weight until first adapted
                    modules[module].weight = nn.Parameter(
                        torch.empty_like(fp32_modules[module].weight), requires_grad=False
                    )
                    self._merged_own.add(module)
                weight, w0 = modules[module].weight, fp32_modules[module].weight
                b, a = b.to(self.device), a.to(self.device)
                if weight.dtype == torch.float32:
                    torch.addmm(w0, b, a, alpha=scale, out=weight)
                else:  # merged in fp32, stored rounded
                    weight.copy_(torch.addmm(w0, b, a, alpha=scale))
                adapted.add(module)
            for module in self._merged_adapted - adapted:  # adapted by the previous version's config only
                modules[module].weight.copy_(fp32_modules[module].weight)
        self._merged_key, self._merged_adapted = snap.key, adapted
        return tree


def copy_tree(tree: CausalLM) -> CausalLM:
    """A new module tree sharing every tensor of `tree` (no copy), so some can be replaced apart."""
    with torch.device("meta"):
        new = CausalLM(
            tree.config,
            rotary=None,
            qkv_bias=tree.model.layers[0].self_attn.q_proj.bias is not None,
            mlp_bias=tree.model.layers[0].mlp.gate_proj.bias is not None,
        )
    # a fused tree's q/k/v and gate/up weights are views of its fused ones: the copy shares them
    new.load_state_dict(
        {k: v for k, v in tree.state_dict().items() if ".qkv." not in k and ".gate_up." not in k}, assign=True
    )
    new.rotary = tree.rotary
    new.lm_head.compute_dtype = tree.lm_head.compute_dtype
    new.lm_head._fast_weight = tree.lm_head._fast_weight
    return new.requires_grad_(False)
