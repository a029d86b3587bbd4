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

from tinkrl.local.kernels.paths import Reference
from tinkrl.local.logprobs import log_softmax_chunks
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


def _generator(seed: int | None, sample_index: int) -> torch.Generator | None:
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


@dataclass
class _Layout:
    """The batch's distinct prompts laid out in rows, one per prompt: [reused prefix | left padding |
    rest of the prompt], padding never attended to. Row u's first `starts[u]` positions come from a
    sequence sampled before (`reused[u]`, the prefix cache) or the opening all prompts share
    (`shared` tokens, run once); the rest, from column `C` to `P`, is prefilled."""

    prompts: list[tuple[int, ...]]
    job_prompt: list[int]  # each job's prompt row
    ids: torch.Tensor  # [U, P]
    attn: torch.Tensor  # [U, P + max_new], 1 at real positions
    positions: torch.Tensor  # [U, P]
    reused: list[tuple[Stored | None, int]]
    starts: list[int]
    shared: int
    C: int
    P: int
    max_new: int


def _lay_out(jobs: list[SampleJob], prefixes: Prefixes | None, eos_id: int | None, max_context: int, device) -> _Layout:
    """Each distinct prompt once (a GRPO group's rollouts all ask with the same prompt), the opening the
    prompts share (the chat template's system turn) run once, and a prompt that continues a sequence
    sampled before (the next turn of a conversation) started from its keys and values."""
    unique: dict[tuple[int, ...], int] = {}
    job_prompt = [unique.setdefault(tuple(j.prompt), len(unique)) for j in jobs]
    prompts = list(unique)
    U, lens = len(prompts), [len(p) for p in prompts]
    wants_lp = [False] * U
    for i, j in enumerate(jobs):
        wants_lp[job_prompt[i]] |= bool(j.include_prompt_logprobs or j.topk_prompt_logprobs)
    # each prompt keeps at least its last token to prefill in its own row
    shared = min([n - 1 for n in lens] + [common_prefix_len(prompts[0], p) for p in prompts[1:]])
    shared = shared if U > 1 and shared >= MIN_SHARED else 0
    # a prompt whose logprobs are asked for needs every position's hidden state: it reuses only the opening
    reused: list[tuple[Stored | None, int]] = [
        (None, 0) if prefixes is None or wants_lp[u] else prefixes.longest(p, len(p) - 1) for u, p in enumerate(prompts)
    ]
    reused = [(entry, n) if n > shared else (None, shared) for entry, n in reused]
    starts = [n for _, n in reused]
    C = max(starts)
    P = C + max(n - c for n, c in zip(lens, starts))
    max_new = max((j.params.max_tokens or 256) for j in jobs)
    max_new = max(1, min(max_new, max_context - P)) if max_context > P else 1
    ids = torch.full((U, P), eos_id or 0, dtype=torch.long)
    attn = torch.zeros((U, P + max_new), dtype=torch.long)
    for u, prompt in enumerate(prompts):
        c, rest = starts[u], lens[u] - starts[u]
        ids[u, :c] = torch.tensor(prompt[:c], dtype=torch.long)
        ids[u, P - rest : P] = torch.tensor(prompt[c:], dtype=torch.long)
        attn[u, :c] = 1
        attn[u, P - rest : P] = 1
    ids, attn = ids.to(device), attn.to(device)
    positions = (attn[:, :P].cumsum(-1) - 1).clamp_min(0)
    return _Layout(prompts, job_prompt, ids, attn, positions, reused, starts, shared, C, P, max_new)


def _prefill(lm: CausalLM, paths: Reference, at: _Layout) -> tuple[KVCache, torch.Tensor, torch.Tensor | None]:
    """The prompts' KV cache (reused prefixes copied in, the shared opening run once, the rest prefilled),
    the prefilled positions' hidden states and the opening's (None where it did not run here)."""
    device, U = at.ids.device, len(at.prompts)
    cache = KVCache.allocate(lm.config, U, at.P + at.max_new, device, paths.kv_dtype)
    opening_hidden = None
    if any(entry is None and c for entry, c in at.reused):
        n = at.shared
        first = KVCache.allocate(lm.config, 1, n, device, cache.k.dtype)
        opening_hidden = paths.prefill(
            lm, at.ids[:1, :n], at.positions[:1, :n], causal_mask(at.attn[:1, :n], n), first, 0
        )
    for u, (entry, c) in enumerate(at.reused):
        if entry is not None:
            cache.k[:, u, :, :c], cache.v[:, u, :, :c] = entry.keys_values(c)
        elif c:
            cache.k[:, u, :, :c], cache.v[:, u, :, :c] = first.k[:, 0], first.v[:, 0]
    C, P = at.C, at.P
    hidden = paths.prefill(lm, at.ids[:, C:], at.positions[:, C:], causal_mask(at.attn[:, :P], P - C, C), cache, C)
    return cache, hidden, opening_hidden


def _prompt_logprobs(lm: CausalLM, paths: Reference, jobs: list[SampleJob], at: _Layout, hidden, opening_hidden):
    """Each job's prompt logprobs (NaN first) and top-k prompt logprobs, where asked for (else None)."""
    prompt_lp: list[np.ndarray | None] = [None] * len(jobs)
    topk: list = [None] * len(jobs)
    for i, j in enumerate(jobs):
        if not (j.include_prompt_logprobs or j.topk_prompt_logprobs):
            continue
        u = at.job_prompt[i]
        h = hidden[u, at.attn[u, at.C : at.P].bool()]
        if at.starts[u]:  # the opening, run apart
            h = torch.cat([opening_hidden[0], h])
        targets = torch.tensor(j.prompt[1:], device=h.device)
        vals = np.full(len(j.prompt), np.nan, dtype=np.float32)
        k, picked, top = 0, [], [None]  # position k's logits give token k+1's logprob
        for lp in log_softmax_chunks(lambda x: paths.logits(lm, x), h[:-1], lm.config.vocab_size):
            picked.append(lp.gather(-1, targets[k : k + lp.shape[0], None])[:, 0])
            if j.topk_prompt_logprobs:
                tv, ti = lp.topk(j.topk_prompt_logprobs, -1)
                top += [list(zip(a, b)) for a, b in zip(ti.tolist(), tv.tolist())]
            k += lp.shape[0]
        if picked:
            vals[1:] = torch.cat(picked).cpu().numpy()
        prompt_lp[i] = vals
        topk[i] = top if j.topk_prompt_logprobs else None
    return prompt_lp, topk


def _rows(jobs: list[SampleJob], max_new: int, eos_id: int | None) -> list[_Row]:
    """One row per sample of every job, with its stop condition, token budget and draw settings."""
    rows: list[_Row] = []
    for i, j in enumerate(jobs):
        stop_ids, stop_strings = _stop_condition(j.params, eos_id)
        budget = min(j.params.max_tokens or 256, max_new)
        p = j.params
        for s in range(j.num_samples):
            top_p = float(p.top_p if p.top_p is not None else 1.0)
            rows.append(
                _Row(i, len(j.prompt), budget, stop_ids, stop_strings, float(p.temperature), int(p.top_k or -1),
                     top_p, _generator(p.seed, s))
            )  # fmt: skip
    return rows


def _ends(r: _Row, tokenizer) -> str | None:
    """Why row `r` stops after its last token ("stop", "length"), or None."""
    if r.tokens[-1] in r.stop_ids:
        return "stop"
    if r.stop_strings and any(s in tokenizer.decode(r.tokens[-16:]) for s in r.stop_strings):
        return "stop"
    return "length" if len(r.tokens) >= r.max_tokens else None


def _decode(lm: CausalLM, paths: Reference, rows: list[_Row], at: _Layout, cache: KVCache, logits, tokenizer,
            record: _Recorder, static: bool) -> None:  # fmt: skip
    """Draw every row's tokens in lock-step until each stops: finished rows leave the batch (a static
    decoder's fixed batch only once half are gone), and their sequences are recorded as they leave."""
    device = logits.device
    attn = at.attn
    row_prompt = [at.job_prompt[r.job] for r in rows]
    if row_prompt != list(range(len(at.prompts))):  # else one row per prompt, in order: nothing to copy
        row_job = torch.tensor(row_prompt, device=device)
        cache, attn, logits = cache.select(row_job), attn[row_job], logits[row_job]
    slots: list[int | None] = list(range(len(rows)))  # the row in each batch slot; None once it finished
    occupant = list(range(len(rows)))  # the row in each batch slot, finished or not
    next_pos = torch.tensor([r.prompt_len for r in rows], device=device)  # position of each row's next token
    decoder = StaticDecoder.for_rows(lm, cache, attn, graph=device.type == "cuda") if static else None
    for step in range(at.max_new):
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
            r.stop_reason = _ends(r, tokenizer)
            if r.stop_reason:
                slots[b] = None
        keep = [b for b in live if slots[b] is not None]
        if not keep:
            record(cache if decoder is None else decoder.cache, [(b, occupant[b]) for b in range(len(slots))])
            return
        nxt = (
            drawn
            if all_live
            else torch.zeros(len(slots), dtype=drawn.dtype, device=device).index_copy_(0, live_idx, drawn)
        )
        if len(keep) < len(slots) and (decoder is None or len(keep) <= len(slots) // 2):
            sel = torch.tensor(keep, device=device)
            nxt, next_pos = nxt[sel], next_pos[sel]
            record(
                cache if decoder is None else decoder.cache,
                [(b, occupant[b]) for b, a in enumerate(slots) if a is None],
            )
            slots, occupant = [slots[b] for b in keep], [occupant[b] for b in keep]
            if decoder is not None:
                decoder = decoder.select(sel)
            else:
                cache, attn = (cache.keep(sel) if paths.rows_in_place else cache.select(sel)), attn[sel]
        pos = at.P + step
        if decoder is not None:
            logits = decoder.step(nxt, next_pos, pos)
        else:
            attn[:, pos] = 1
            # one new token per row: it may see every real (non-padding) position so far
            hidden = paths.decode(
                lm, nxt[:, None], next_pos[:, None], attn[:, None, None, : pos + 1].bool(), cache, pos
            )
            logits = paths.logits(lm, hidden[:, -1])
        next_pos = next_pos + 1


@torch.no_grad()
def sample_batch(
    lm: CausalLM,
    paths: Reference,
    jobs: list[SampleJob],
    tokenizer,
    eos_id: int | None,
    max_context: int,
    static: bool | None = None,
    prefixes: Prefixes | None = None,
) -> None:
    """Run every job to completion through `paths` (the plan's path through `lm`); each job's `result` is
    set to a SampleResponse: lay the prompts out, prefill them, take the prompt logprobs asked for, then
    decode every row until it stops.

    `static` decodes with a `StaticDecoder` (default: on CUDA, where it replays a CUDA graph).
    `prefixes`: the weight version's prefix cache, whose recorded sequences the prompts continue
    from, and which records every row's sequence when the batch is done.
    """
    device = lm.lm_head.weight.device
    if any(not j.prompt for j in jobs):
        raise ValueError("sample: the prompt is empty")
    at = _lay_out(jobs, prefixes, eos_id, max_context, device)
    cache, hidden, opening_hidden = _prefill(lm, paths, at)
    prompt_lp, topk = _prompt_logprobs(lm, paths, jobs, at, hidden, opening_hidden)
    rows = _rows(jobs, at.max_new, eos_id)
    prompt_at = [  # where each prompt's tokens lie in its cache row (for the prefix cache)
        torch.cat([torch.arange(c), torch.arange(at.P - (len(p) - c), at.P)]).to(device)
        for p, c in zip(at.prompts, at.starts)
    ]
    record = _Recorder(prefixes, rows, jobs, [prompt_at[at.job_prompt[r.job]] for r in rows] if prefixes else [], at.P)
    static = device.type == "cuda" if static is None else static
    _decode(lm, paths, rows, at, cache, paths.logits(lm, hidden[:, -1]), tokenizer, record, static)
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
