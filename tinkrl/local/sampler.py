"""KV-cached batched sampling: many `sample()` requests decoded together in one loop.

`sample_batch` takes every request that arrived while the engine was busy (see
engine.py), prefills each distinct prompt once (a GRPO group's samples share the prompt's
KV cache) and the opening all prompts share once (the chat template's system turn, most of a
short prompt), then decodes all rows in lock-step, dropping finished rows from the batch.
On CUDA each decode step is a replayed CUDA graph (`StaticDecoder`).

Logprob semantics: the logprob returned for a sampled token is its log-probability under
the model's own distribution, log_softmax(logits), at temperature 1 and before top-k/top-p
truncation, whatever temperature/top_k/top_p the token was drawn with. It is what the
trainer's `forward` computes for the same tokens, so importance ratios compare the same
quantity (the policy), and `sample()` at T=0.7 and `forward()` agree.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from tinker import types

from tinkrl.local.packing import MIN_SHARED, common_prefix_len
from tinkrl.local.prefix_cache import Prefixes, Stored
from tinkrl.local.transformer import CausalLM, KVCache, additive_mask, causal_mask


@dataclass
class SampleJob:
    """One `sample()` request for `sample_batch`; `result` is filled in when it is done."""

    prompt: list[int]
    num_samples: int
    params: types.SamplingParams
    include_prompt_logprobs: bool = False
    topk_prompt_logprobs: int = 0
    # filled by sample_batch
    result: types.SampleResponse | None = None


@dataclass
class _Row:
    job: int
    sample_index: int
    prompt_len: int
    max_tokens: int
    stop_ids: set[int]
    stop_strings: list[str]
    temperature: float
    top_k: int
    top_p: float
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop_reason: str | None = None


def _stop_condition(params: types.SamplingParams, eos_id: int | None) -> tuple[set[int], list[str]]:
    stop = params.stop
    if stop is None:
        return ({eos_id} if eos_id is not None else set()), []
    if isinstance(stop, str):
        return set(), [stop]
    if all(isinstance(s, int) for s in stop):
        return set(stop), []
    return set(), [str(s) for s in stop]


def _generator(seed: int | None, sample_index: int, device) -> torch.Generator | None:
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}:{sample_index}".encode()).digest()
    g = torch.Generator(device="cpu")
    g.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return g


_BLOCK = 256  # vocabulary block of the two-level inverse-CDF draw


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """For each row, the first token whose cumulative probability exceeds u * total (u in [0, 1)).

    The same draw as `searchsorted(probs.cumsum(-1), u * total)`, in two levels: a block of
    `_BLOCK` tokens from the blocks' cumulative mass, then the token inside that block: no
    vocabulary-long sequential scan and no vocabulary-sized cumsum temporary per decode step
    (docs/engine.md). Never returns a zero-probability (filtered) token.
    """
    R, V = probs.shape
    pad = (-V) % _BLOCK
    blocks = (F.pad(probs, (0, pad)) if pad else probs).view(R, -1, _BLOCK)
    block_cdf = blocks.sum(-1).cumsum(-1)
    total = block_cdf[:, -1:]
    target = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    block = torch.searchsorted(block_cdf, target, right=True)  # [R, 1]: its mass ends past target
    before = torch.where(block > 0, block_cdf.gather(-1, (block - 1).clamp_min(0)), torch.zeros_like(target))
    within = blocks.gather(1, block[:, :, None].expand(-1, -1, _BLOCK))[:, 0].cumsum(-1)
    last = within[:, -1:]  # rounding may put target - before at or past the block's own sum
    rest = torch.minimum((target - before).clamp_min(0), torch.nextafter(last, torch.zeros_like(last)))
    return (block * _BLOCK + torch.searchsorted(within, rest, right=True))[:, 0]


def _draw(logits: torch.Tensor, rows: list[_Row]) -> torch.Tensor:
    """One token per row from fp32 logits [R, V], honouring each row's T / top_k / top_p / seed."""
    R = logits.shape[0]
    greedy = [r.temperature <= 0 for r in rows]  # decided from the rows: no device sync per step
    if all(greedy):
        return logits.argmax(-1)
    if all(r.temperature == 1 for r in rows):
        scaled = logits
    else:
        temps = torch.tensor([r.temperature for r in rows], dtype=torch.float32, device=logits.device)
        scaled = logits / temps.clamp_min(1e-6)[:, None]
    needs_filter = [i for i, r in enumerate(rows) if (r.top_k > 0 or r.top_p < 1.0) and r.temperature > 0]
    if needs_filter:
        idx = torch.tensor(needs_filter, device=logits.device)
        sub = scaled[idx]
        sorted_logits, order = sub.sort(-1, descending=True)
        ranks = torch.arange(sub.shape[-1], device=logits.device)[None]
        top_k = torch.tensor(
            [rows[i].top_k if rows[i].top_k > 0 else sub.shape[-1] for i in needs_filter], device=logits.device
        )[:, None]
        top_p = torch.tensor([rows[i].top_p for i in needs_filter], device=logits.device)[:, None]
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs
        drop = (ranks >= top_k) | (mass_before >= top_p)
        drop[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = scaled.clone() if scaled is logits else scaled
        scaled[idx] = torch.full_like(sub, float("-inf")).scatter(-1, order, sorted_logits)
    shared = torch.rand(R).tolist()
    u = torch.tensor(
        [
            torch.rand(1, generator=r.generator).item() if r.generator is not None else shared[i]
            for i, r in enumerate(rows)
        ],
        dtype=torch.float32,
    )
    sampled = _inverse_cdf(scaled.softmax(-1), u.to(logits.device))
    if not any(greedy):
        return sampled
    return torch.where(torch.tensor(greedy, device=logits.device), logits.argmax(-1), sampled)


class _Recorder:
    """Collects each finished row's place in the batch's KV cache for the prefix cache: its prompt
    and every token it fed (all but the last it drew), recorded when the row leaves the batch."""

    def __init__(self, prefixes: Prefixes | None, rows: list[_Row], jobs: list[SampleJob], prompt_at: list, P: int):
        """`prompt_at[i]`: the cache positions of row i's prompt tokens; its new tokens follow from `P` on."""
        self.prefixes, self.rows, self.jobs, self.prompt_at, self.P = prefixes, rows, jobs, prompt_at, P
        self.kept: dict[int, tuple[KVCache, list]] = {}

    def __call__(self, cache: KVCache, slots: list[tuple[int, int]]) -> None:
        """Record the rows `(batch slot, row)` as they lie in `cache`."""
        if self.prefixes is None or not slots:
            return
        _, found = self.kept.setdefault(id(cache.k), (cache, []))
        for b, i in slots:
            r = self.rows[i]
            fed = len(r.tokens) - 1
            at = torch.cat([self.prompt_at[i], torch.arange(self.P, self.P + fed, device=cache.k.device)])
            row = b if cache.rows is None else int(cache.rows[b])
            found.append((self.jobs[r.job].prompt + r.tokens[:fed], row, at))

    def store(self) -> None:
        """Hand the recorded rows, with the caches that hold them, to the prefix cache."""
        for cache, found in self.kept.values():
            self.prefixes.add(cache.k, cache.v, found)


class StaticDecoder:
    """Decode steps on fixed-shape buffers, replayed as one CUDA graph on CUDA.

    Each step writes the new keys/values at a tensor index and attends over the whole cache
    under an additive mask that opens one column per step, so every step launches the same
    kernels on the same addresses. A small model's decode step is thousands of small
    kernels: on a GPU launching them costs more than running them, and a graph replay
    launches them all at once. The first step runs eagerly (it warms up the kernels), the
    graph is captured at the second. Rows that finish keep their slot (their outputs are
    ignored) until the sampler compacts the batch with `select`, which captures anew.
    """

    def __init__(self, lm: CausalLM, cache: KVCache, mask: torch.Tensor, graph: bool):
        """`mask`: additive [R, 1, 1, cache length], 0 where a row may attend (its prompt so far)."""
        self.lm, self.cache, self.mask, self.use_graph = lm, cache, mask, graph
        R, device = mask.shape[0], mask.device
        self.tokens = torch.zeros((R, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((R, 1), dtype=torch.long, device=device)
        self.write_at = torch.zeros(1, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self.steps = 0

    @classmethod
    def for_rows(cls, lm: CausalLM, cache: KVCache, attn: torch.Tensor, graph: bool) -> StaticDecoder:
        """`attn`: [R, cache length], 1 at the rows' real prompt positions."""
        return cls(lm, cache, additive_mask(attn[:, None, None, :].bool()), graph)

    def _forward(self) -> torch.Tensor:
        hidden = self.lm(self.tokens, self.positions, self.mask, self.cache, self.write_at)
        return self.lm.logits(hidden[:, -1])

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, pos: int) -> torch.Tensor:
        """Logits [R, V] after feeding each row's token at its position; keys/values land at `pos`."""
        self.tokens.copy_(tokens[:, None])
        self.positions.copy_(positions[:, None])
        self.write_at.fill_(pos)
        self.mask[..., pos] = 0.0
        self.steps += 1
        if not self.use_graph or self.steps == 1:
            return self._forward()
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):  # other threads may use CUDA
                self.logits = self._forward()
        self.graph.replay()
        return self.logits

    def select(self, rows: torch.Tensor) -> StaticDecoder:
        """A decoder for the given batch slots only (their cache and mask carried over)."""
        return StaticDecoder(self.lm, self.cache.select(rows), self.mask[rows], self.use_graph)


@torch.no_grad()
def sample_batch(
    lm: CausalLM,
    jobs: list[SampleJob],
    tokenizer,
    eos_id: int | None,
    max_context: int,
    static: bool | None = None,
    prefixes: Prefixes | None = None,
) -> None:
    """Run every job to completion; each job's `result` is set to a SampleResponse.

    `static` decodes with a `StaticDecoder` (default: on CUDA, where it replays a CUDA graph).
    `prefixes`: the weight version's prefix cache, whose recorded sequences the prompts continue
    from, and which records every row's sequence when the batch is done.
    """
    device = lm.lm_head.weight.device
    for j in jobs:
        if not j.prompt:
            raise ValueError("sample: the prompt is empty")
    # Prefill each distinct prompt once: a GRPO group's rollouts all ask with the same prompt.
    unique: dict[tuple[int, ...], int] = {}
    job_prompt = [unique.setdefault(tuple(j.prompt), len(unique)) for j in jobs]
    prompts = list(unique)
    U = len(prompts)
    lens = [len(p) for p in prompts]
    wants_prompt_lp = [False] * U
    for i, j in enumerate(jobs):
        wants_prompt_lp[job_prompt[i]] |= bool(j.include_prompt_logprobs or j.topk_prompt_logprobs)
    # Different prompts usually open alike (the chat template's system turn): that prefix is run once.
    # (each prompt keeps at least its last token to prefill with its own row)
    shared = min([len(p) - 1 for p in prompts] + [common_prefix_len(prompts[0], p) for p in prompts[1:]])
    shared = shared if U > 1 and shared >= MIN_SHARED else 0
    # A prompt that continues a sequence sampled before (the next turn of a conversation) starts from
    # its keys/values (prefix_cache.py); a prompt whose logprobs are asked for needs every position's
    # hidden state, so it reuses only the opening run in this call.
    reused: list[tuple[Stored | None, int]] = [
        (None, 0) if prefixes is None or wants_prompt_lp[u] else prefixes.longest(p, len(p) - 1)
        for u, p in enumerate(prompts)
    ]
    reused = [(entry, n) if n > shared else (None, shared) for entry, n in reused]
    starts = [n for _, n in reused]  # each prompt's first position to prefill
    C = max(starts)
    P = C + max(n - c for n, c in zip(lens, starts))
    max_new = max((j.params.max_tokens or 256) for j in jobs)
    max_new = max(1, min(max_new, max_context - P)) if max_context > P else 1
    # Row layout: [reused prefix | left padding | rest of the prompt]; padding is never attended to.
    ids = torch.full((U, P), eos_id or 0, dtype=torch.long)
    attn = torch.zeros((U, P + max_new), dtype=torch.long)
    for u, prompt in enumerate(prompts):
        c = starts[u]
        ids[u, :c] = torch.tensor(prompt[:c], dtype=torch.long)
        ids[u, P - (lens[u] - c) : P] = torch.tensor(prompt[c:], dtype=torch.long)
        attn[u, :c] = 1
        attn[u, P - (lens[u] - c) : P] = 1
    ids, attn = ids.to(device), attn.to(device)
    positions = (attn[:, :P].cumsum(-1) - 1).clamp_min(0)
    prompt_at = (
        [  # where each prompt's tokens lie in its cache row (for the prefix cache)
            torch.cat([torch.arange(c), torch.arange(P - (n - c), P)]).to(device) for n, c in zip(lens, starts)
        ]
        if prefixes
        else []
    )
    cache = KVCache.allocate(lm.config, U, P + max_new, device, lm.cache_dtype(device))
    opening_hidden = None
    if any(entry is None and c for entry, c in reused):
        first = KVCache.allocate(lm.config, 1, shared, device, cache.k.dtype)
        opening_hidden = lm(ids[:1, :shared], positions[:1, :shared], causal_mask(attn[:1, :shared], shared), first, 0)
    for u, (entry, c) in enumerate(reused):
        if entry is not None:
            cache.k[:, u, :, :c], cache.v[:, u, :, :c] = entry.keys_values(c)
        elif c:
            cache.k[:, u, :, :c], cache.v[:, u, :, :c] = first.k[:, 0], first.v[:, 0]
    hidden = lm(ids[:, C:], positions[:, C:], causal_mask(attn[:, :P], P - C, C), cache, C)

    prompt_lp: list[np.ndarray | None] = [None] * len(jobs)
    topk: list = [None] * len(jobs)
    for i, j in enumerate(jobs):
        if j.include_prompt_logprobs or j.topk_prompt_logprobs:
            u = job_prompt[i]
            h = hidden[u, attn[u, C:P].bool()]
            if starts[u]:  # the opening, run apart
                h = torch.cat([opening_hidden[0], h])
            lp = lm.logits(h).log_softmax(-1)
            targets = torch.tensor(j.prompt[1:], device=device)
            vals = np.full(lens[u], np.nan, dtype=np.float32)
            vals[1:] = lp[:-1].gather(-1, targets[:, None])[:, 0].cpu().numpy()
            prompt_lp[i] = vals
            if j.topk_prompt_logprobs:
                tv, ti = lp[:-1].topk(j.topk_prompt_logprobs, -1)
                topk[i] = [None] + [list(zip(a, b)) for a, b in zip(ti.tolist(), tv.tolist())]
    last_logits = lm.logits(hidden[:, -1])

    rows: list[_Row] = []
    for i, j in enumerate(jobs):
        stop_ids, stop_strings = _stop_condition(j.params, eos_id)
        budget = min(j.params.max_tokens or 256, max_new)
        for s in range(j.num_samples):
            rows.append(
                _Row(
                    i,
                    s,
                    len(j.prompt),
                    budget,
                    stop_ids,
                    stop_strings,
                    float(j.params.temperature),
                    int(j.params.top_k or -1),
                    float(j.params.top_p if j.params.top_p is not None else 1.0),
                    _generator(j.params.seed, s, device),
                )
            )
    row_prompt = [job_prompt[r.job] for r in rows]
    logits = last_logits
    if row_prompt != list(range(U)):  # else one row per prompt, in order: nothing to copy
        row_job = torch.tensor(row_prompt, device=device)
        cache, attn, logits = cache.select(row_job), attn[row_job], last_logits[row_job]
    slots: list[int | None] = list(range(len(rows)))  # the row in each batch slot; None once it finished
    occupant = list(range(len(rows)))  # the row in each batch slot, finished or not
    record = _Recorder(prefixes, rows, jobs, [prompt_at[u] for u in row_prompt] if prefixes else [], P)
    next_pos = torch.tensor([r.prompt_len for r in rows], device=device)  # position of each row's next token
    static = device.type == "cuda" if static is None else static
    decoder = StaticDecoder.for_rows(lm, cache, attn, graph=device.type == "cuda") if static else None

    for step in range(max_new):
        live = [b for b, a in enumerate(slots) if a is not None]
        all_live = len(live) == len(slots)  # else finished rows are kept in a static decoder's batch
        live_idx = None if all_live else torch.tensor(live, device=device)
        if not all_live:
            logits = logits[live_idx]
        drawn = _draw(logits, [rows[slots[b]] for b in live])
        drawn_lp = logits.gather(-1, drawn[:, None])[:, 0] - logits.logsumexp(-1)
        for b, tok, lp in zip(live, drawn.tolist(), drawn_lp.tolist()):
            r = rows[slots[b]]
            r.tokens.append(tok)
            r.logprobs.append(lp)
            if tok in r.stop_ids:
                r.stop_reason = "stop"
            elif r.stop_strings and any(s in tokenizer.decode(r.tokens[-16:]) for s in r.stop_strings):
                r.stop_reason = "stop"
            elif len(r.tokens) >= r.max_tokens:
                r.stop_reason = "length"
            if r.stop_reason:
                slots[b] = None
        keep = [b for b in live if slots[b] is not None]
        if not keep:
            record(cache if decoder is None else decoder.cache, [(b, occupant[b]) for b in range(len(slots))])
            break
        nxt = (
            drawn
            if all_live
            else torch.zeros(len(slots), dtype=drawn.dtype, device=device).index_copy_(0, live_idx, drawn)
        )
        # Eager decoding drops finished rows at once; a static decoder's fixed batch only when half are gone.
        if len(keep) < len(slots) and (decoder is None or len(keep) <= len(slots) // 2):
            sel = torch.tensor(keep, device=device)
            nxt, next_pos = nxt[sel], next_pos[sel]
            record(
                cache if decoder is None else decoder.cache,
                [(b, occupant[b]) for b, a in enumerate(slots) if a is None],
            )
            slots, occupant = [slots[b] for b in keep], [occupant[b] for b in keep]
            if decoder is None:
                cache, attn = cache.keep(sel), attn[sel]
            else:
                decoder = decoder.select(sel)
        pos = P + step
        if decoder is not None:
            logits = decoder.step(nxt, next_pos, pos)
        else:
            attn[:, pos] = 1
            # One new token per row: it may see every real (non-padding) position so far.
            mask = attn[:, None, None, : pos + 1].bool()
            hidden = lm(nxt[:, None], next_pos[:, None], mask, cache, pos)
            logits = lm.logits(hidden[:, -1])
        next_pos = next_pos + 1
    for r in rows:  # rows cut by the context window
        r.stop_reason = r.stop_reason or "length"
    record.store()

    for i, j in enumerate(jobs):
        seqs = [
            types.SampledSequence(
                stop_reason=r.stop_reason,
                sequence_id=f"s{id(r):x}",
                tokens_np=np.asarray(r.tokens, dtype=np.int32),
                logprobs_np=np.asarray(r.logprobs, dtype=np.float32),
            )
            for r in rows
            if r.job == i
        ]
        j.result = types.SampleResponse(
            sequences=seqs, prompt_logprobs_np=prompt_lp[i], _topk_prompt_logprobs_list=topk[i]
        )
