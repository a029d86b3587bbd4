"""How much a LoRA training step may hold: the machine's memory and a step's bytes per token.

The compute plan (`compute_plan.py`) turns these into two limits: above how many tokens a training
micro-batch recomputes its layers in the backward (activation checkpointing: each layer keeps only
its input), and how many tokens one micro-batch may have at all. A datum longer than that is one
clear error before any work, never the kernel's OOM kill. The estimates count fp32 values per token
of the tensors autograd keeps (layer by layer, from the model's config) with a margin for the
allocator and temporaries; tests/test_training_memory.py holds them above what a step measures.
No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FP32 = 4
MARGIN = 2  # the allocator's slack and the short-lived temporaries beside what autograd keeps
TRAIN_SHARE = 0.6  # of the machine's memory, what training micro-batches may use (the rest: weights, sampler)


@dataclass(frozen=True)
class StepMemory:
    """A model's training memory: bytes per token with every layer's activations kept, with layers
    recomputed, and the bytes of its weights (the base tree, and a sampler's copy of its projections)."""

    kept_per_token: int
    recomputed_per_token: int
    weights: int


def _layer_values(cfg) -> int:
    """fp32 values per token one decoder layer keeps for its backward: its norms' inputs and outputs,
    q/k/v before and after RoPE, the attention output, and the MLP's gate, up, SiLU and product."""
    q, kv = _widths(cfg)
    return 5 * cfg.hidden_size + 3 * q + 3 * kv + 4 * cfg.intermediate_size


def step_memory(cfg) -> StepMemory:
    """The estimate for a model config (a transformers `PretrainedConfig` or alike)."""
    layers, h, f, layer = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, _layer_values(cfg)
    ends = 6 * h  # the embeddings, the final norm and the hidden states the head reads, with their gradients
    kept = (layers * layer + ends) * FP32 * MARGIN
    recomputed = (layers * h + 2 * layer + ends) * FP32 * MARGIN  # inputs kept, one layer (and its grads) live
    q, kv = _widths(cfg)
    projections = layers * (3 * h * f + 2 * h * q + 2 * h * kv)
    params = projections + cfg.vocab_size * h * (1 if getattr(cfg, "tie_word_embeddings", False) else 2)
    return StepMemory(kept, recomputed, (params + projections) * FP32)  # the sampler's copy at most fp32


def _widths(cfg) -> tuple[int, int]:
    """The widths of a layer's queries and of its keys (and values)."""
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd


def machine_memory() -> int:
    """Bytes of memory this process may use: /proc/meminfo's MemTotal, capped by a cgroup limit (0 where
    neither can be read)."""
    total = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            value = Path(limit).read_text().strip()
        except OSError:
            continue
        if value.isdigit() and 0 < int(value) < (total or int(value) + 1):
            total = int(value)
    return total
