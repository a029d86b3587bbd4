"""The sampler's paths through a model: the reference forward, or the CPU kernels, as the plan says.

One interface serves the sampler (`sampler.py`): `prefill` and `decode` (one new token per row) run
the model over a KV cache and return hidden states, `logits` turns them into fp32 logits, and the
kernels' layer-level pieces (`decode_layer`, `prefill_layer`, `project`) make those up. `Reference`
is `transformer.py`'s forward itself, the trainer's arithmetic (CUDA, where its decode steps replay
as CUDA graphs, and wherever the kernels are not built). `CpuKernels` runs a decode step's work
between its matrix products in the C kernels (4 calls a layer instead of ~40 small torch ops), and
for the bf16 sampler also its projections of few rows and its head in bf16 products with fp32 sums,
its layers in one call each, and its prefill's norms and SiLU. Each path is held to the reference by
a test (tests/test_kernels.py, tests/test_sampler_precision.py); `for_plan` picks one.
"""

from __future__ import annotations

import torch
from torch import nn

from tinkrl.local.compute_plan import AMX_HEAD_ROWS, ComputePlan
from tinkrl.local.kernels.ops import (
    LayerWeights,
    decode_layer_bf16,
    decode_step,
    head_bf16,
    linear_bf16,
    pack,
    rms_norm,
    rope_decode_attention,
    silu_mul,
)
from tinkrl.local.transformer import CausalLM, DecoderLayer, KVCache, Linear, frozen_linear, kept_on


class Reference:
    """The sampler's steps as `transformer.py` computes them: the trainer's own forward."""

    kv_dtype = torch.float32
    rows_in_place = False  # whether a KV cache keeps a batch's rows where they lie (`KVCache.keep`)

    def __init__(self, plan: ComputePlan):
        self.plan = plan

    def prefill(self, lm: CausalLM, ids, positions, mask, cache: KVCache, pos: int) -> torch.Tensor:
        """Hidden states [B, T, d] of `ids` [B, T] written into `cache` from position `pos` on."""
        return lm(ids, positions, mask, cache, pos)

    def decode(self, lm: CausalLM, ids, positions, mask, cache: KVCache, pos: int) -> torch.Tensor:
        """`prefill` of one new token per row ([B, 1]) at position `pos`."""
        return lm(ids, positions, mask, cache, pos)

    def logits(self, lm: CausalLM, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits of hidden states."""
        return lm.logits(hidden)


def packed(weight: torch.Tensor) -> torch.Tensor:
    """`pack(weight)`, kept on the weight (remade when it is rewritten in place, as a merge does)."""
    return kept_on(weight, "_tinkrl_packed_bf16", pack)


def _multiplies_in(module: nn.Module) -> torch.dtype:
    """The dtype a projection wants its input in: a frozen `Linear`'s weight dtype; fp32 for others (LoRA)."""
    return module.weight.dtype if type(module) is Linear else torch.float32


_WAYS = {"amx": "amx", "dots dpbf16": "dpbf16", "dots fma": "fma"}  # a plan's path: the kernels' way


class CpuKernels(Reference):
    """A CPU sampler's steps in the C kernels (see the module docstring), as `plan` sets them up."""

    rows_in_place = True

    def __init__(self, plan: ComputePlan):
        super().__init__(plan)
        self.kv_dtype = torch.bfloat16 if plan.cache.path == "bfloat16" else torch.float32
        self.products = _WAYS.get(plan.projections.path)  # how bf16 products multiply in the kernels, or None
        self.head = _WAYS.get(plan.logits.path)

    def project(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """A projection of the kernels' output `x` (fp32 or bf16), in its weight's dtype (the kernels read
        either, so no fp32 copy): a bf16 weight's product of up to `plan.product_rows` rows in the
        kernels (without autograd), others the reference's; a LoRA module (adapter apart) is its own
        forward, in fp32."""
        if type(module) is not Linear:
            return module(x)
        w = module.weight
        bias = None if module.bias is None else module.bias.to(w.dtype)
        x = x.to(w.dtype)
        rows = x.numel() // x.shape[-1]
        if (
            w.dtype == torch.bfloat16
            and self.products
            and rows <= self.plan.product_rows
            and not torch.is_grad_enabled()
        ):
            return linear_bf16(x, packed(w), w.shape[0], bias, self.products)
        return frozen_linear(x, w, bias)

    def _qkv(self, layer: DecoderLayer, x: torch.Tensor, pending: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """A layer's first half: `pending` (the previous layer's MLP output) joins the stream `x` in place,
        then the first norm and the q, k, v projections, in the projections' dtype."""
        attn, norm1 = layer.self_attn, layer.input_layernorm
        h = rms_norm(x, norm1.weight, norm1.eps, _multiplies_in(attn.qkv or attn.q_proj), add=pending)
        if attn.qkv is not None:
            return self.project(attn.qkv, h).split([attn.n_heads * attn.head_dim, *[attn.n_kv * attn.head_dim] * 2], -1)
        return tuple(self.project(p, h) for p in (attn.q_proj, attn.k_proj, attn.v_proj))

    def _mlp(self, layer: DecoderLayer, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """A layer's second half: the o projection of attention's output joins the stream `x` (in place),
        then the second norm and the MLP, SiLU in the kernels. Returns the MLP's output."""
        mlp, norm2 = layer.mlp, layer.post_attention_layernorm
        o = self.project(layer.self_attn.o_proj, attended)
        h = rms_norm(x, norm2.weight, norm2.eps, _multiplies_in(mlp.gate_up or mlp.gate_proj), add=o)
        if mlp.gate_up is not None:
            gate, up = self.project(mlp.gate_up, h).chunk(2, -1)
        else:
            gate, up = self.project(mlp.gate_proj, h), self.project(mlp.up_proj, h)
        return self.project(mlp.down_proj, silu_mul(gate, up, _multiplies_in(mlp.down_proj)))

    def decode_layer(self, layer: DecoderLayer, x: torch.Tensor, pending, step, cache: KVCache) -> torch.Tensor:
        """One layer of a decode step: the products as `project` runs them, the norms, RoPE, the cache write,
        attention and SiLU in the kernels. `x` ([B, 1, d] fp32, contiguous) is the residual stream, updated
        in place; `pending`, the previous layer's MLP output, joins it in this layer's first norm. Returns
        this layer's MLP output, which the next layer (or the caller) adds to `x`."""
        attn = layer.self_attn
        q, k, v = self._qkv(layer, x, pending)
        if attn.qk_norm:  # Qwen3's q/k norms, per head, before RoPE
            q = attn.q_norm(q.unflatten(-1, (attn.n_heads, attn.head_dim))).flatten(-2)
            k = attn.k_norm(k.unflatten(-1, (attn.n_kv, attn.head_dim))).flatten(-2)
            v = v.float().contiguous()
        i = attn.layer_idx
        return self._mlp(
            layer, x, rope_decode_attention(q, k, v, step, cache.k[i], cache.v[i], _multiplies_in(attn.o_proj))
        )

    def decode_layer_in_one_call(self, layer: DecoderLayer, x: torch.Tensor, pending, step, cache: KVCache):
        """`decode_layer` in one kernel call (a bf16 sampling tree's layer, its products in the kernels): the
        same kernels in the same order, so the same result to the bit."""
        attn, norm1, norm2 = layer.self_attn, layer.input_layernorm, layer.post_attention_layernorm
        projections = tuple(
            (packed(p.weight), p.weight.shape[0], None if p.bias is None else p.bias.to(p.weight.dtype).float())
            for p in (attn.qkv, attn.o_proj, layer.mlp.gate_up, layer.mlp.down_proj)
        )
        weights = LayerWeights(((norm1.weight, norm1.eps), (norm2.weight, norm2.eps)), projections)
        i = attn.layer_idx
        return decode_layer_bf16(
            x, pending, weights, step, cache.k[i], cache.v[i], (attn.n_heads, attn.n_kv), self.products
        )

    def prefill_layer(self, layer: DecoderLayer, x: torch.Tensor, pending, cos, sin, mask, cache: KVCache, pos: int):
        """One layer of a prefill: the products as `project` runs them, the norms and SiLU in the kernels,
        RoPE, the cache write and attention as the reference's (in query blocks over a long prompt).
        `x`, `pending` and the return value as in `decode_layer`, over [B, T, d]."""
        q, k, v = self._qkv(layer, x, pending)
        out, _ = layer.self_attn.attend(q.float(), k.float(), v.float(), cos, sin, mask, cache, pos, blocks=True)
        return self._mlp(layer, x, out)

    def decode(self, lm: CausalLM, ids, positions, mask, cache: KVCache, pos: int) -> torch.Tensor:
        x, cos, sin, mask = lm.embed(ids, positions, mask)
        x, pending = x.contiguous(), None
        step = decode_step(cos, sin, pos, mask, cache.rows, cache.k.shape[1])
        one_call = x.shape[0] <= self.plan.one_call_rows
        for layer in lm.model.layers:
            if one_call:
                pending = self.decode_layer_in_one_call(layer, x, pending, step, cache)
            else:
                pending = self.decode_layer(layer, x, pending, step, cache)
        return lm.model.norm(x if pending is None else x.add_(pending))

    def prefill(self, lm: CausalLM, ids, positions, mask, cache: KVCache, pos: int) -> torch.Tensor:
        if self.plan.prefill.path != "kernels":
            return super().prefill(lm, ids, positions, mask, cache, pos)
        x, cos, sin, mask = lm.embed(ids, positions, mask)
        x, pending = x.contiguous(), None
        for layer in lm.model.layers:
            pending = self.prefill_layer(layer, x, pending, cos, sin, mask, cache, pos)
        return lm.model.norm(x.add_(pending))

    def logits(self, lm: CausalLM, hidden: torch.Tensor) -> torch.Tensor:
        """The bf16 sampler's logits in bf16 products summed in fp32 (AMX tiles from `AMX_HEAD_ROWS` rows,
        dot products below), else the reference's fp32 head."""
        if self.head is None:
            return super().logits(lm, hidden)
        way = self.head
        if way == "amx" and hidden.numel() // hidden.shape[-1] < AMX_HEAD_ROWS:
            way = self.plan.dots
        weight = lm.lm_head.weight
        return head_bf16(hidden, packed(weight), weight.shape[0], way)


def for_plan(plan: ComputePlan) -> Reference:
    """The sampler's path the plan chose: the kernels where its decode runs in them, else the reference."""
    return CpuKernels(plan) if plan.decode.path in ("kernels", "one call") else Reference(plan)
