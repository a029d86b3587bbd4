"""Prefix-shared packing for training: datums that start alike run their common prefix once.

A GRPO group's datums share the prompt (often most of each sequence). Instead of running
the prompt once per datum, a pack lays out the shared prefix once followed by each member's
own suffix; an attention mask lets every suffix token see the shared prefix and the earlier
tokens of its own suffix only, and positions restart after the prefix for each member. The
result per datum is exactly the forward of that datum alone (same tokens, positions and
visible context), at a fraction of the compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class Pack:
    """One packed row: the shared prefix once, then each member's suffix, with positions and segment ids."""

    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    segment: list[int] = field(default_factory=list)  # 0 = shared prefix, k > 0 = the k-th member's suffix
    members: list[tuple[int, list[int]]] = field(default_factory=list)  # (datum index, its packed positions)


MIN_SHARED = 8  # fewer common leading tokens aren't worth running apart once


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _make_pack(seqs: list[list[int]], idx: list[int], shared: int) -> Pack:
    p = Pack()
    p.tokens = list(seqs[idx[0]][:shared])
    p.positions = list(range(shared))
    p.segment = [0] * shared
    for k, i in enumerate(idx, start=1):
        suffix = seqs[i][shared:]
        start = len(p.tokens)
        p.tokens += suffix
        p.positions += list(range(shared, shared + len(suffix)))
        p.segment += [k] * len(suffix)
        p.members.append((i, list(range(shared)) + list(range(start, start + len(suffix)))))
    return p


def _pack_size(lens: list[int], shared: int) -> int:
    """Tokens a pack of sequences of these lengths runs when they share `shared` leading tokens."""
    return sum(lens) if len(lens) == 1 else shared + sum(n - shared for n in lens)


def pack_sequences(seqs: list[list[int]], min_shared: int = MIN_SHARED, max_tokens: int = 4096) -> list[Pack]:
    """Group sequences with a common prefix of at least `min_shared` tokens into packs.

    A sequence joins the current pack only if that runs fewer tokens than starting a new
    pack: GRPO groups of different prompts share the chat template's opening, but merging
    them would shorten every member's shared prefix to it and make one long pack whose
    attention (quadratic in its length) costs more than the few tokens saved.
    """
    order = sorted(range(len(seqs)), key=lambda i: seqs[i])
    packs: list[Pack] = []
    cur: list[int] = []
    shared = 0
    for pos, i in enumerate(order):
        if cur:
            new_shared = min(shared, common_prefix_len(seqs[cur[0]], seqs[i]))
            lens = [len(seqs[j]) for j in cur]
            size = _pack_size(lens + [len(seqs[i])], new_shared)
            apart = _pack_size(lens, shared) + len(seqs[i])
            # a sequence sharing more with the next one (its own group) starts that group's pack
            closer_to_next = pos + 1 < len(order) and common_prefix_len(seqs[i], seqs[order[pos + 1]]) > new_shared
            if new_shared >= min_shared and size <= max_tokens and size < apart and not closer_to_next:
                cur.append(i)
                shared = new_shared
                continue
            packs.append(_make_pack(seqs, cur, shared if len(cur) > 1 else 0))
        cur, shared = [i], len(seqs[i])
    if cur:
        packs.append(_make_pack(seqs, cur, shared if len(cur) > 1 else 0))
    return packs


def plain_causal(packs: list[Pack]) -> bool:
    """Whether a micro-batch's rows are each one whole sequence of the same length: plain causal
    attention, which needs no [S, S] mask (`pack_tensors`' mask is then all causal)."""
    return len({len(p.tokens) for p in packs}) == 1 and all(len(p.members) == 1 for p in packs)


def batch_packs(packs: list[Pack], max_tokens: int = 4096) -> list[list[Pack]]:
    """Micro-batches of packs whose padded size stays within `max_tokens`."""
    batches: list[list[Pack]] = []
    cur: list[Pack] = []
    longest = 0
    for p in sorted(packs, key=lambda p: len(p.tokens)):
        n = len(p.tokens)
        if cur and max(longest, n) * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(p)
        longest = max(longest, n)
    return batches + ([cur] if cur else [])


def pack_tensors(
    packs: list[Pack], device, with_mask: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """ids [B, S], positions [B, S], boolean attention mask [B, 1, S, S] (padding sees only itself); without
    `with_mask`, None for the mask (rows that `plain_causal` says need none)."""
    S = max(len(p.tokens) for p in packs)
    B = len(packs)
    ids = torch.zeros(B, S, dtype=torch.long)
    pos = torch.zeros(B, S, dtype=torch.long)
    seg = torch.full((B, S), -1, dtype=torch.long)
    for b, p in enumerate(packs):
        n = len(p.tokens)
        ids[b, :n] = torch.tensor(p.tokens)
        pos[b, :n] = torch.tensor(p.positions)
        seg[b, :n] = torch.tensor(p.segment)
    if not with_mask:
        return ids.to(device), pos.to(device), None
    q = torch.arange(S)
    causal = (q[None, :] <= q[:, None])[None]  # [1, S(query), S(key)]
    seg_q, seg_k = seg[:, :, None], seg[:, None, :]
    visible = (seg_k == 0) | (seg_k == seg_q)
    mask = causal & visible & (seg_k >= 0) & (seg_q >= 0)
    mask |= torch.eye(S, dtype=torch.bool)[None]
    return ids.to(device), pos.to(device), mask[:, None].to(device)


def shared_opening(packs: list[Pack], min_shared: int = MIN_SHARED) -> int:
    """Leading tokens every pack of a micro-batch shares inside its own shared prefix (0 if < min_shared).

    Those positions are visible to every later token of their pack, so they can run once for
    the whole micro-batch (`CausalLM.forward_shared_prefix`). Each pack keeps at least one
    token of its own.
    """
    if len(packs) < 2:
        return 0
    first = packs[0].tokens
    n = len(first)
    for p in packs:
        # seen by all members: a pack's shared prefix; a lone sequence's tokens but its last
        visible_to_all = p.segment.count(0) if len(p.members) > 1 else len(p.tokens) - 1
        n = min(n, visible_to_all, common_prefix_len(first, p.tokens))
    return n if n >= min_shared else 0
