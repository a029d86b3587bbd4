"""Token logprobs from final hidden states, a chunk of positions at a time.

A model's logits for N positions are an [N x vocab] fp32 tensor, four bytes per vocabulary entry a
position, and a loss's backward holds their softmax and gradient as well: for long sequences more
than the rest of a LoRA step. Here no more than `chunk_rows(vocab)` positions' logits are alive at
once, in the forward or the backward: each chunk's head product runs under activation checkpointing
when there is more than one chunk (its logits recomputed in the backward, one chunk at a time), so a
batch that fits in one chunk, as a short RL step's does, computes exactly as one call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.utils.checkpoint import checkpoint

# The fp32 logits one chunk may hold (its softmax and gradient in the backward come on top).
LOGITS_CHUNK_BYTES = 128 << 20

Head = Callable[[torch.Tensor], torch.Tensor]  # hidden states [n, d] -> fp32 logits [n, vocab]


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[target] per row, without materialising the vocabulary-wide log_softmax."""
    return logits.gather(-1, targets[:, None])[:, 0] - logits.logsumexp(-1)


def chunk_rows(vocab: int) -> int:
    """How many positions' logits make up one chunk (at least one)."""
    return max(1, LOGITS_CHUNK_BYTES // (4 * vocab))


def target_logprobs(
    head: Head,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    vocab: int,
    select: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = token_logprobs,
) -> torch.Tensor:
    """`select(head(hidden), targets)` (default: each target's logprob) for hidden states [N, d] and
    targets [N], chunk by chunk: differentiable in `hidden` and the head's trainable weights, with at
    most one chunk's logits alive."""

    def part(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return select(head(h), t)

    rows = chunk_rows(vocab)
    if hidden.shape[0] <= rows:
        return part(hidden, targets)
    recompute = torch.is_grad_enabled()
    out = []
    for h, t in zip(hidden.split(rows), targets.split(rows), strict=True):
        out.append(checkpoint(part, h, t, use_reentrant=False) if recompute else part(h, t))
    return torch.cat(out)


def log_softmax_chunks(head: Head, hidden: torch.Tensor, vocab: int) -> Iterator[torch.Tensor]:
    """log_softmax of the logits of hidden states [N, d], `chunk_rows(vocab)` rows at a time (no grad):
    for prompt logprobs and their top-k."""
    with torch.no_grad():
        for h in hidden.split(chunk_rows(vocab)):
            yield head(h).log_softmax(-1)
