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
weights every step. Two kinds of batch go at once, since no lookup could want them: one whose
every row a newer row continues (the previous turn of conversations that went on: the newer batch
holds those keys and values too), and every batch of a version whose sampling clients are all
gone (`watch`), which is what an on-policy run's previous step leaves behind.
"""

from __future__ import annotations

import os
import threading
import weakref
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
    """One row's sequence: `tokens` have their keys/values in `batch`'s cache row `row`, at `positions`;
    `continued` once a newer row starts with them."""

    tokens: np.ndarray
    batch: _Batch
    row: int
    positions: torch.Tensor = field(repr=False)
    continued: bool = False

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
        self._lock = threading.Lock()  # owners die on whichever thread drops them last
        self._owners: dict[int, str] = {}  # id of each watched owner: its version
        self._live: dict[str, int] = {}  # per watched version: how many of its owners are alive
        self._gone: set[str] = set()  # watched versions without owners, dropped at the next add or lookup

    @property
    def enabled(self) -> bool:
        """Whether the cache keeps anything (a budget above 0)."""
        return self.budget_bytes > 0

    @property
    def nbytes(self) -> int:
        """Bytes held: the kept batch caches."""
        return sum(b.nbytes for b in self._batches())

    def watch(self, owner: object, version: str) -> None:
        """Drop `version`'s entries once `owner` (a sampling client's snapshot), and every other owner
        watched for it, is garbage. A version never watched stays until evicted."""
        with self._lock:
            if id(owner) in self._owners:
                return
            self._owners[id(owner)] = version
            self._live[version] = self._live.get(version, 0) + 1
            self._gone.discard(version)
        weakref.finalize(owner, self._owner_gone, id(owner), version)

    def _owner_gone(self, owner_id: int, version: str) -> None:
        with self._lock:
            self._owners.pop(owner_id, None)
            self._live[version] -= 1
            if self._live[version] == 0:
                del self._live[version]
                self._gone.add(version)

    def _drop_gone(self) -> None:
        """Forget the entries of versions whose owners are all gone (on the thread that uses the cache)."""
        with self._lock:
            gone, self._gone = self._gone, set()
        for version in gone:
            self._entries.pop(version, None)
            self._tokens.pop(version, None)

    def clear(self) -> None:
        """Forget every entry and free the kept caches."""
        self._entries.clear()
        self._tokens.clear()

    def longest(self, version: str, prompt: Sequence[int], limit: int) -> tuple[Stored | None, int]:
        """The entry sharing the most leading tokens with `prompt` (at most `limit`), and how many."""
        self._drop_gone()
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
        self._drop_gone()
        self._clock += 1
        batch = _Batch(version, k, v, self._clock, len(rows))
        if batch.nbytes > self.budget_bytes:
            return
        new = [Stored(np.asarray(t, dtype=np.int64), batch, row, at) for t, row, at in rows]
        entries = self._entries.get(version, [])
        dropped = _continued(entries, new)
        self._entries[version] = [e for e in entries if id(e.batch) not in dropped] + new
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


def _continued(older: list[Stored], newer: list[Stored]) -> set[int]:
    """Mark the `older` entries a `newer` row continues, and return the ids of the batches all of whose
    rows are now marked: newer batches hold those keys and values too, so no lookup would choose them."""
    for e in older:
        n = len(e.tokens)
        e.continued = e.continued or any(len(f.tokens) >= n and np.array_equal(f.tokens[:n], e.tokens) for f in newer)
    batches: dict[int, bool] = {}
    for e in older:
        batches[id(e.batch)] = batches.get(id(e.batch), True) and e.continued
    return {b for b, all_continued in batches.items() if all_continued}


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
