"""The reuse buffer of test-time discovery: the best constructions so far, reused as starts.

Each group of rollouts starts from one entry of the buffer (its h, its code, its C₅, the
tail of its output) and tries to improve it; the group's best valid children go back in.
Two ways to pick the starting entries for a batch:

- `greedy` (default): slot i takes the i-th best entry, or with probability ε a uniformly
  random one (TTT-Discover's greedy sampler).
- `puct`: score(s) = Q(s) + c·scale·P(s)·√(1 + T)/(1 + n(s)), where Q is the best child's
  value once s has been expanded (else s's own value, value = −C₅), P a rank prior ∝ N − rank,
  scale the spread of values among non-initial entries, n(s) the expansions of s and of its
  descendants, T all expansions. A batch avoids starting two groups on one line of descent.

Only the `children_per_parent` best children of one expansion enter; duplicates are dropped;
the `capacity` best non-initial entries are kept (initial random starts always stay). The
buffer is saved atomically as JSON after every change, so a killed run resumes from it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

Sampler = Literal["greedy", "puct"]


@dataclass
class Entry:
    """One construction in the buffer."""

    id: str
    h: list[float]
    c5: float
    code: str | None = None  # the program that produced h (None for a random start)
    stdout_tail: str = ""
    step: int = -1  # the training step that found it (-1: initial)
    parent_id: str | None = None
    parent_c5: float | None = None
    ancestors: list[str] = field(default_factory=list)  # nearest first
    initial: bool = False
    visits: int = 0  # expansions of this entry and of its descendants
    best_child_c5: float | None = None

    @property
    def value(self) -> float:
        return -self.c5


def _construction_key(h: list[float] | np.ndarray) -> bytes:
    return np.round(np.asarray(h, dtype=np.float64), 12).tobytes()


class ReuseBuffer:
    """Best constructions so far; picks the starting entries of each batch."""

    def __init__(
        self,
        capacity: int,
        epsilon: float = 0.125,
        sampler: Sampler = "greedy",
        puct_c: float = 1.0,
        children_per_parent: int = 2,
        path: Path | None = None,
    ):
        if capacity < 1:
            raise ValueError("buffer capacity must be at least 1")
        self.capacity = capacity
        self.epsilon = epsilon
        self.sampler = sampler
        self.puct_c = puct_c
        self.children_per_parent = children_per_parent
        self.path = path
        self.entries: list[Entry] = []
        self.total_expansions = 0
        self._next_id = 0
        self._visits: dict[str, int] = {}  # kept for evicted ancestors too

    # -- construction -------------------------------------------------------------------
    def new_id(self, step: int) -> str:
        self._next_id += 1
        return f"s{step}-{self._next_id}"

    def add_initial(self, h: np.ndarray, c5: float) -> Entry:
        entry = Entry(id=self.new_id(-1), h=[float(v) for v in h], c5=float(c5), initial=True)
        self.entries.append(entry)
        self.save()
        return entry

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, entry_id: str) -> Entry | None:
        return next((e for e in self.entries if e.id == entry_id), None)

    def best(self) -> Entry:
        return min(self.entries, key=lambda e: e.c5)

    def ranked(self) -> list[Entry]:
        return sorted(self.entries, key=lambda e: e.c5)

    # -- selection ----------------------------------------------------------------------
    def select(self, k: int, rng: np.random.Generator) -> list[Entry]:
        """The starting entries for k groups."""
        if not self.entries:
            raise RuntimeError("the reuse buffer is empty; add an initial construction first")
        if self.sampler == "puct":
            return self._select_puct(k)
        ranked = self.ranked()
        picks = []
        for slot in range(k):
            if rng.random() < self.epsilon:
                picks.append(ranked[int(rng.integers(len(ranked)))])
            else:
                picks.append(ranked[slot % len(ranked)])
        return picks

    def puct_scores(self) -> dict[str, float]:
        n = len(self.entries)
        ranked = self.ranked()
        prior_weight = {e.id: n - rank for rank, e in enumerate(ranked)}
        total_weight = sum(prior_weight.values())
        grown = [e.value for e in self.entries if not e.initial]
        scale = (max(grown) - min(grown)) if len(grown) >= 2 else 0.0
        scale = scale if scale > 0 else 1.0
        explore = math.sqrt(1 + self.total_expansions)
        scores = {}
        for e in self.entries:
            q = -e.best_child_c5 if e.best_child_c5 is not None else e.value
            prior = prior_weight[e.id] / total_weight
            scores[e.id] = q + self.puct_c * scale * prior * explore / (1 + e.visits)
        return scores

    def _select_puct(self, k: int) -> list[Entry]:
        scores = self.puct_scores()
        order = sorted(self.entries, key=lambda e: scores[e.id], reverse=True)

        def related(a: Entry, b: Entry) -> bool:
            return a.id == b.id or a.id in b.ancestors or b.id in a.ancestors

        picks: list[Entry] = []
        for e in order:
            if len(picks) == k:
                break
            if not any(related(e, p) for p in picks):
                picks.append(e)
        i = 0
        while len(picks) < k:  # not enough separate lineages: fill by score
            picks.append(order[i % len(order)])
            i += 1
        return picks

    # -- updates ------------------------------------------------------------------------
    def add_children(
        self, parent_id: str, children: list[tuple[np.ndarray, float, str, str]], step: int
    ) -> list[Entry]:
        """Record one expansion of `parent_id` and keep its best children.

        `children` are the group's valid results: (h, c5, code, stdout_tail). Returns the
        entries that entered the buffer.
        """
        parent = self.get(parent_id)
        ancestors = ([parent_id] + parent.ancestors) if parent else [parent_id]
        self.total_expansions += 1
        for aid in ancestors:
            self._visits[aid] = self._visits.get(aid, 0) + 1
        for e in self.entries:
            e.visits = self._visits.get(e.id, 0)
        if parent and children:
            best = min(c5 for _, c5, _, _ in children)
            if parent.best_child_c5 is None or best < parent.best_child_c5:
                parent.best_child_c5 = best

        existing = {_construction_key(e.h) for e in self.entries}
        added: list[Entry] = []
        for h, c5, code, stdout_tail in sorted(children, key=lambda c: c[1]):
            if len(added) >= self.children_per_parent:
                break
            key = _construction_key(h)
            if key in existing:
                continue
            existing.add(key)
            entry = Entry(
                id=self.new_id(step),
                h=[float(v) for v in h],
                c5=float(c5),
                code=code,
                stdout_tail=stdout_tail,
                step=step,
                parent_id=parent_id,
                parent_c5=parent.c5 if parent else None,
                ancestors=ancestors,
            )
            self.entries.append(entry)
            added.append(entry)
        self._evict()
        self.save()
        return [e for e in added if e in self.entries]

    def _evict(self) -> None:
        grown = sorted((e for e in self.entries if not e.initial), key=lambda e: e.c5)
        keep = {id(e) for e in grown[: self.capacity]}
        self.entries = [e for e in self.entries if e.initial or id(e) in keep]

    # -- persistence --------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "capacity": self.capacity,
            "epsilon": self.epsilon,
            "sampler": self.sampler,
            "puct_c": self.puct_c,
            "children_per_parent": self.children_per_parent,
            "total_expansions": self.total_expansions,
            "next_id": self._next_id,
            "visits": self._visits,
            "entries": [asdict(e) for e in self.entries],
        }

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json()))
        os.replace(tmp, self.path)

    def load(self) -> bool:
        """Restore entries and counters from `path`; False when there is nothing to resume."""
        if self.path is None or not self.path.exists():
            return False
        data = json.loads(self.path.read_text())
        self.entries = [Entry(**e) for e in data["entries"]]
        self.total_expansions = int(data["total_expansions"])
        self._next_id = int(data["next_id"])
        self._visits = {k: int(v) for k, v in data["visits"].items()}
        self._evict()  # a smaller buffer_size on resume takes effect at once
        return bool(self.entries)
