"""The reuse buffer: greedy/ε selection, capacity and dedupe, PUCT, persistence."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tinkrl.envs.erdos import overlap as em
from tinkrl.envs.erdos.buffer import ReuseBuffer


def _child(rng: np.random.Generator, n: int = 20):
    h = em.random_construction(n, rng)
    return h, em.c5(h), "def run():\n    return initial_h_values", "out"


def _filled(tmp_path=None, capacity=4, epsilon=0.0, sampler="greedy", seed=0):
    rng = np.random.default_rng(seed)
    buf = ReuseBuffer(
        capacity, epsilon, sampler=sampler, children_per_parent=8, path=(tmp_path / "buffer.json") if tmp_path else None
    )
    h0 = em.random_construction(20, rng)
    root = buf.add_initial(h0, em.c5(h0))
    buf.add_children(root.id, [_child(rng) for _ in range(6)], step=0)
    return buf, root


def test_greedy_slots_take_the_best_in_order_without_epsilon():
    buf, _ = _filled(capacity=4, epsilon=0.0)
    ranked = buf.ranked()
    picks = buf.select(7, np.random.default_rng(0))
    assert [p.id for p in picks] == [ranked[i % len(ranked)].id for i in range(7)]
    assert picks[0].c5 == min(e.c5 for e in buf.entries)


def test_epsilon_picks_random_entries_at_its_rate():
    buf, _ = _filled(capacity=4, epsilon=0.25)
    best = buf.best().id
    rng = np.random.default_rng(1)
    # Slot 0 is the best entry unless the ε branch fires (and then picks best with prob 1/5).
    n, other = 4000, 0
    for _ in range(n):
        other += buf.select(1, rng)[0].id != best
    expected = 0.25 * (1 - 1 / len(buf))
    assert abs(other / n - expected) < 0.03
    always_random = ReuseBuffer(4, epsilon=1.0)
    always_random.entries = buf.entries
    seen = {always_random.select(1, rng)[0].id for _ in range(300)}
    assert seen == {e.id for e in buf.entries}


def test_capacity_keeps_the_best_and_the_initial_start():
    buf, root = _filled(capacity=4)
    grown = [e for e in buf.entries if not e.initial]
    assert len(grown) == 4 and buf.get(root.id) is not None
    # A much better child evicts the worst grown entry.
    worst = max(grown, key=lambda e: e.c5)
    good = np.r_[np.full(10, 2 / 3), np.full(10, 1 / 3)]
    buf.add_children(grown[0].id, [(good, em.c5(good), "code", "")], step=1)
    assert buf.best().c5 == pytest.approx(4 / 9)
    assert buf.get(worst.id) is None and len([e for e in buf.entries if not e.initial]) == 4
    assert buf.best().ancestors == [grown[0].id, root.id]
    assert buf.best().parent_c5 == grown[0].c5


def test_only_the_best_children_of_a_group_enter_and_duplicates_are_dropped():
    rng = np.random.default_rng(2)
    buf = ReuseBuffer(16, 0.0, children_per_parent=2)
    h0 = em.random_construction(20, rng)
    root = buf.add_initial(h0, em.c5(h0))
    kids = [_child(rng) for _ in range(5)]
    added = buf.add_children(root.id, kids + [kids[0]], step=0)
    assert sorted(e.c5 for e in added) == sorted(c[1] for c in kids)[:2]
    best_kid = min(kids, key=lambda c: c[1])
    again = buf.add_children(root.id, [best_kid, (h0.copy(), em.c5(h0), "dup of root", "")], step=1)
    assert again == []  # both constructions are already in the buffer
    assert sum(1 for e in buf.entries if np.allclose(e.h, h0)) == 1


def test_puct_counts_expansions_up_the_lineage_and_separates_lineages():
    buf, root = _filled(capacity=6, sampler="puct")
    child = buf.ranked()[0]
    rng = np.random.default_rng(3)
    buf.add_children(child.id, [_child(rng)], step=1)
    assert buf.total_expansions == 2
    assert buf.get(root.id).visits == 2 and buf.get(child.id).visits == 1
    picks = buf.select(3, rng)
    for i, a in enumerate(picks):
        for b in picks[i + 1 :]:
            assert a.id not in b.ancestors and b.id not in a.ancestors and a.id != b.id
    scores = buf.puct_scores()
    assert [p.id for p in picks][0] == max(scores, key=scores.get)


def test_puct_prefers_unexpanded_entries_over_a_heavily_visited_one():
    buf, root = _filled(capacity=6, sampler="puct")
    best = buf.ranked()[0]
    second = buf.ranked()[1]
    scores_before = buf.puct_scores()
    for step in range(30):  # expand the best entry many times without improvement
        buf.add_children(best.id, [], step=step + 1)
    scores_after = buf.puct_scores()
    # The explored entry's bonus shrinks; an unexplored one's grows with the total T.
    assert scores_after[best.id] - best.value < scores_before[best.id] - best.value
    assert scores_after[second.id] - second.value > scores_before[second.id] - second.value
    assert buf.select(1, np.random.default_rng(0))[0].id != best.id


def test_buffer_persists_and_resumes(tmp_path):
    buf, root = _filled(tmp_path, capacity=3)
    saved = json.loads((tmp_path / "buffer.json").read_text())
    assert len(saved["entries"]) == len(buf) == 4
    assert not list(tmp_path.glob("*.tmp"))
    again = ReuseBuffer(3, 0.0, path=tmp_path / "buffer.json")
    assert again.load()
    assert [e.id for e in again.entries] == [e.id for e in buf.entries]
    assert again.best().c5 == buf.best().c5 and again.best().h == buf.best().h
    new = again.add_children(again.best().id, [_child(np.random.default_rng(9))], step=2)
    assert all(e.id not in {x.id for x in buf.entries} for e in new)
    smaller = ReuseBuffer(1, 0.0, path=tmp_path / "buffer.json")
    assert smaller.load() and len([e for e in smaller.entries if not e.initial]) == 1
    assert not ReuseBuffer(3, path=tmp_path / "absent.json").load()
