"""How the embedded engine computes on this machine: one probe, the per-class rules, one plan.

An engine decides once, when it starts, how it computes: the device, the trainer's precision, the
sampler's precision, and which path each part of a sampler's decode and prefill step takes (the
reference forward of `transformer.py`, or one of the fast paths of `kernels/`), each with a
one-sentence reason. The plan is made from one probe of the machine (`probe`: the CPU's vendor and
flags, as far as the libraries may use them, and which C kernels are built here) and the rules of
its hardware class below; nothing asks the hardware again later. It is printed in a run's first
lines, recorded in `run.json`, and reported by `tinkrl serve tinker`.

A rule's default rests on a measurement (docs/performance.md holds the figures; docs/engine.md
explains the paths). No torch here: plans and docs read the rules too.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, get_args

from tinkrl.errors import TinkrlError
from tinkrl.local.kernels import library
from tinkrl.local.memory import TRAIN_SHARE, StepMemory, machine_memory

# The largest sampler/trainer disagreement (max |dlogprob|) a default precision may have.
AGREEMENT_BOUND = 2e-2

CpuClass = Literal["amx_bf16", "avx512_bf16", "other"]
CpuVendor = Literal["amd", "intel", "other"]
# The sampler's classes: the CPU classes, with Intel's AVX512-BF16 without AMX apart from AMD's,
# because bf16 sampling runs there at another speed and was measured there on its own.
SamplerClass = Literal["amx_bf16", "avx512_bf16_intel", "avx512_bf16", "other"]
Precision = Literal["float32", "bfloat16"]
# "matched" samples with the trainer's own arithmetic (their logprobs agree); "bfloat16" keeps bf16
# copies of the weights and multiplies bf16 activations by them: faster where the CPU has bf16
# instructions, off-policy by the rounding, which the losses' importance ratio corrects.
SamplerPrecision = Literal["matched", "bfloat16"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
SAMPLER_PRECISIONS: tuple[SamplerPrecision, ...] = get_args(SamplerPrecision)


@dataclass(frozen=True)
class Rule:
    """A hardware class's default (a precision or a sampler precision) and, in one sentence with a
    pointer to the docs, the measurement it rests on."""

    precision: str
    measured: str


_TRAIN = "docs/performance.md, `make train`"  # where the figures behind the rules are
_PATHS = 'docs/performance.md, "Sampler paths"'
CPU_RULES: dict[CpuClass, Rule] = {
    "amx_bf16": Rule(
        "float32", "the bf16 math mode gained no speed and broke the agreement bound (docs/engine.md, Precision)"
    ),
    "avx512_bf16": Rule("float32", "oneDNN keeps fp32 kernels under the bf16 math mode without AMX (docs/engine.md)"),
    "other": Rule("float32", "no bf16 matrix instructions"),
}
CUDA_RULE = Rule("bfloat16", "TF32 products with fp32 activations stay within the agreement bound")
CUDA_NO_BF16_RULE = Rule("float32", "a GPU without bf16 support")
CPU_SAMPLER_RULES: dict[SamplerClass, Rule] = {
    "amx_bf16": Rule("bfloat16", f"bf16 sampling in AMX tiles learned as well as matched, in more steps ({_TRAIN})"),
    "avx512_bf16_intel": Rule(
        "bfloat16", f"bf16 sampling in dot products learned as well as matched, in more steps ({_TRAIN})"
    ),
    "avx512_bf16": Rule("matched", "bf16 sampling learned less than matched in the same budget (docs/runs.md)"),
    "other": Rule("matched", "no bf16 products faster than fp32 here"),
}
CUDA_SAMPLER_RULE = Rule("matched", "the trainer's TF32 products are already fast on GPUs")

# Where the bf16 sampler's products of a decode step run in the kernels, up to how many rows (beyond,
# oneDNN's product is as fast or faster; docs/performance.md, "Sampler paths").
AMX_PRODUCT_ROWS = 32
AMX_LAYER_ROWS = 128  # a decode step's layers in one call on AMX, up to this many rows
AMX_HEAD_ROWS = 8  # the head in AMX tiles from this many rows on (fewer: dot products)
DOT_PRODUCT_ROWS = {"dpbf16": 64, "fma": 1024}
# How dot products multiply, by vendor: VDPBF16PS, or fp32 FMAs of the widened values (the same sums);
# Intel's Xeons run two FMAs faster than one bf16 dot product, AMD's Zen 4 the other way round.
DOTS_BY_VENDOR: dict[CpuVendor, str] = {"intel": "fma", "amd": "dpbf16", "other": "dpbf16"}
_LANES = 16  # the kernels' vector width in floats: a head_dim they read is a multiple of it
_BF16_KERNELS = ("head_bf16", "linear_bf16", "decode_layer_bf16")  # built where the CPU has AVX512-BF16
_KERNELS = ("rope_decode_attention", "rms_norm", "silu_mul", *_BF16_KERNELS)

_VENDORS: dict[str, CpuVendor] = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}
# ONEDNN_MAX_CPU_ISA's names below AVX-512, and below AVX512-BF16 or AMX: what each cap takes away.
_AVX2_CAPS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2")
_AVX512_CAPS = ("AVX512_CORE", "AVX512_CORE_VNNI")
_NO_AMX_CAPS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512")


def vendor_of(vendor_id: str) -> CpuVendor:
    """`amd`, `intel` or `other`, from /proc/cpuinfo's `vendor_id`."""
    return _VENDORS.get(vendor_id.strip(), "other")


@functools.cache
def cpuinfo() -> dict[str, str]:
    """This machine's first CPU's fields in /proc/cpuinfo ("model name", "vendor_id", "flags", ...;
    empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def usable_flags(flags: frozenset[str], cap: str) -> tuple[frozenset[str], tuple[str, ...]]:
    """The CPU flags the libraries may use under `ONEDNN_MAX_CPU_ISA=cap` ("" for none), and the compiler
    flags that build the kernels for that instruction set (alternatives, the first one taken)."""
    cap = cap.upper()
    drop: tuple[str, ...] = ()
    if cap in _AVX2_CAPS:
        drop, isa = ("avx512", "amx", "avx_ne_convert"), ("-march=x86-64-v3" if cap.startswith("AVX2") else "",)
    elif cap in _AVX512_CAPS:
        drop, isa = ("avx512_bf16", "amx"), ("-march=native -mno-avx512bf16 -mno-amx-tile -mno-amx-bf16",)
    elif cap in _NO_AMX_CAPS:
        drop, isa = ("amx",), ("-march=native -mno-amx-tile -mno-amx-bf16",)
    else:
        isa = ("-march=native", "-mcpu=native")
    return frozenset(f for f in flags if not f.startswith(drop)), isa


@dataclass(frozen=True)
class Machine:
    """What this machine can do, as the plan sees it: the CPU's vendor and flags (those the libraries
    may use: `ONEDNN_MAX_CPU_ISA` caps them, and the kernels are built for the same instruction set),
    the C kernels built here, and whether Linux lent this process AMX tiles."""

    vendor: CpuVendor
    flags: frozenset[str]
    kernels: frozenset[str]  # the C functions built for this CPU (none without a compiler)
    kernels_why: str  # why there are none, where there are none
    amx_lent: bool
    isa: tuple[str, ...] = ("-march=native", "-mcpu=native")
    memory: int = 0  # bytes this process may use (MemTotal, capped by a cgroup limit); 0: unknown

    @property
    def cpu_class(self) -> CpuClass:
        """AMX tiles with bf16, AVX512-BF16 alone, or neither."""
        return cpu_class_of(self.flags)

    @property
    def sampler_class(self) -> SamplerClass:
        return sampler_class_of(self.cpu_class, self.vendor)

    @property
    def onednn_bf16(self) -> bool:
        return onednn_bf16(self.flags)


def cpu_class_of(flags: frozenset[str] | set[str]) -> CpuClass:
    """The CPU class of a set of /proc/cpuinfo flags: AMX tiles with bf16, AVX512-BF16 alone, or neither."""
    if "amx_bf16" in flags:
        return "amx_bf16"
    return "avx512_bf16" if "avx512_bf16" in flags else "other"


def sampler_class_of(cls: CpuClass, vendor: CpuVendor) -> SamplerClass:
    """The sampler's class of a CPU class on a vendor's CPU: Intel's AVX512-BF16 apart from the others'."""
    return "avx512_bf16_intel" if cls == "avx512_bf16" and vendor == "intel" else cls


@functools.cache
def cpu() -> tuple[CpuVendor, frozenset[str], tuple[str, ...]]:
    """This CPU's vendor, the flags the libraries may use (`ONEDNN_MAX_CPU_ISA` caps them), and the
    compiler flags that build the kernels for them; from /proc/cpuinfo, read once."""
    info = cpuinfo()
    flags, isa = usable_flags(frozenset(info.get("flags", "").split()), os.environ.get("ONEDNN_MAX_CPU_ISA", ""))
    if platform.machine().lower() not in ("x86_64", "amd64"):
        isa = ("-mcpu=native", "-march=native")
    return vendor_of(info.get("vendor_id", "")), flags, isa


def onednn_bf16(flags: frozenset[str]) -> bool:
    """Whether oneDNN multiplies bf16 on a CPU with these flags (torch refuses its bf16 path without)."""
    return {"avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags


_machine: Machine | None = None  # what `probe` read (the tests' `fake_cpu` puts another CPU here)


def probe() -> Machine:
    """This machine, read once: `cpu()`, and the kernels built for it (compiled now when not yet): the
    bf16 products only where the flags have AVX512-BF16, AMX tiles only where they have AMX."""
    global _machine
    if _machine is None:
        vendor, flags, isa = cpu()
        lib, why = library.load(isa)
        bf16 = "avx512_bf16" in flags
        kernels = frozenset(n for n in _KERNELS if library.has(lib, n) and (bf16 or n not in _BF16_KERNELS))
        amx = "amx_bf16" in flags and library.has(lib, "amx_lent") and bool(lib.amx_lent())
        _machine = Machine(vendor, flags, kernels, why, amx, isa, machine_memory())
    return _machine


def parse_precision(name: str) -> Precision:
    """A precision name (float32/fp32, bfloat16/bf16), checked."""
    name = {"fp32": "float32", "bf16": "bfloat16"}.get(name, name)
    if name not in PRECISIONS:  # checked up front: passed through, it would fail deep in the head
        raise TinkrlError(f"dtype {name!r} is not supported; use float32 or bfloat16")
    return name  # type: ignore[return-value]


def parse_sampler_precision(name: str) -> SamplerPrecision:
    """A sampler precision name ("matched", "bfloat16"/"bf16"), checked."""
    name = {"bf16": "bfloat16"}.get(name, name)
    if name not in SAMPLER_PRECISIONS:
        raise TinkrlError(f"sampler precision {name!r} is not supported; use {' or '.join(SAMPLER_PRECISIONS)}")
    return name  # type: ignore[return-value]


def default_rule(machine: Machine, device_type: str, cuda_bf16: bool = False) -> Rule:
    """The rule that picks the default precision for a device type on `machine`."""
    if device_type == "cuda":
        return CUDA_RULE if cuda_bf16 else CUDA_NO_BF16_RULE
    return CPU_RULES[machine.cpu_class]


def default_sampler_rule(machine: Machine, device_type: str) -> Rule:
    """The rule that picks the default sampler precision for a device type on `machine`. On Intel's
    AVX512-BF16 the rule's bf16 rests on the kernels' dot products: without them, `matched`."""
    if device_type == "cuda":
        return CUDA_SAMPLER_RULE
    rule = CPU_SAMPLER_RULES[machine.sampler_class]
    if rule.precision == "bfloat16" and machine.cpu_class != "amx_bf16" and "linear_bf16" not in machine.kernels:
        return Rule(
            "matched", f"the kernels' dot products are not built here ({machine.kernels_why or 'no AVX512-BF16'})"
        )
    return rule


def resolve_precision(machine: Machine, device_type: str, asked: str | None, cuda_bf16: bool = False) -> Choice:
    """The trainer's precision: as asked, else `$TINKRL_DTYPE`, else the class's rule."""
    asked = asked or os.environ.get("TINKRL_DTYPE")
    if asked:
        return Choice(parse_precision(asked), "as asked")
    rule = default_rule(machine, device_type, cuda_bf16)
    return Choice(rule.precision, rule.measured)


def resolve_sampler(machine: Machine, device_type: str, asked: str | None) -> Choice:
    """The sampler's precision: as asked, else `$TINKRL_SAMPLER_PRECISION`, else the class's rule."""
    asked = asked or os.environ.get("TINKRL_SAMPLER_PRECISION")
    if asked:
        return Choice(parse_sampler_precision(asked), "as asked")
    rule = default_sampler_rule(machine, device_type)
    return Choice(rule.precision, rule.measured)


@dataclass(frozen=True)
class Choice:
    """One decision of the plan: the path taken, and why, in one sentence."""

    path: str
    why: str


@dataclass(frozen=True)
class ComputePlan:
    """How an engine computes (see the module docstring). `projections` and `logits` are the bf16
    sampler's (a matched sampler multiplies as the trainer does); the row limits say up to how many
    rows a decode step's products (`product_rows`) and whole layers (`one_call_rows`) run in the
    kernels, and `dots` how their dot products multiply."""

    device: str
    cpu: str
    precision: Choice
    products: Choice
    sampler: Choice
    cache: Choice
    decode: Choice
    prefill: Choice
    projections: Choice
    logits: Choice
    product_rows: int = 0
    one_call_rows: int = 0
    dots: str = "dpbf16"
    recompute: Choice = Choice("never", "no model's training memory given")
    recompute_tokens: int = 0  # training micro-batches over this many tokens recompute their layers; 0: never
    recompute_row: int = 0  # so does one whose longest row (an episode, not a pack of short ones) is longer; 0: never
    train_tokens: int = 0  # the most tokens one training micro-batch may have here; 0: no limit known

    def line(self) -> str:
        """The plan in one line, for a run's first lines."""
        parts = [f"decode {self.decode.path}", f"prefill {self.prefill.path}", f"KV cache {self.cache.path}"]
        if self.sampler.path == "bfloat16":
            parts += [f"projections {self.projections.path}", f"logits {self.logits.path}"]
        cpu = f", {self.cpu}" if self.cpu else ""
        training = f", layers recomputed {self.recompute.path}" if self.recompute_tokens or self.recompute_row else ""
        return (
            f"{self.device}{cpu}, {self.precision.path} with {self.products.path} products{training}; sampling: "
            f"{', '.join(parts)}, sampler {self.sampler.path}"
        )

    def as_dict(self) -> dict:
        """The plan as JSON-able data, every decision with its reason, and its `line`."""
        return {**asdict(self), "line": self.line()}


def make_plan(
    machine: Machine,
    device_type: str,
    precision: Choice,
    sampler: Choice,
    head_dim: int,
    qk_norm: bool = False,
    cuda_bf16: bool = False,
) -> ComputePlan:
    """The plan for an engine on `device_type` ("cpu", "cuda") of `machine`, with the trainer's and the
    sampler's precisions as resolved (`resolve_precision`, `resolve_sampler`), for a model whose heads
    are `head_dim` wide (and, with `qk_norm`, normalise q and k, as Qwen3's do)."""
    same = Choice("reference", "the trainer's own forward")
    if device_type != "cpu":
        products = Choice("tf32" if precision.path == "bfloat16" and cuda_bf16 else "fp32", "the trainer's products")
        graph = Choice("cuda graph", "a small model's decode step launches more kernels than it runs")
        return ComputePlan(device_type, "", precision, products, sampler, Choice("float32", same.why), graph, same,
                           same, same)  # fmt: skip
    cpu = f"{machine.vendor} {machine.cpu_class}"
    bf16 = sampler.path == "bfloat16"
    if precision.path == "bfloat16" and machine.cpu_class == "amx_bf16":
        products = Choice("bf16 math mode", "oneDNN multiplies fp32 tensors in bf16 with AMX")
    elif precision.path == "bfloat16":
        products = Choice("fp32", "without AMX oneDNN multiplies fp32 under the bf16 math mode, so it stays off")
    else:
        products = Choice("fp32", "the precision")
    fallback = "oneDNN's bf16 product" if machine.onednn_bf16 else "torch's bf16 product (oneDNN has no bf16 here)"
    products_fallback = Choice("onednn bf16" if machine.onednn_bf16 else "torch bf16", fallback)
    kernels = {"rope_decode_attention", "rms_norm", "silu_mul"} <= machine.kernels
    if not kernels or head_dim % _LANES or "avx512f" not in machine.flags:
        why = machine.kernels_why if not kernels else f"head_dim {head_dim} is not a multiple of {_LANES}"
        if kernels and "avx512f" not in machine.flags:  # the kernels pay only where they were measured to
            why = f"without AVX-512 the kernels ran slower than the reference ({_PATHS})"
        return ComputePlan(device_type, cpu, precision, products, sampler, Choice("float32", why),
                           Choice("reference", why), same, products_fallback if bf16 else same,
                           Choice("fp32", why))  # fmt: skip
    decode = Choice("kernels", "the work between a decode step's products in the kernels, in few calls")
    cache = Choice("float32", "the trainer's arithmetic")
    if not bf16:
        return ComputePlan(device_type, cpu, precision, products, sampler, cache, decode, same, same, same)
    cache = Choice("bfloat16", "half the bytes a decode step's attention reads, in a sampler off-policy anyway")
    if machine.vendor == "intel" and "linear_bf16" in machine.kernels:
        prefill = Choice("kernels", "the norms and SiLU in the kernels feed bf16 products without fp32 copies")
    else:  # on AMD's EPYC the kernels' prefill paid nothing measurable
        prefill = Choice("reference", f"the kernels' prefill pays only on Intel's CPUs ({_PATHS})")
    dots = DOTS_BY_VENDOR[machine.vendor]
    if machine.amx_lent and "linear_bf16" in machine.kernels:
        rows, layer_rows = AMX_PRODUCT_ROWS, AMX_LAYER_ROWS
        projections = Choice("amx", f"AMX tiles up to {rows} rows read the weights faster; above, {fallback}")
        logits = Choice("amx", f"AMX tiles from {AMX_HEAD_ROWS} rows, dot products below, fp32 sums")
    elif "linear_bf16" in machine.kernels:
        rows = layer_rows = DOT_PRODUCT_ROWS[dots]
        projections = Choice(f"dots {dots}", f"dot products up to {rows} rows beat oneDNN here; above, {fallback}")
        logits = Choice(f"dots {dots}", "bf16 products summed in fp32: fp32 logits at bf16 speed")
    else:
        rows = layer_rows = 0
        why = "no bf16 dot products (AVX512-BF16) here"
        projections = Choice("onednn bf16" if machine.onednn_bf16 else "torch bf16", f"{why}: {fallback}")
        logits = Choice("fp32", why)
    if qk_norm or not layer_rows:
        layer_rows = 0  # Qwen3's q/k norms are not in the one call
    else:
        decode = Choice("one call", f"each layer in one kernel call up to {layer_rows} rows, op by op above")
    return ComputePlan(device_type, cpu, precision, products, sampler, cache, decode, prefill, projections, logits,
                       rows, layer_rows, dots)  # fmt: skip


# The trainer's padded tokens per micro-batch, by device: on CPU the measured best (larger ran slower,
# smaller no faster); on CUDA launches bound a small model's step, so its micro-batches are larger.
MICROBATCH_TOKENS = {"cpu": 2048, "cuda": 8192}
# A row longer than this (one long episode, rather than a pack of short ones) recomputes its layers:
# kept, its activations cost several times the memory per token the recomputed backward needs, while a
# micro-batch of short packed rows stays bounded by MICROBATCH_TOKENS and keeps its speed.
LONG_ROW_TOKENS = {"cpu": 512, "cuda": 4096}


def with_training_memory(plan: ComputePlan, device_type: str, memory: int, step: StepMemory) -> ComputePlan:
    """`plan` with its training limits for a model whose step needs `step` (`memory.step_memory`) on a
    device of `memory` bytes (0: unknown): a micro-batch with a row over `recompute_row` tokens (a long
    episode), or over `recompute_tokens` tokens in all (longer than the trainer packs, or than this memory
    keeps every layer's activations for), recomputes its layers in the backward; `train_tokens`, the
    longest micro-batch that fits even so, bounds a datum."""
    packed = MICROBATCH_TOKENS.get(device_type, MICROBATCH_TOKENS["cuda"])
    row = LONG_ROW_TOKENS.get(device_type, LONG_ROW_TOKENS["cuda"])
    budget = max(0.0, TRAIN_SHARE * memory - step.weights)
    keep = int(budget // step.kept_per_token) if memory else packed
    fits = int(budget // step.recomputed_per_token) if memory else 0
    if keep >= packed:
        threshold = packed
        path = f"for rows over {row} tokens"
        why = "a long episode's activations kept would cost several times the memory per token of recomputing them"
    else:
        threshold = max(1, keep)
        row = min(row, threshold)
        path = f"for rows over {row} tokens or micro-batches over {threshold}"
        why = "beyond it every layer's activations would pass this machine's memory for training"
    return dataclasses.replace(
        plan, recompute=Choice(path, why), recompute_tokens=threshold, recompute_row=row, train_tokens=fits
    )
