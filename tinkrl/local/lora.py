"""Tinker's LoRA on the engine's module tree: which modules adapt, the scale, the adapters themselves.

peft injects the adapters into our transformer tree, whose module names mirror transformers',
so a saved adapter loads into `transformers` + `peft` unchanged. Adapter weights, and so their
Adam state, are fp32 whatever the engine's precision. The unembedding's adapter runs through
`lora_head_forward` instead of peft's own forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MethodType

import torch
import torch.nn.functional as F

from tinkrl.errors import TinkrlError
from tinkrl.local.transformer import CausalLM

LORA_ALPHA = 32  # scaling = alpha / rank, as in Tinker: the best learning rate barely moves with rank
ATTN_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP_MODULES = ["gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class LoraSpec:
    """What shapes an adapter: Tinker's LoRA settings less the seed, which only initialises it."""

    rank: int
    train_mlp: bool
    train_attn: bool
    train_unembed: bool

    @classmethod
    def from_meta(cls, lora: dict) -> LoraSpec:
        """The spec recorded under a checkpoint's `tinkrl_meta.json` "lora" key."""
        return cls(lora["rank"], lora["train_mlp"], lora["train_attn"], lora["train_unembed"])

    @property
    def scale(self) -> float:
        """The factor on B @ A."""
        return LORA_ALPHA / self.rank

    def targets(self) -> list[str]:
        """Names of the modules that get an adapter (peft's `target_modules`)."""
        return (
            (ATTN_MODULES if self.train_attn else [])
            + (MLP_MODULES if self.train_mlp else [])
            + (["lm_head"] if self.train_unembed else [])
        )


def add_lora(tree: CausalLM, spec: LoraSpec, seed: int | None) -> CausalLM:
    """Inject `spec`'s adapters into `tree`, initialised from `seed`; only the adapters train."""
    from peft import LoraConfig, inject_adapter_in_model

    targets = spec.targets()
    if not targets:
        raise TinkrlError("LoRA needs at least one of train_attn, train_mlp, train_unembed")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0 if seed is None else seed)
        inject_adapter_in_model(
            LoraConfig(r=spec.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=targets), tree
        )
    for name, p in tree.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()  # adapters and their optimizer state stay fp32
        p.requires_grad_("lora_" in name)
    if spec.train_unembed:
        tree.lm_head.forward = MethodType(lora_head_forward, tree.lm_head)
    return tree


def lora_head_forward(self, x: torch.Tensor) -> torch.Tensor:
    """peft's LoRA forward for the unembedding, without its vocabulary-sized temporaries.

    peft computes `base + lora_B(lora_A(x)) * scaling`: three passes over [tokens, vocab]
    (49k wide for SmolLM2) forward and more backward. The same sum as one fused `addmm` into
    the base logits, scaling applied on the rank-wide side.
    Bound to peft's `lora.Linear` around `lm_head` (`self`); honours disabled/merged adapters.
    """
    result = self.base_layer(x)
    if self.disable_adapters or self.merged:
        return result
    flat = result.reshape(-1, result.shape[-1])
    for name in self.active_adapters:
        if name not in self.lora_A:
            continue
        a, b = self.lora_A[name].weight, self.lora_B[name].weight
        xa = F.linear(x.reshape(-1, x.shape[-1]).to(a.dtype), a) * self.scaling[name]
        flat = torch.addmm(flat, xa, b.t())
    return flat.reshape(result.shape)
