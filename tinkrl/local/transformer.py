"""One decoder-only transformer forward for training and sampling (Llama, Mistral, Qwen2, Qwen3).

Why our own forward instead of calling the transformers model: the sampler and the trainer
must compute the same logprobs for the same tokens (mismatch is the first cause of RL
collapse), and the sampler needs a preallocated KV cache and one batched decode loop.
Both run this module, so they share every op and dtype; only the kernels' blocking differs.

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
and round their inputs to bf16. On CPU a decode step (one new token per row) runs its attention and
the elementwise work between the products in `decode_attention`'s kernels (`DecoderLayer.decode`),
which also let a batch drop finished rows without copying the KV cache (`KVCache.keep`); the bf16
sampler's prefill runs its norms and SiLU in the same kernels (`DecoderLayer.prefill`). The
figures behind these choices are in docs/engine.md.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tinkrl.local.decode_attention import (
    AMX_LAYER_ROWS,
    DecodeStep,
    LayerWeights,
    bf16_product_kernel,
    decode_attention,
    decode_kernels_apply,
    decode_layer_bf16,
    decode_step,
    head_amx_available,
    head_bf16,
    head_bf16_applies,
    kernels_read,
    linear_bf16,
    pack_head,
    reads_cache,
    rms_norm,
    rope_decode_attention,
    silu_mul,
)
from tinkrl.local.model_files import SUPPORTED_ARCHS
from tinkrl.local.models import cpu_has_bf16_math

# oneDNN's matmul on x86 CPUs: torch's fp32 `F.linear` calls MKL's sgemm, which on AMD CPUs
# runs well below oneDNN's kernels at the engine's shapes (bf16 products already go through oneDNN).
_ONEDNN = torch.backends.mkldnn.is_available() and platform.machine().lower() in ("x86_64", "amd64")


def _pointwise(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")


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


def _kept_on(weight: torch.Tensor, name: str, make: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
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
    return _kept_on(weight, "_tinkrl_packed", _onednn_layout)


def _onednn_layout(weight: torch.Tensor) -> torch.Tensor:
    """A weight reordered into oneDNN's blocked layout (what `_packed` keeps)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, 32)


def onednn_chunk(rows: int, n: int, k: int, bias: bool) -> int | None:
    """The chunk of k (`linear_bf16`'s `chunk`; k itself: none) with which AMX tiles compute what
    `frozen_linear`'s oneDNN bf16 product of `rows` rows against an [n, k] weight (with a bias or not)
    computes, to the bit, at this process's thread count; None where no chunk does. Above 32 rows
    oneDNN sums k in blocks whose widths depend on the shape and the threads, so each is found once
    by a probe (`_onednn_chunk`) rather than assumed."""
    return _onednn_chunk(rows, n, k, bias, torch.get_num_threads())


@functools.cache
def _onednn_chunk(rows: int, n: int, k: int, bias: bool, threads: int) -> int | None:
    """`onednn_chunk` for a thread count: oneDNN's product of a probe (`_order_probe`) against the
    tiles' for each chunk k / j (j = 1..16, multiples of 32; the width found last first), the first
    that agrees everywhere."""
    cols, onednn_w, packed, b = _order_probe(n, k, bias)
    x = _order_probe_rows(rows, k, cols)
    with torch.no_grad():
        want = _pointwise(x, onednn_w, b)
        fp32_bias = None if b is None else b.float()
        widths = [k // j for j in range(1, 17) if k % j == 0 and (k // j) % 32 == 0]
        last = _found.get((n, k, bias, threads))
        for width in sorted(widths, key=lambda c: c != last):
            if torch.equal(linear_bf16(x, packed, n, fp32_bias, width), want):
                _found[(n, k, bias, threads)] = width
                return width
    return None


_found: dict[tuple[int, int, bool, int], int] = {}  # the chunk `_onednn_chunk` found last, per shape


def _order_probe_rows(rows: int, k: int, cols: torch.Tensor) -> torch.Tensor:
    """The probe's bf16 rows for `_order_probe`'s weight: random, 1 at its columns `cols`. From a fixed
    seed per row count, leaving torch's global generator alone."""
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    x[:, cols] = 1.0
    return x.bfloat16()


@functools.cache
def _order_probe(n: int, k: int, bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A bf16 weight (in oneDNN's layout and in `pack_head`'s) and a bias (bf16, or None) whose products'
    fp32 sums round differently under any other order of summing k, with the 32 columns `cols` where
    the probe's rows read 1: each output's weight holds +2^e and -2^e (e in 12..18) at two of them, so
    the small products summed while the large one is in the sum lose bits that chunks summed apart
    keep. From a fixed seed, leaving torch's global generator alone."""
    g = torch.Generator().manual_seed(k)
    w = torch.randn(n, k, generator=g)
    cols = torch.randperm(k, generator=g)[: min(32, k)]
    a, z = cols[torch.randint(0, len(cols), (2, n), generator=g)]
    big = 2.0 ** torch.randint(12, 19, (n,), generator=g).float()
    out = torch.arange(n)
    w[out, a] = big
    w[out, z] = torch.where(a == z, big, -big)
    w = w.bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    return cols, _onednn_layout(w), pack_head(w), b


def frozen_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` for a frozen weight, through oneDNN on x86 CPUs (same arithmetic, faster): fp32, or
    bf16 for the bf16 sampling trees' weights. A decode step's few bf16 rows without autograd run in
    the kernels instead (`bf16_product_kernel`: AMX tiles, or dot products on CPUs with AVX512-BF16
    and no AMX; `linear_bf16`: fp32 sums, rounded to bf16 as oneDNN's are), which stream the weights
    from memory faster than oneDNN there (docs/performance.md)."""
    frozen = not weight.requires_grad and (bias is None or not bias.requires_grad)
    if not (_ONEDNN and frozen and x.device.type == "cpu" and x.dtype == weight.dtype):
        return F.linear(x, weight, bias)
    if x.dtype == torch.bfloat16:  # bf16 sampling
        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            return F.linear(x, weight, bias)
        kernel = bf16_product_kernel(x.numel() // x.shape[-1])
        if kernel is not None:  # AMX tiles or dot products
            return linear_bf16(x, _packed_bf16(weight), weight.shape[0], bias, amx=kernel == "amx")
        return _pointwise(x, _packed(weight), bias)  # bf16 products from oneDNN's blocked layout
    if x.dtype != torch.float32:
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return _onednn_linear(x, weight, bias)
    if torch.backends.mkldnn.matmul.fp32_precision != "ieee" and cpu_has_bf16_math():
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
    (or bf16, `CausalLM.cache_dtype`).

    `rows`: the cache row each batch row lives in (None: batch row b is cache row b). Set by `keep`
    where the decode-attention kernel reads rows in place, so a batch whose rows finish drops them
    without copying the cache.
    """

    k: torch.Tensor
    v: torch.Tensor
    rows: torch.Tensor | None = None

    @classmethod
    def allocate(cls, cfg, batch: int, max_len: int, device, dtype: torch.dtype = torch.float32) -> KVCache:
        shape = (cfg.num_hidden_layers, batch, cfg.num_key_value_heads, max_len, _head_dim(cfg))
        return cls(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))

    def select(self, rows: torch.Tensor) -> KVCache:
        """A cache of the given batch rows (repeats allowed: each gets its own copy)."""
        if self.rows is not None:
            rows = self.rows[rows]
        return KVCache(self.k[:, rows], self.v[:, rows])

    def keep(self, rows: torch.Tensor) -> KVCache:
        """The given batch rows (distinct, as when finished rows leave a batch): left in place where
        the decode-attention kernel reads them there, else copied."""
        if not reads_cache(self.k):
            return self.select(rows)
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


def _head_dim(cfg) -> int:
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
        hd, nh, nkv, d = _head_dim(cfg), cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
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
        rows = cache.rows if cache is not None else None
        out = decode_attention(q, k, v, mask, rows) if T == 1 and cache is not None and mask is not None else None
        if out is None:
            if rows is not None:  # the batch's rows out of the whole cache, for torch's kernel
                k, v = k.index_select(0, rows), v.index_select(0, rows)
            k, v = k.to(q.dtype), v.to(q.dtype)  # a bf16 cache (no copy for an fp32 one)
            with ieee_attention(q.device):
                out = self._sdpa(q, k, v, mask, blocks)
        return out.transpose(1, 2).reshape(B, T, -1), own_kv

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, blocks: bool) -> torch.Tensor:
        """torch's attention of q [B, H, T, D] over k, v's S positions, the last T of them q's own; with
        `blocks` and a causal `mask` [B or 1, 1, T, S], in blocks of `QUERY_BLOCK` queries, each over
        the keys up to its last query (the mask hides the later ones from it anyway)."""
        gqa = self.n_kv != self.n_heads
        T, S = q.shape[2], k.shape[2]
        if not blocks or T <= QUERY_BLOCK or mask is None or mask.shape[2:] != (T, S):
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


def _multiplies_in(module: nn.Module) -> torch.dtype:
    """The dtype a projection wants its input in: a frozen `Linear`'s weight dtype; fp32 for others (LoRA)."""
    return module.weight.dtype if type(module) is Linear else torch.float32


def _project(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A projection of the decode kernels' input: a frozen `Linear` returns its weight's dtype (the kernels
    read bf16 as well as fp32, so no fp32 copy), any other module (LoRA) what it returns."""
    if type(module) is not Linear:
        return module(x)
    w = module.weight
    return frozen_linear(x.to(w.dtype), w, None if module.bias is None else module.bias.to(w.dtype))


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

    def decode(self, x: torch.Tensor, pending: torch.Tensor | None, step: DecodeStep, cache: KVCache) -> torch.Tensor:
        """`forward` for one new token per row, without autograd, on CPU: the matrix products as in
        `forward`, everything between them (norms, RoPE, the cache write, attention, SiLU) in
        decode_attention's C kernels, 4 calls where `forward` runs ~40 small torch ops. `x` ([B, 1, d]
        fp32, contiguous) is the residual stream, updated in place; `pending`, the previous layer's
        MLP output, joins it in this layer's first norm. Returns this layer's MLP output, which the
        next layer (or the caller) adds to `x`."""
        attn = self.self_attn
        q, k, v = self._qkv(x, pending)
        i = attn.layer_idx
        return self._mlp(x, rope_decode_attention(q, k, v, step, cache.k[i], cache.v[i], _multiplies_in(attn.o_proj)))

    def prefill(
        self, x: torch.Tensor, pending: torch.Tensor | None, cos, sin, mask, cache: KVCache, cache_pos: int
    ) -> torch.Tensor:
        """`forward` for a sampler's prefill (many tokens a row into `cache` at `cache_pos`), without
        autograd, on CPU: the matrix products, RoPE, the cache write and attention as in `forward`, the
        norms and SiLU in the decode kernels, whose bf16 outputs feed a bf16 tree's products with no
        fp32 copy between them. `x` ([B, T, d] fp32, contiguous) is the residual stream, updated in
        place, and `pending` and the return value are MLP outputs, as in `decode`."""
        q, k, v = self._qkv(x, pending)
        out, _ = self.self_attn.attend(q.float(), k.float(), v.float(), cos, sin, mask, cache, cache_pos, blocks=True)
        return self._mlp(x, out)

    def _qkv(self, x: torch.Tensor, pending: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """`decode`'s and `prefill`'s first half: `pending` joins the stream `x` (in place), then the first
        norm (a decode kernel) and the q, k, v projections, in the projections' dtype."""
        attn, norm1 = self.self_attn, self.input_layernorm
        h = rms_norm(x, norm1.weight, norm1.eps, _multiplies_in(attn.qkv or attn.q_proj), add=pending)
        if attn.qkv is not None:
            return _project(attn.qkv, h).split([attn.n_heads * attn.head_dim, *[attn.n_kv * attn.head_dim] * 2], -1)
        return tuple(_project(p, h) for p in (attn.q_proj, attn.k_proj, attn.v_proj))

    def _mlp(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """`decode`'s and `prefill`'s second half: the o projection of attention's output joins the stream
        `x` (in place), then the second norm and the MLP, SiLU in a decode kernel. The MLP's output."""
        mlp, norm2 = self.mlp, self.post_attention_layernorm
        h = rms_norm(
            x, norm2.weight, norm2.eps, _multiplies_in(mlp.gate_up or mlp.gate_proj),
            add=_project(self.self_attn.o_proj, attended),
        )  # fmt: skip
        if mlp.gate_up is not None:
            gate, up = _project(mlp.gate_up, h).chunk(2, -1)
        else:
            gate, up = _project(mlp.gate_proj, h), _project(mlp.up_proj, h)
        return _project(mlp.down_proj, silu_mul(gate, up, _multiplies_in(mlp.down_proj)))

    def decodes_bf16_in_one_call(self) -> bool:
        """Whether `decode_bf16` can run this layer: its four projections frozen bf16 `Linear`s, q/k/v and
        gate/up fused (the bf16 sampling tree's layers; LoRA modules and fp32 weights run `decode`)."""
        return all(type(p) is Linear and p.weight.dtype == torch.bfloat16 for p in self.projections())

    def one_call_chunks(self, rows: int) -> tuple[int | None, ...] | None:
        """The chunks (`linear_bf16`) with which `decode_bf16` computes what `decode` computes for
        `rows` rows, to the bit: none where `decode`'s products run in the same kernel
        (`bf16_product_kernel`); above, on AMX up to `AMX_LAYER_ROWS` rows, oneDNN's (`onednn_chunk`).
        None where a projection has none, or the one call could not follow oneDNN's order."""
        if not _ONEDNN:  # `decode` multiplies through `F.linear` then, neither the tiles nor oneDNN
            return None
        projections = self.projections()
        if bf16_product_kernel(rows) is not None:
            return tuple(None for _ in projections)
        if rows > AMX_LAYER_ROWS or not head_amx_available():
            return None
        chunks = tuple(onednn_chunk(rows, *p.weight.shape, p.bias is not None) for p in projections)
        return None if None in chunks else chunks

    def projections(self) -> tuple[nn.Linear, ...]:
        """The four projections `decode_bf16` runs: q/k/v fused, o, gate/up fused, down."""
        attn, mlp = self.self_attn, self.mlp
        return (attn.qkv, attn.o_proj, mlp.gate_up, mlp.down_proj)

    def decode_bf16(
        self,
        x: torch.Tensor,
        pending: torch.Tensor | None,
        step: DecodeStep,
        cache: KVCache,
        chunks: tuple[int | None, ...] = (None, None, None, None),
    ) -> torch.Tensor:
        """`decode` in one kernel call (`decode_layer_bf16`), for layers that `decodes_bf16_in_one_call`
        on a CPU with AVX512-BF16: the same kernels in the same order, and with this row count's
        `one_call_chunks`, the same result to the bit."""
        attn, norm1, norm2 = self.self_attn, self.input_layernorm, self.post_attention_layernorm
        projections = tuple(
            (_packed_bf16(p.weight), p.weight.shape[0], None if p.bias is None else p.bias.to(p.weight.dtype).float())
            for p in self.projections()
        )
        weights = LayerWeights(((norm1.weight, norm1.eps), (norm2.weight, norm2.eps)), projections, chunks)
        i = attn.layer_idx
        return decode_layer_bf16(x, pending, weights, step, cache.k[i], cache.v[i], (attn.n_heads, attn.n_kv))


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
    # A sampling tree that may keep its KV cache in bf16 (the bf16 sampler's; `cache_dtype`).
    kv_cache_dtype = torch.float32
    # bf16: a sampling tree whose logits may come from bf16 products (the bf16 sampler's; `logits`).
    head_dtype = torch.float32

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
    ) -> torch.Tensor:
        """`cache_pos` as an int: keys/values land at that offset and attention sees the cache up to
        them. As a 1-element tensor: they land at that index and attention sees the whole cache
        under `mask` ([B, 1, T, cache length]), the fixed-shape step the sampler's CUDA graph replays."""
        x = self._embed(input_ids)
        cos, sin = (t.float() for t in self.rotary(x, position_ids))
        mask = additive_mask(mask)
        if self._decodes_in_kernels(x, cache, cache_pos):
            x, pending = x.contiguous(), None
            step = decode_step(cos, sin, cache_pos, mask, cache.rows, cache.k.shape[1])
            chunks = self._layers_in_one_call(x)
            for layer in self.model.layers:
                pending = (
                    layer.decode(x, pending, step, cache)
                    if chunks is None
                    else layer.decode_bf16(x, pending, step, cache, chunks)
                )
            return self.model.norm(x if pending is None else x.add_(pending))
        if self._prefills_in_kernels(x, cache, cache_pos):
            x, pending = x.contiguous(), None
            for layer in self.model.layers:
                pending = layer.prefill(x, pending, cos, sin, mask, cache, cache_pos)
            return self.model.norm(x.add_(pending))
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, cache, cache_pos)
        return self.model.norm(x)

    def cache_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype of this tree's KV cache on `device`: `kv_cache_dtype` where the decode kernels read
        and write the cache (bf16 halves the bytes a decode step's attention reads), else fp32."""
        if kernels_read(device, self.kv_cache_dtype, _head_dim(self.config)):
            return self.kv_cache_dtype
        return torch.float32

    def _decodes_in_kernels(self, x: torch.Tensor, cache: KVCache | None, cache_pos: int | torch.Tensor) -> bool:
        """Whether this forward is a decode step `DecoderLayer.decode` runs: one token per row into a
        cache at an int position, on CPU without autograd, with the C kernels at hand."""
        return (
            x.shape[1] == 1
            and cache is not None
            and isinstance(cache_pos, int)
            and self.config.model_type != "qwen3"  # its q/k norms are not in the kernels
            and decode_kernels_apply(x, cache.k)
        )

    def _prefills_in_kernels(self, x: torch.Tensor, cache: KVCache | None, cache_pos: int | torch.Tensor) -> bool:
        """Whether this forward is a bf16 sampler's prefill, which `DecoderLayer.prefill` runs: tokens into
        a cache at an int position, on CPU without autograd, with the kernels at hand, by a tree whose
        layers multiply in bf16 (`decodes_bf16_in_one_call`). An fp32 tree keeps `forward`, the
        trainer's own arithmetic: the kernels gain its prefill nothing (docs/performance.md)."""
        return (
            cache is not None
            and isinstance(cache_pos, int)
            and decode_kernels_apply(x, cache.k)
            and all(layer.decodes_bf16_in_one_call() for layer in self.model.layers)
        )

    def _layers_in_one_call(self, x: torch.Tensor) -> tuple[int | None, ...] | None:
        """The chunks with which a decode step's layers each run in one kernel call
        (`DecoderLayer.decode_bf16`), or None where they run op by op: the bf16 sampling tree's layers,
        a decode step's rows that the one call computes to the bit (`one_call_chunks`)."""
        layers = self.model.layers
        if not all(layer.decodes_bf16_in_one_call() for layer in layers):
            return None
        return layers[0].one_call_chunks(x.shape[0])  # every layer has the first one's shapes

    def forward_shared_prefix(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor, shared: int
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
            pre, kv = layer(pre, cos_p, sin_p, mask_p, None, 0, return_kv=True)
            rest = layer(rest, cos_r, sin_r, mask_r, None, 0, prefix_kv=kv)
        return torch.cat([self.model.norm(pre).expand(B, -1, -1), self.model.norm(rest)], dim=1)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids).float()
        if self.compiled and torch.is_grad_enabled():
            x.requires_grad_()  # every layer then sees the same input kind: one compiled graph serves all
        return x

    def logits(self, hidden: torch.Tensor, exact: bool = True) -> torch.Tensor:
        """fp32 logits. `exact=False` multiplies in the compute dtype (only for values nobody trains on).
        A tree with `head_dtype` bf16 (the bf16 sampler's) multiplies in bf16 with fp32 sums and output
        (`head_bf16`) where the CPU has bf16 dot products."""
        head = getattr(self.lm_head, "base_layer", self.lm_head)  # peft wraps it when the unembedding trains
        if exact and self.head_dtype == torch.bfloat16 and head is self.lm_head and head_bf16_applies(hidden):
            return head_bf16(hidden, _packed_bf16(head.weight), head.weight.shape[0])
        head.fast = not exact
        try:
            return self.lm_head(hidden)
        finally:
            head.fast = False


def _packed_bf16(weight: torch.Tensor) -> torch.Tensor:
    """`pack_head`'s bf16 copy of a weight (`_kept_on` it): the unembedding's, or a projection's in the kernels."""
    return _kept_on(weight, "_tinkrl_head_bf16", pack_head)


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
    projection's weight, fused (`fuse_projections`), its KV cache in bf16 (off-policy by its rounding
    already) and its head in bf16 products with fp32 sums and logits. Returns it."""
    with torch.no_grad():
        for module in tree.modules():
            if isinstance(module, Linear):
                module.weight = nn.Parameter(module.weight.to(torch.bfloat16), requires_grad=False)
    fuse_projections(tree)
    tree.kv_cache_dtype = tree.head_dtype = torch.bfloat16
    return tree


def additive_mask(mask: torch.Tensor) -> torch.Tensor:
    """A boolean attention mask as an additive fp32 one (CPU attention kernels run faster with it)."""
    if mask.dtype != torch.bool:
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


def compile_layers(model: CausalLM) -> bool:
    """torch.compile every decoder layer of a training tree; False (left eager) where it can't.

    Much of an eager training step on CPU is memory-bound fp32 elementwise work (norms,
    RoPE, SiLU, residual adds, LoRA scaling) between the matrix products; inductor fuses it,
    forward and backward. All layers run the same code, so one graph (per input kind and
    shape class) serves them all; shapes are dynamic, so varying pack lengths don't
    recompile. The first step pays the compile (inductor caches it on disk for later runs). Matrix products are unchanged, so logprobs agree with
    the eager sampler as before.
    """
    import shutil

    if next(model.parameters()).device.type == "cpu" and not any(map(shutil.which, ("c++", "g++", "clang++"))):
        import warnings

        warnings.warn("compile=True needs a C++ compiler for torch.compile on CPU; training runs eager", stacklevel=2)
        return False
    for layer in model.model.layers:
        layer.forward = torch.compile(layer.forward, dynamic=True)
    model.compiled = True
    return True
