"""Keys and values of sequences sampled before, kept across sampling calls (a prefix cache).

A multi-turn agent sends its whole conversation with every turn: the previous turn's prompt,
the reply just sampled and the new observation. Without a cache every turn prefills all of
it again, so an episode's prefill grows with the square of its turns. The sampler records,
for every row it decodes, where that row's keys and values lie (`Stored`: its prompt and
the tokens it fed, in the batch's own KV-cache tensors, which are kept instead of freed), and
the next call prefills only what follows the longest recorded prefix of each prompt.

Entries belong to one weight version (the engine's snapshot key): keys and values computed
by other weights are never reused. The cache holds batch caches whole and evicts them least
recently used first, within a byte budget (`TINKRL_PREFIX_CACHE_MB`, default 1024; 0 turns it
off), `MAX_ENTRIES` rows and `MAX_VERSIONS` weight versions, since training moves on to new
weights every step.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

MAX_VERSIONS = 4  # weight versions with entries: the current one and a few an off-policy sampler still uses
MAX_ENTRIES = 1024  # recorded rows in all: a lookup compares a prompt with every row of its version
DEFAULT_BUDGET_MB = 1024


def budget_from_env() -> int:
    """The cache's byte budget: `TINKRL_PREFIX_CACHE_MB` (0 turns the cache off), else the default."""
    raw = os.environ.get("TINKRL_PREFIX_CACHE_MB", "").strip()
    if not raw:
        return DEFAULT_BUDGET_MB << 20
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(
            f"TINKRL_PREFIX_CACHE_MB={raw!r}: expected a number of megabytes (0 turns the cache off)"
        ) from None
    if mb < 0:
        raise ValueError(f"TINKRL_PREFIX_CACHE_MB={raw!r}: expected 0 or more megabytes")
    return int(mb * (1 << 20))


@dataclass
class _Batch:
    """One sampling batch's KV-cache tensors ([layers, rows, kv_heads, positions, head_dim]), kept whole,
    and how many of its rows are recorded (its entries, all dropped with it)."""

    version: str
    k: torch.Tensor
    v: torch.Tensor
    last_used: int
    recorded: int

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


@dataclass
class Stored:
    """One row's sequence: `tokens` have their keys/values in `batch`'s cache row `row`, at `positions`."""

    tokens: np.ndarray
    batch: _Batch
    row: int
    positions: torch.Tensor = field(repr=False)

    def keys_values(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values [layers, kv_heads, n, head_dim] of the first `n` tokens."""
        at = self.positions[:n]
        return self.batch.k[:, self.row][:, :, at], self.batch.v[:, self.row][:, :, at]


class PrefixCache:
    """Recorded sequences per weight version; `longest` finds a prompt's longest recorded prefix."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._entries: dict[str, list[Stored]] = {}
        self._tokens: dict[str, np.ndarray] = {}  # per version: the entries' tokens, padded with -1
        self._clock = 0

    @property
    def enabled(self) -> bool:
        """Whether the cache keeps anything (a budget above 0)."""
        return self.budget_bytes > 0

    @property
    def nbytes(self) -> int:
        """Bytes held: the kept batch caches."""
        return sum(b.nbytes for b in self._batches())

    def clear(self) -> None:
        """Forget every entry and free the kept caches."""
        self._entries.clear()
        self._tokens.clear()

    def longest(self, version: str, prompt: Sequence[int], limit: int) -> tuple[Stored | None, int]:
        """The entry sharing the most leading tokens with `prompt` (at most `limit`), and how many."""
        entries = self._entries.get(version)
        if not entries or limit <= 0:
            return None, 0
        table = self._tokens.get(version)
        if table is None:
            width = max(len(e.tokens) for e in entries)
            table = np.full((len(entries), width), -1, dtype=np.int64)
            for i, e in enumerate(entries):
                table[i, : len(e.tokens)] = e.tokens
            self._tokens[version] = table
        n = min(limit, table.shape[1])
        same = table[:, :n] == np.asarray(prompt[:n], dtype=np.int64)[None]
        shared = np.where(same.all(1), n, same.argmin(1))
        best = int(shared.argmax())
        if shared[best] == 0:
            return None, 0
        self._clock += 1
        entries[best].batch.last_used = self._clock
        return entries[best], int(shared[best])

    def add(self, version: str, k: torch.Tensor, v: torch.Tensor, rows: list[tuple[Sequence[int], int, torch.Tensor]]):
        """Record a batch's rows: (tokens, cache row, positions of those tokens in the row) each,
        in the batch's KV-cache tensors `k`/`v`, which the cache then keeps (never written again)."""
        if not self.enabled or not rows:
            return
        self._clock += 1
        batch = _Batch(version, k, v, self._clock, len(rows))
        if batch.nbytes > self.budget_bytes:
            return
        entries = self._entries.setdefault(version, [])
        entries.extend(Stored(np.asarray(t, dtype=np.int64), batch, row, at) for t, row, at in rows)
        self._tokens.pop(version, None)
        self._evict()

    def _batches(self) -> list[_Batch]:
        unique = {id(e.batch): e.batch for entries in self._entries.values() for e in entries}
        return list(unique.values())

    def _evict(self) -> None:
        """Drop the least recently used batches beyond the byte budget, `MAX_ENTRIES` rows or
        `MAX_VERSIONS` versions."""
        batches = sorted(self._batches(), key=lambda b: b.last_used)
        recent_versions: list[str] = []
        for b in reversed(batches):
            if b.version not in recent_versions:
                recent_versions.append(b.version)
        dropped = {id(b) for b in batches if b.version not in recent_versions[:MAX_VERSIONS]}
        total = sum(b.nbytes for b in batches if id(b) not in dropped)
        count = sum(b.recorded for b in batches if id(b) not in dropped)
        for b in batches:
            if total <= self.budget_bytes and count <= MAX_ENTRIES:
                break
            if id(b) not in dropped:
                dropped.add(id(b))
                total, count = total - b.nbytes, count - b.recorded
        if not dropped:
            return
        for version in list(self._entries):
            kept = [e for e in self._entries[version] if id(e.batch) not in dropped]
            if len(kept) != len(self._entries[version]):
                self._tokens.pop(version, None)
            if kept:
                self._entries[version] = kept
            else:
                del self._entries[version]


class Prefixes:
    """One weight version's view of a `PrefixCache`: what `sampler.sample_batch` looks up and records."""

    def __init__(self, cache: PrefixCache, version: str):
        self.cache, self.version = cache, version

    def longest(self, prompt: Sequence[int], limit: int) -> tuple[Stored | None, int]:
        """The recorded sequence sharing the most leading tokens with `prompt` (at most `limit`), and how many."""
        return self.cache.longest(self.version, prompt, limit)

    def add(self, k: torch.Tensor, v: torch.Tensor, rows: list[tuple[Sequence[int], int, torch.Tensor]]) -> None:
        """Record rows of the KV cache `k`/`v` (see `PrefixCache.add`)."""
        self.cache.add(self.version, k, v, rows)
