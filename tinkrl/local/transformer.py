"""The reference decoder-only transformer forward (Llama, Mistral, Qwen2, Qwen3): the trainer's.

Why our own forward instead of calling the transformers model: the sampler and the trainer
must compute the same logprobs for the same tokens (mismatch is the first cause of RL
collapse), and the sampler needs a preallocated KV cache and one batched decode loop. The
trainer runs this module; the sampler runs it too, or a fast path of `kernels/` that the
engine's plan chose and a test holds to it.

The module tree mirrors transformers' names (`model.layers.N.self_attn.q_proj`, …,
`lm_head`), so peft injects LoRA into it exactly as into the HF model, and adapters we save
load into `transformers` + `peft` unchanged.

Precision policy: weights, activations, norms, RoPE and attention are fp32; the engine's
bf16 setting lets the matrix products run in bf16 with fp32 accumulators (oneDNN's math
mode, TF32 on CUDA; see engine.use_reduced_precision_matmuls), so nothing is rounded to
bf16 between them. The unembedding is fp32 wherever a logprob is computed (bf16 logits alone
would break sampler/trainer agreement). On x86 CPUs frozen fp32 products run through oneDNN
(`frozen_linear`). The one exception is bf16 sampling (the engine's `sampler_precision`): its
sampling trees hold bf16 copies of the projections' weights, fused per layer (`fuse_projections`),
and round their inputs to bf16. docs/engine.md explains these choices.
"""

from __future__ import annotations

import hashlib
import os
import platform
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tinkrl.local.compute_plan import cpu, onednn_bf16
from tinkrl.local.model_files import SUPPORTED_ARCHS

# oneDNN's matmul on x86 CPUs: torch's fp32 `F.linear` calls MKL's sgemm, which on AMD CPUs
# runs well below oneDNN's kernels at the engine's shapes (bf16 products already go through oneDNN).
_ONEDNN = torch.backends.mkldnn.is_available() and platform.machine().lower() in ("x86_64", "amd64")
# ... and its bf16 products where it has them; elsewhere torch's own (oneDNN's would raise).
_ONEDNN_BF16 = _ONEDNN and onednn_bf16(cpu()[1])


# oneDNN compiles kernels for every row count it is given and keeps them (two caches of up to 1,024
# entries, each entry a few 256 KiB blocks of machine code): a server or a trainer whose batches hold
# ever new token counts grows by those blocks, and pays the compile, with every new count. Products of
# more than ROW_CHUNK rows run ROW_CHUNK rows at a time, and a row count goes up to the next of a few
# sizes (`padded_rows`), so a bounded set of row counts ever reaches oneDNN.
ROW_CHUNK = 512


def padded_rows(rows: int) -> int:
    """The row count a product of `rows` rows (1 to ROW_CHUNK) is padded to: exact up to 16 (decode
    batches), then the next multiple of a quarter of the power of two below (17 -> 20, 33 -> 40,
    257 -> 320): at most a quarter more rows, 36 sizes in all."""
    if not 0 < rows <= ROW_CHUNK:
        raise ValueError(f"padded_rows: {rows} rows, not 1 to ROW_CHUNK ({ROW_CHUNK})")
    if rows <= 16:
        return rows
    step = 1 << ((rows - 1).bit_length() - 3)
    return -(-rows // step) * step


def _onednn_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's x @ weight.T + bias for 2-D `x` of at most ROW_CHUNK rows, padded to `padded_rows`."""
    rows = x.shape[0]
    padded = padded_rows(rows)
    if padded != rows:
        x = torch.cat([x, x.new_zeros(padded - rows, x.shape[1])])
    out = _onednn_call(x, weight, bias)
    return out if padded == rows else out[:rows]


def _onednn_call(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's product itself: the one place a row count reaches it."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _pointwise(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's x @ weight.T + bias for any leading shape, over the few row counts `padded_rows` allows."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    if flat.shape[0] <= ROW_CHUNK:
        out = _onednn_product(flat, weight, bias)
    else:
        out = torch.cat([_onednn_product(part, weight, bias) for part in flat.split(ROW_CHUNK)])
    return out.reshape(*x.shape[:-1], out.shape[-1])


@torch.library.custom_op("tinkrl::onednn_linear", mutates_args=())
def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias by oneDNN, differentiable in x; an opaque op to torch.compile (whose
    own lowering of oneDNN's linear wants prepacked weights)."""
    return _pointwise(x, weight, bias)


@_onednn_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _onednn_linear_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[1])


def _onednn_linear_backward(ctx, grad: torch.Tensor):
    (weight,) = ctx.saved_tensors  # frozen: only the input gets a gradient
    return _onednn_linear(grad, weight.t(), None), None, None


_onednn_linear.register_autograd(_onednn_linear_backward, setup_context=_onednn_linear_context)


def kept_on(weight: torch.Tensor, name: str, make: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`make(weight)`, kept on the weight as `name` (so every tree sharing the weight shares it) and
    remade when the weight is rewritten in place (merged sampler weights)."""
    cached = getattr(weight, name, None)
    if cached is None or cached[0] != weight._version:
        cached = (weight._version, make(weight))
        setattr(weight, name, cached)
    return cached[1]


def _packed(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked layout of a frozen weight (`_kept_on` it). Products without autograd
    (sampling, `forward`) run faster from it at decode shapes, for a second copy of the weights in
    memory."""
    return kept_on(weight, "_tinkrl_packed", _onednn_layout)


def _onednn_layout(weight: torch.Tensor) -> torch.Tensor:
    """A weight reordered into oneDNN's blocked layout (what `_packed` keeps)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, 32)


def frozen_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` for a frozen weight, through oneDNN on x86 CPUs (same arithmetic, faster): fp32, or bf16
    for the bf16 sampling trees' weights (where oneDNN multiplies bf16; else torch's own product).
    Without autograd the product reads oneDNN's blocked layout of the weight, except under the bf16
    math mode (AMX), where oneDNN chooses the layout itself."""
    frozen = not weight.requires_grad and (bias is None or not bias.requires_grad)
    if not (_ONEDNN and frozen and x.device.type == "cpu" and x.dtype == weight.dtype):
        return F.linear(x, weight, bias)
    if x.dtype == torch.bfloat16:  # bf16 sampling
        if torch.is_grad_enabled() or torch.compiler.is_compiling() or not _ONEDNN_BF16:
            return F.linear(x, weight, bias)
        return _pointwise(x, _packed(weight), bias)
    if x.dtype != torch.float32:
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return _onednn_linear(x, weight, bias)
    if torch.backends.mkldnn.matmul.fp32_precision != "ieee":
        return _pointwise(x, weight, bias)  # bf16 products: leave the weight layout to oneDNN
    return _pointwise(x, _packed(weight), bias)  # the sampler's path


class Linear(nn.Linear):
    """A frozen base projection: weight in the compute dtype, fp32 output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        bias = None if self.bias is None else self.bias.to(w.dtype)
        return frozen_linear(x.to(w.dtype), w, bias).float()


class RMSNorm(nn.Module):
    """RMS normalisation in fp32 with a frozen weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return self.weight.float() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# A long prefill's attention runs in blocks of this many queries, each over the keys up to its last one.
QUERY_BLOCK = 256


@dataclass
class KVCache:
    """Preallocated keys/values for every layer: [layers, cache rows, kv_heads, max_len, head_dim], fp32
    (or bf16, the bf16 sampler's where the kernels read it).

    `rows`: the cache row each batch row lives in (None: batch row b is cache row b). Set by `keep`,
    where the sampler's path reads rows in place, so a batch whose rows finish drops them without
    copying the cache.
    """

    k: torch.Tensor
    v: torch.Tensor
    rows: torch.Tensor | None = None

    @classmethod
    def allocate(cls, cfg, batch: int, max_len: int, device, dtype: torch.dtype = torch.float32) -> KVCache:
        shape = (cfg.num_hidden_layers, batch, cfg.num_key_value_heads, max_len, head_dim(cfg))
        return cls(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))

    def select(self, rows: torch.Tensor) -> KVCache:
        """A cache of the given batch rows (repeats allowed: each gets its own copy)."""
        if self.rows is not None:
            rows = self.rows[rows]
        return KVCache(self.k[:, rows], self.v[:, rows])

    def keep(self, rows: torch.Tensor) -> KVCache:
        """The given batch rows (distinct, as when finished rows leave a batch), left where they lie."""
        return KVCache(self.k, self.v, rows if self.rows is None else self.rows[rows])

    def write(self, layer: int, pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a layer's keys/values [B, kv_heads, T, head_dim] at positions pos..pos+T; returns the
        layer's keys/values up to them (all cache rows when `rows` is set)."""
        end = pos + k.shape[2]
        if self.rows is None:
            self.k[layer, :, :, pos:end] = k
            self.v[layer, :, :, pos:end] = v
        else:
            self.k[layer, :, :, pos:end].index_copy_(0, self.rows, k)
            self.v[layer, :, :, pos:end].index_copy_(0, self.rows, v)
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


def head_dim(cfg) -> int:
    """A model config's attention head width."""
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


@contextmanager
def ieee_attention(device: torch.device):
    """Attention on CPU outside the engine's bf16 math mode (engine.use_reduced_precision_matmuls).

    Under that mode torch's CPU flash-attention kernel computes the same fp32 result on a path
    many times slower for some shapes (decode steps over a long cache, small prefills). (Compiled
    training layers keep the mode: switching it inside would split their graph, for no gain.)
    """
    if device.type != "cpu" or torch.compiler.is_compiling() or torch.backends.mkldnn.matmul.fp32_precision == "ieee":
        yield
        return
    previous = torch.backends.mkldnn.matmul.fp32_precision
    torch.backends.mkldnn.matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = previous


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE (and Qwen3's q/k norms), writing to a KV cache when given one."""

    def __init__(self, cfg, layer_idx: int, has_qkv_bias: bool):
        super().__init__()
        hd, nh, nkv, d = head_dim(cfg), cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
        self.layer_idx, self.head_dim, self.n_heads, self.n_kv = layer_idx, hd, nh, nkv
        self.q_proj = Linear(d, nh * hd, bias=has_qkv_bias)
        self.k_proj = Linear(d, nkv * hd, bias=has_qkv_bias)
        self.v_proj = Linear(d, nkv * hd, bias=has_qkv_bias)
        self.o_proj = Linear(nh * hd, d, bias=False)
        self.qkv: Linear | None = None  # sampling trees: q, k and v in one product (fuse_projections)
        self.qk_norm = cfg.model_type == "qwen3"
        if self.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache: KVCache | None, cache_pos: int, prefix_kv=None, return_kv=False):
        """`prefix_kv`: keys/values [1, H_kv, P, d] of a prefix every row continues (training);
        `return_kv`: also return this call's keys/values (to be that prefix)."""
        if self.qkv is not None:
            q, k, v = self.qkv(x).split([self.n_heads * self.head_dim, *[self.n_kv * self.head_dim] * 2], -1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        out, own_kv = self.attend(q, k, v, cos, sin, mask, cache, cache_pos, prefix_kv)
        out = self.o_proj(out)
        return (out, own_kv) if return_kv else out

    def attend(self, q, k, v, cos, sin, mask, cache: KVCache | None, cache_pos: int, prefix_kv=None, blocks=False):
        """Attention of the projections' q, k, v ([B, T, heads * head_dim] fp32): (Qwen3's q/k norms,)
        RoPE, the cache write, attention. Returns its output [B, T, heads * head_dim], the o
        projection's input, and this call's keys/values after RoPE. `blocks`: attend in blocks of
        `QUERY_BLOCK` queries over the keys up to each block's last position (a long prefill's
        causal half skipped: the same attention, its sums in another order)."""
        B, T, _ = q.shape
        q = q.view(B, T, self.n_heads, self.head_dim)
        k = k.view(B, T, self.n_kv, self.head_dim)
        v = v.view(B, T, self.n_kv, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = cos[:, None], sin[:, None]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        own_kv = (k, v)
        if cache is not None and isinstance(cache_pos, torch.Tensor):
            # static decoding: write at a tensor index, attend over the whole cache (the mask hides
            # what is not written yet), so every step runs the same kernels on the same buffers
            k = cache.k[self.layer_idx].index_copy_(2, cache_pos, k.to(cache.k.dtype))
            v = cache.v[self.layer_idx].index_copy_(2, cache_pos, v.to(cache.v.dtype))
        elif cache is not None:
            k, v = cache.write(self.layer_idx, cache_pos, k, v)
        elif prefix_kv is not None:
            k = torch.cat([prefix_kv[0].expand(B, -1, -1, -1), k], dim=2)
            v = torch.cat([prefix_kv[1].expand(B, -1, -1, -1), v], dim=2)
        if cache is not None and cache.rows is not None:  # the batch's rows out of the whole cache
            k, v = k.index_select(0, cache.rows), v.index_select(0, cache.rows)
        k, v = k.to(q.dtype), v.to(q.dtype)  # a bf16 cache (no copy for an fp32 one)
        with ieee_attention(q.device):
            out = self._sdpa(q, k, v, mask, blocks)
        return out.transpose(1, 2).reshape(B, T, -1), own_kv

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, blocks: bool) -> torch.Tensor:
        """torch's attention of q [B, H, T, D] over k, v's S positions, the last T of them q's own; with
        `blocks` and a causal `mask` [B or 1, 1, T, S], in blocks of `QUERY_BLOCK` queries, each over
        the keys up to its last query (the mask hides the later ones from it anyway). `mask` None:
        causal over q's own positions (S == T)."""
        gqa = self.n_kv != self.n_heads
        T, S = q.shape[2], k.shape[2]
        if mask is None:  # rows of one sequence each, unpadded: causal without a [T, S] mask (faster, linear memory)
            if T != S:
                raise ValueError(f"causal attention without a mask needs keys for exactly the {T} queries, got {S}")
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        if not blocks or T <= QUERY_BLOCK or mask.shape[2:] != (T, S):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        out = []
        for t0 in range(0, T, QUERY_BLOCK):
            t1 = min(T, t0 + QUERY_BLOCK)
            end = S - T + t1  # one past the key of this block's last query
            block = (q[:, :, t0:t1], k[:, :, :end], v[:, :, :end])
            out.append(F.scaled_dot_product_attention(*block, attn_mask=mask[:, :, t0:t1, :end], enable_gqa=gqa))
        return torch.cat(out, dim=2)


class MLP(nn.Module):
    """The SwiGLU feed-forward block."""

    def __init__(self, cfg, bias: bool):
        super().__init__()
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = Linear(d, f, bias=bias)
        self.up_proj = Linear(d, f, bias=bias)
        self.down_proj = Linear(f, d, bias=bias)
        self.gate_up: Linear | None = None  # sampling trees: gate and up in one product (fuse_projections)

    def forward(self, x):
        if self.gate_up is not None:
            gate, up = self.gate_up(x).chunk(2, -1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """One pre-norm block: attention, then the MLP, each added to the residual stream."""

    def __init__(self, cfg, idx: int, qkv_bias: bool, mlp_bias: bool):
        super().__init__()
        self.self_attn = Attention(cfg, idx, qkv_bias)
        self.mlp = MLP(cfg, mlp_bias)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache, cache_pos, prefix_kv=None, return_kv=False):
        attn = self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, cache_pos, prefix_kv, return_kv)
        attn, kv = attn if return_kv else (attn, None)
        x = x + attn
        x = x + self.mlp(self.post_attention_layernorm(x))
        return (x, kv) if return_kv else x


class Backbone(nn.Module):
    """Embeddings, decoder layers and the final norm (transformers' `model.` subtree)."""

    def __init__(self, cfg, qkv_bias: bool, mlp_bias: bool):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, qkv_bias, mlp_bias) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """The transformer. `forward` returns final hidden states (fp32); `logits` applies the head."""

    compiled = False  # set by compile_layers

    def __init__(self, cfg, rotary: nn.Module, qkv_bias: bool, mlp_bias: bool):
        super().__init__()
        if cfg.model_type not in SUPPORTED_ARCHS:
            raise ValueError(
                f"architecture {cfg.model_type!r} is not supported by the embedded engine "
                f"(supported: {', '.join(SUPPORTED_ARCHS)})"
            )
        self.config = cfg
        self.model = Backbone(cfg, qkv_bias, mlp_bias)
        self.lm_head = Head(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = rotary  # the HF model's own rotary embedding (handles every rope_type)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | None = None,
        cache_pos: int | torch.Tensor = 0,
        recompute: bool = False,
    ) -> torch.Tensor:
        """`cache_pos` as an int: keys/values land at that offset and attention sees the cache up to
        them. As a 1-element tensor: they land at that index and attention sees the whole cache
        under `mask` ([B, 1, T, cache length]), the fixed-shape step the sampler's CUDA graph replays.
        `recompute` (training): each layer keeps only its input for the backward, which runs the layer
        again (activation checkpointing), so a long sequence holds one layer's activations at a time."""
        x, cos, sin, mask = self.embed(input_ids, position_ids, mask)
        for layer in self.model.layers:
            x = _run(layer, recompute, x, cos, sin, mask, cache, cache_pos)
        return self.model.norm(x)

    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor):
        """What every layer of a forward starts from: the embeddings (fp32), RoPE's cos and sin, and the
        mask as an additive one."""
        x = self._embed(input_ids)
        cos, sin = (t.float() for t in self.rotary(x, position_ids))
        return x, cos, sin, additive_mask(mask)

    def forward_shared_prefix(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor, shared: int, recompute=False
    ) -> torch.Tensor:
        """`forward` for rows that all begin with the same `shared` tokens: those run once.

        The prefix runs as one row; every layer hands its keys/values to the rest of all rows,
        which attend to them as to their own first `shared` positions (gradients flow back
        through them). Returns the same [B, S, d] hidden states as `forward` on the full rows.
        `mask` is the rows' [B, 1, S, S] mask, under which their first `shared` positions are
        visible to every later real position.
        """
        B = input_ids.shape[0]
        mask = additive_mask(mask)
        pre, rest = self._embed(input_ids[:1, :shared]), self._embed(input_ids[:, shared:])
        cos_p, sin_p = (t.float() for t in self.rotary(pre, position_ids[:1, :shared]))
        cos_r, sin_r = (t.float() for t in self.rotary(rest, position_ids[:, shared:]))
        mask_p, mask_r = mask[:1, :, :shared, :shared], mask[:, :, shared:, :]
        for layer in self.model.layers:
            pre, kv = _run(layer, recompute, pre, cos_p, sin_p, mask_p, None, 0, return_kv=True)
            rest = _run(layer, recompute, rest, cos_r, sin_r, mask_r, None, 0, prefix_kv=kv)
        return torch.cat([self.model.norm(pre).expand(B, -1, -1), self.model.norm(rest)], dim=1)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids).float()
        if self.compiled and torch.is_grad_enabled():
            x.requires_grad_()  # every layer then sees the same input kind: one compiled graph serves all
        return x

    def logits(self, hidden: torch.Tensor, exact: bool = True) -> torch.Tensor:
        """fp32 logits. `exact=False` multiplies in the compute dtype (only for values nobody trains on)."""
        head = getattr(self.lm_head, "base_layer", self.lm_head)  # peft wraps it when the unembedding trains
        head.fast = not exact
        try:
            return self.lm_head(hidden)
        finally:
            head.fast = False


def _run(layer: nn.Module, recompute: bool, *args, **kwargs):
    """`layer(*args, **kwargs)`, under activation checkpointing with `recompute` where autograd records."""
    if recompute and torch.is_grad_enabled():
        return checkpoint(layer, *args, use_reentrant=False, **kwargs)
    return layer(*args, **kwargs)


class Head(nn.Linear):
    """The unembedding: an fp32 weight, so logits are never rounded to bf16.

    With `fast` set it multiplies a cached compute-dtype copy instead (faster on CPU).
    """

    compute_dtype = torch.float32
    fast = False
    _fast_weight: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fast and self.compute_dtype != torch.float32:
            if self._fast_weight is None:
                self._fast_weight = self.weight.detach().to(self.compute_dtype)
            return frozen_linear(x.to(self.compute_dtype), self._fast_weight).float()
        return frozen_linear(x.float(), self.weight)


def _fused(parts: list[Linear]) -> Linear:
    """One projection computing `parts` side by side, whose weight (and bias) is a new tensor the
    parts' weights become row views of: writing a part's weight writes the fused one."""
    weight = torch.cat([p.weight.detach() for p in parts])
    bias = None if parts[0].bias is None else torch.cat([p.bias.detach() for p in parts])
    with torch.device("meta"):
        fused = Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        fused.bias = nn.Parameter(bias, requires_grad=False)
    start = 0
    for p in parts:
        n = p.weight.shape[0]
        p.weight = nn.Parameter(weight[start : start + n], requires_grad=False)
        if bias is not None:
            p.bias = nn.Parameter(bias[start : start + n], requires_grad=False)
        start += n
    return fused


def fuse_projections(tree: CausalLM) -> list[str]:
    """Give every layer of a sampling tree one product for q/k/v and one for gate/up (4 products per
    layer instead of 7), on its own copy of those weights; the projections keep their names (a LoRA
    merge writes them) as views of the fused weights. Returns the names of the projections now
    owned by the tree. Not for trees that train."""
    owned = []
    for i, layer in enumerate(tree.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv = _fused([attn.q_proj, attn.k_proj, attn.v_proj])
        mlp.gate_up = _fused([mlp.gate_proj, mlp.up_proj])
        owned += [f"model.layers.{i}.self_attn.{p}_proj" for p in "qkv"]
        owned += [f"model.layers.{i}.mlp.{p}_proj" for p in ("gate", "up")]
    return owned


def to_bf16_sampling(tree: CausalLM) -> CausalLM:
    """Make `tree` (a sampling tree, in place) the bf16 sampler's: a frozen bf16 copy of every
    projection's weight, fused (`fuse_projections`). Returns it."""
    with torch.no_grad():
        for module in tree.modules():
            if isinstance(module, Linear):
                module.weight = nn.Parameter(module.weight.to(torch.bfloat16), requires_grad=False)
    fuse_projections(tree)
    return tree


def additive_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """A boolean attention mask as an additive fp32 one (CPU attention kernels run faster with it); None
    (plain causal attention, no mask tensor) stays None."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(~mask, float("-inf"))


def causal_mask(attn_mask: torch.Tensor, q_len: int, cache_pos: int = 0) -> torch.Tensor:
    """Boolean [B, 1, q_len, k_len] mask: causal over positions, and never attending to padding.

    `attn_mask` is [B, k_len] with 1 for real tokens (left padding gives leading zeros).
    """
    k_len = attn_mask.shape[1]
    q_idx = torch.arange(cache_pos, cache_pos + q_len, device=attn_mask.device)[:, None]
    k_idx = torch.arange(k_len, device=attn_mask.device)[None, :]
    allowed = (k_idx <= q_idx)[None] & attn_mask[:, None, :].bool()
    # A fully padded query row would give NaN; let padding rows see themselves.
    allowed |= (k_idx == q_idx)[None]
    return allowed[:, None]


def build_causal_lm(hf_model: nn.Module, compute_dtype: torch.dtype, device) -> CausalLM:
    """Copy a transformers *ForCausalLM's weights into our module tree (weights in compute dtype)."""
    cfg = hf_model.config
    state = hf_model.state_dict()
    qkv_bias = any(k.endswith("self_attn.q_proj.bias") for k in state)
    mlp_bias = any(k.endswith("mlp.gate_proj.bias") for k in state)
    rotary = hf_model.model.rotary_emb
    with torch.device("meta"):
        lm = CausalLM(cfg, rotary=None, qkv_bias=qkv_bias, mlp_bias=mlp_bias)
    if "lm_head.weight" not in state or getattr(cfg, "tie_word_embeddings", False):
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    tensors = {}
    for name, _ in lm.named_parameters():
        src = state[name]
        fp32 = "norm" in name.split(".")[-2] or name == "lm_head.weight"
        tensors[name] = src.to(device=device, dtype=torch.float32 if fp32 else compute_dtype)
    lm.load_state_dict(tensors, assign=True)
    lm.lm_head.compute_dtype = compute_dtype
    lm.requires_grad_(False)
    lm.rotary = rotary.to(device)
    return lm.to(device)


# As the user set it before torch.compile (which sets it to inductor's default when unset) was ever called.
_USER_COMPILE_CACHE = os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def compile_cache_dir() -> Path:
    """Where torch.compile keeps the training layers' compiled code: `$TORCHINDUCTOR_CACHE_DIR` where the
    user set it, else `$XDG_CACHE_HOME/tinkrl/inductor/<key>` (default `~/.cache`), kept across reboots
    (inductor's own default is under /tmp) so that `make install` can pay the compile once. The key
    names the torch build, `ATEN_CPU_CAPABILITY` and the CPU flags the libraries may use: code compiled
    under one instruction set aborts a process that runs under another, so each gets its own folder."""
    if _USER_COMPILE_CACHE:
        return Path(_USER_COMPILE_CACHE)
    _, flags, isa = cpu()
    key = "\0".join([torch.__version__, os.environ.get("ATEN_CPU_CAPABILITY", ""), *isa, *sorted(flags)])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return base / "tinkrl" / "inductor" / hashlib.sha256(key.encode()).hexdigest()[:16]


def compile_layers(model: CausalLM) -> bool:
    """torch.compile every decoder layer of a training tree; False (left eager) where it can't.

    Much of an eager training step on CPU is memory-bound fp32 elementwise work (norms,
    RoPE, SiLU, residual adds, LoRA scaling) between the matrix products; inductor fuses it,
    forward and backward. All layers run the same code, so one graph (per input kind and
    shape class) serves them all; shapes are dynamic, so varying pack lengths don't
    recompile. The first step pays the compile; inductor caches it on disk (`compile_cache_dir`) for
    later runs. Matrix products are unchanged, so logprobs agree with the eager sampler as before.
    """
    import shutil

    if next(model.parameters()).device.type == "cpu" and not any(map(shutil.which, ("c++", "g++", "clang++"))):
        import warnings

        warnings.warn("compile=True needs a C++ compiler for torch.compile on CPU; training runs eager", stacklevel=2)
        return False
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(compile_cache_dir())  # read by inductor when it compiles
    for layer in model.model.layers:
        layer.forward = torch.compile(layer.forward, dynamic=True)
    model.compiled = True
    return True
