"""The engine's default precision, one rule per hardware class, each backed by a measurement.

The sampler's and the trainer's logprobs for the same weights and tokens must agree, so a faster
precision becomes a class's default only where it is measured to be faster *and* keeps that
agreement within `AGREEMENT_BOUND` (max |dlogprob| between `sample()` and `forward()` on the same
tokens), or is shown to learn equally well. Every CPU class measured so far computes in fp32; the
sampler of CPUs with AMX, and of Intel's with AVX512-BF16 alone, samples in bf16, shown to learn as
well (docs/engine.md, "Precision policy" and "Sampler precision", has the figures behind each
entry). `TINKRL_DTYPE` or an explicit precision overrides the rule. No torch here: the rule is
read by plans and docs too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Literal, TypeVar

# The largest sampler/trainer disagreement (max |dlogprob|) a default precision may have.
AGREEMENT_BOUND = 2e-2

CpuClass = Literal["amx_bf16", "avx512_bf16", "other"]
CpuVendor = Literal["amd", "intel", "other"]
# The sampler's classes: the CPU classes, with Intel's AVX512-BF16 without AMX (a Cooper Lake Xeon,
# or a newer Xeon whose VM does not lend AMX) apart from AMD's, because bf16 sampling runs there at
# another speed (its bf16 dot products no faster than fp32 FMAs) and was measured there on its own.
SamplerClass = Literal["amx_bf16", "avx512_bf16_intel", "avx512_bf16", "other"]
Precision = Literal["float32", "bfloat16"]
# How the sampler computes: "matched" runs the trainer's own arithmetic (their logprobs agree);
# "bfloat16" keeps bf16 copies of the weights and multiplies bf16 activations by them (fp32 residual
# stream, norms, attention and logits), faster where the CPU has bf16 instructions, and off-policy by
# the rounding: the losses' importance ratio corrects for it, and each step reports the mismatch.
SamplerPrecision = Literal["matched", "bfloat16"]


P = TypeVar("P", Precision, SamplerPrecision)


@dataclass(frozen=True)
class Rule(Generic[P]):
    """A hardware class's default (compute or sampler precision) and the measurement it rests on."""

    precision: P
    measured: str


PrecisionRule = Rule[Precision]
SamplerRule = Rule[SamplerPrecision]


CPU_RULES: dict[CpuClass, PrecisionRule] = {
    "amx_bf16": PrecisionRule(
        "float32",
        "Intel Xeon with AMX, 2 cores, SmolLM2-135M: the bf16 math mode gave no speed gain (make train 3.58 vs "
        "3.51 s/step in fp32) and sampler/trainer max |dlogprob| 5.3e-2 (fp32: 1.5e-5), over the bound; make train "
        "in fp32 from cold caches reached 0.86 held-out, every step's max |dlogprob| <= 1.8e-4",
    ),
    "avx512_bf16": PrecisionRule(
        "float32",
        "AMD EPYC Zen 4, AVX512-BF16 without AMX: oneDNN keeps fp32 kernels under the bf16 math mode, so bf16 "
        "computes fp32 at fp32 speed; fp32 agreement max |dlogprob| ~5e-5 on SmolLM2",
    ),
    "other": PrecisionRule("float32", "no bf16 matrix instructions: bf16 products would be emulated"),
}
# CUDA with bf16 support multiplies in TF32 under the bfloat16 setting (fp32 activations and logits).
CUDA_RULE = PrecisionRule(
    "bfloat16", "H100: TF32 products with fp32 activations; tests/test_agreement.py bounds bf16 by 2e-2"
)
CUDA_NO_BF16_RULE = PrecisionRule("float32", "a GPU without bf16 support")


CPU_SAMPLER_RULES: dict[SamplerClass, SamplerRule] = {
    "amx_bf16": SamplerRule(
        "bfloat16",
        "Intel Xeon with AMX, 2 cores, SmolLM2: bf16 sampling (products and the head in AMX tiles) samples 2.0-3.3x "
        "faster than matched; make train with it ran 164 and 175 steps to 0.92 and 0.91 held-out, matched 92 and "
        "122 steps to 0.84 and 0.84, with per-step max |dlogprob| median 0.20 that the importance ratio corrects",
    ),
    "avx512_bf16_intel": SamplerRule(
        "bfloat16",
        "Intel Xeon with AVX512-BF16 and no AMX, 2 cores, SmolLM2: bf16 sampling (its dot products summed in fp32 "
        "FMAs) samples 1.2-1.7x faster than matched; make train with it ran 175 and 167 steps to 0.93 and 0.94 "
        "held-out, matched 166 and 167 steps to 0.93 and 0.93, with per-step max |dlogprob| median 0.19-0.20 that "
        "the importance ratio corrects",
    ),
    "avx512_bf16": SamplerRule(
        "matched",
        "AMD EPYC Zen 4, 2 cores, SmolLM2: bf16 sampling decodes 1.2-1.5x faster but is off-policy by mean |dlogprob| "
        "1.3e-2, max 0.28; make train with it ran 103 steps to 0.86 held-out, matched 129 steps to 0.90",
    ),
    "other": SamplerRule("matched", "no bf16 matrix instructions: bf16 products would be emulated"),
}
CUDA_SAMPLER_RULE = SamplerRule("matched", "the trainer's TF32 products are already fast on GPUs")


VENDORS: dict[str, CpuVendor] = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}


def cpu_class_of(flags: frozenset[str] | set[str]) -> CpuClass:
    """The CPU class of a set of /proc/cpuinfo flags: AMX tiles with bf16, AVX512-BF16 alone, or neither."""
    if "amx_bf16" in flags:
        return "amx_bf16"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    return "other"


def sampler_class_of(cls: CpuClass, vendor: CpuVendor) -> SamplerClass:
    """The sampler's class of a CPU class on a vendor's CPU: the CPU class, with Intel's AVX512-BF16
    apart from the others'."""
    return "avx512_bf16_intel" if cls == "avx512_bf16" and vendor == "intel" else cls


def vendor_of(vendor_id: str) -> CpuVendor:
    """`amd`, `intel` or `other`, from /proc/cpuinfo's `vendor_id`."""
    return VENDORS.get(vendor_id.strip(), "other")


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


def cpu_flags() -> frozenset[str]:
    """This machine's CPU flags from /proc/cpuinfo (empty where there is none)."""
    return frozenset(cpuinfo().get("flags", "").split())


def cpu_vendor() -> CpuVendor:
    """This machine's CPU vendor, from /proc/cpuinfo's `vendor_id` ("other" where it names neither)."""
    return vendor_of(cpuinfo().get("vendor_id", ""))


def cpu_class() -> CpuClass:
    """This machine's CPU class (see `cpu_class_of`)."""
    return cpu_class_of(cpu_flags())


def sampler_class() -> SamplerClass:
    """This machine's sampler class (see `sampler_class_of`)."""
    return sampler_class_of(cpu_class(), cpu_vendor())


def default_rule(device_type: str, cuda_bf16: bool = False) -> PrecisionRule:
    """The rule that picks the default precision for a device type ("cpu", "cuda") on this machine."""
    if device_type == "cuda":
        return CUDA_RULE if cuda_bf16 else CUDA_NO_BF16_RULE
    return CPU_RULES[cpu_class()]


def default_sampler_rule(device_type: str) -> SamplerRule:
    """The rule that picks the default sampler precision for a device type on this machine."""
    if device_type == "cuda":
        return CUDA_SAMPLER_RULE
    return CPU_SAMPLER_RULES[sampler_class()]
