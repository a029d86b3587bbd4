"""The engine's prefix cache: a conversation's next turn continues from the keys/values its
previous turn left, and samples what it samples without them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.engine import TEST_DTYPE, TEXTS, TINY, randomize_lora
from tinker import types

from tinkrl.local import ServiceClient
from tinkrl.local.prefix_cache import MAX_ENTRIES, MAX_VERSIONS, PrefixCache, Prefixes, Stored, budget_from_env
from tinkrl.local.sampler import SampleJob, sample_batch


@pytest.fixture(scope="module")
def service():
    return ServiceClient(dtype=TEST_DTYPE)


@pytest.fixture(scope="module")
def sampler(service):
    tc = service.create_lora_training_client(TINY, rank=4, seed=2)
    randomize_lora(tc, scale=0.02, seed=2)
    return tc.save_weights_and_get_sampling_client()


@pytest.fixture(scope="module")
def tok(sampler):
    return sampler.get_tokenizer()


def _run(sc, jobs: list[SampleJob], prefixes: Prefixes | None, static: bool) -> list[types.SampledSequence]:
    engine = sc.engine
    tree = engine.sampler_tree(sc.snapshot)
    engine.submit(
        lambda: sample_batch(
            tree,
            engine.paths,
            jobs,
            engine.tokenizer,
            engine.eos_id,
            engine.max_context,
            static=static,
            prefixes=prefixes,
        )
    ).result()
    return [s for j in jobs for s in j.result.sequences]


@pytest.mark.parametrize("static", [False, True])
def test_the_next_turn_continues_from_the_cache_and_samples_as_without_it(sampler, tok, static, monkeypatch):
    """Turn 1 records every row (its prompt and the tokens it fed: all but the last it drew, as rows
    leave the batch at different steps); turn 2's prompts (prompt + reply + observation) find those
    rows and prefill only the rest, sampling the tokens and logprobs a cache-less call samples; a
    prompt whose logprobs are asked for is prefilled whole and still gets them."""
    cache = PrefixCache(1 << 30)
    prefixes = Prefixes(cache, "v1")
    stop_token = tok.encode(TEXTS[1])[5]
    first = [tok.encode(t)[: 8 + 3 * i] for i, t in enumerate(TEXTS)]
    jobs = [
        SampleJob(p, 2, types.SamplingParams(max_tokens=4 + 3 * i, seed=10 + i, stop=[stop_token]))
        for i, p in enumerate(first)
    ]
    turn1 = _run(sampler, jobs, prefixes, static)
    assert len({len(s.tokens) for s in turn1}) >= 2  # rows left the batch at different steps
    observation = tok.encode(" The tool answered: 42 files, 3 folders.")
    second = [first[i // 2] + list(s.tokens) + observation for i, s in enumerate(turn1)]
    for p in second:
        entry, n = cache.longest("v1", p, len(p) - 1)
        assert n == len(p) - len(observation) - 1  # the reply's last token was drawn, never fed
        assert isinstance(entry, Stored) and list(entry.tokens[:n]) == p[:n]
    assert cache.longest("v2", second[0], len(second[0]) - 1) == (None, 0)  # other weights: nothing

    def jobs2():
        out = [SampleJob(p, 1, types.SamplingParams(max_tokens=6, seed=30 + i)) for i, p in enumerate(second)]
        out.append(SampleJob(second[0], 1, types.SamplingParams(max_tokens=3, seed=7), include_prompt_logprobs=True))
        return out

    reused = []
    keys_values = Stored.keys_values
    monkeypatch.setattr(Stored, "keys_values", lambda self, n: reused.append(n) or keys_values(self, n))
    with_cache_jobs, without_jobs = jobs2(), jobs2()
    with_cache = _run(sampler, with_cache_jobs, prefixes, static)
    assert len(reused) == len({tuple(p) for p in second}) - 1  # every distinct prompt but the logprobs one
    without = _run(sampler, without_jobs, None, static)
    for a, b in zip(with_cache, without):
        assert list(a.tokens) == list(b.tokens) and a.stop_reason == b.stop_reason
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    got, want = with_cache_jobs[-1].result.prompt_logprobs, without_jobs[-1].result.prompt_logprobs
    assert got[0] is None and len(got) == len(second[0])
    np.testing.assert_allclose(np.asarray(got[1:], dtype=np.float64), np.asarray(want[1:], dtype=np.float64), atol=1e-4)


def test_the_engine_keeps_one_cache_per_weight_version(service, sampler, tok):
    """Sampling through a client records its rows under its snapshot's key; a client of other weights
    finds none of them; `TINKRL_PREFIX_CACHE_MB=0` would leave the engine without a cache."""
    cache = sampler.engine.prefix_cache
    cache.clear()
    prompt = tok.encode(TEXTS[0])[:12]
    resp = sampler.sample(types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=5)).result()
    turn2 = prompt + list(resp.sequences[0].tokens)
    assert cache.longest(sampler.snapshot.key, turn2, len(turn2))[1] == len(turn2) - 1
    base = service.create_sampling_client(base_model=TINY)
    assert base.engine is sampler.engine and base.snapshot.key != sampler.snapshot.key
    assert cache.longest(base.snapshot.key, turn2, len(turn2)) == (None, 0)


def _kv(nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch cache [layers 1, rows 2, heads 1, positions, dim 4] of about `nbytes` bytes (k and v)."""
    positions = max(1, nbytes // (2 * 2 * 4 * 4))
    return torch.zeros(1, 2, 1, positions, 4), torch.zeros(1, 2, 1, positions, 4)


def test_lookup_finds_the_longest_recorded_prefix_within_the_limit():
    cache = PrefixCache(1 << 20)
    k, v = _kv(4096)
    cache.add("v", k, v, [([1, 2, 3, 4, 5], 0, torch.arange(5)), ([1, 2, 9], 1, torch.arange(3))])
    assert cache.longest("v", [1, 2, 3, 4, 5, 6], 6)[1] == 5
    assert cache.longest("v", [1, 2, 3, 4, 5, 6], 3)[1] == 3  # the prompt's last token stays to prefill
    entry, n = cache.longest("v", [1, 2, 9, 9], 3)
    assert n == 3 and entry.row == 1
    assert cache.longest("v", [7, 2, 3], 2) == (None, 0)
    kk, vv = entry.keys_values(2)
    assert kk.shape == (1, 1, 2, 4) and vv.shape == (1, 1, 2, 4)


def test_the_budget_evicts_least_recently_used_batches_and_old_versions():
    k, v = _kv(4096)
    per_batch = k.nbytes + v.nbytes
    cache = PrefixCache(2 * per_batch)
    cache.add("v", *_kv(4096), [([1, 1, 1], 0, torch.arange(3))])
    cache.add("v", *_kv(4096), [([2, 2, 2], 0, torch.arange(3))])
    assert cache.longest("v", [1, 1, 1, 5], 3)[1] == 3  # touches the first batch: the second is now oldest
    cache.add("v", *_kv(4096), [([3, 3, 3], 0, torch.arange(3))])
    assert cache.nbytes == 2 * per_batch
    assert [cache.longest("v", [t] * 3, 3)[1] for t in (1, 2, 3)] == [3, 0, 3]
    cache.add("v", *_kv(8 * per_batch), [([4, 4, 4], 0, torch.arange(3))])  # larger than the whole budget
    assert cache.longest("v", [4, 4, 4], 3)[1] == 0 and cache.nbytes == 2 * per_batch

    many = PrefixCache(1 << 30)
    for i in range(MAX_VERSIONS + 2):
        many.add(f"w{i}", *_kv(1024), [([i, i], 0, torch.arange(2))])
    kept = [i for i in range(MAX_VERSIONS + 2) if many.longest(f"w{i}", [i, i], 2)[1]]
    assert kept == list(range(2, MAX_VERSIONS + 2))
    many.clear()
    assert many.nbytes == 0 and many.longest(f"w{MAX_VERSIONS + 1}", [1, 1], 2) == (None, 0)

    rows = PrefixCache(1 << 30)
    per_batch = MAX_ENTRIES // 4
    for i in range(5):
        rows.add("v", *_kv(1024), [([i, j], 0, torch.arange(2)) for j in range(per_batch)])
    assert [rows.longest("v", [i, 0], 2)[1] for i in range(5)] == [0, 2, 2, 2, 2]  # the oldest batch went


def test_a_batch_whose_every_row_goes_on_in_a_newer_one_is_dropped():
    """The next turn's batch holds its conversations' earlier keys and values: the previous turn's batch
    goes once every row of it is continued, and stays while one is not (an episode that ended)."""
    cache = PrefixCache(1 << 30)
    cache.add("v", *_kv(1024), [([1, 2, 3], 0, torch.arange(3)), ([1, 2, 4], 1, torch.arange(3))])
    cache.add("v", *_kv(1024), [([5, 6], 0, torch.arange(2)), ([7, 8], 1, torch.arange(2))])
    cache.add("v", *_kv(1024), [([1, 2, 3, 9, 9], 0, torch.arange(5)), ([5, 6, 9], 1, torch.arange(3))])
    first, _ = cache.longest("v", [1, 2, 4, 0], 3)  # one of its rows did not go on: it stays
    assert first is not None and first.row == 1
    second, n = cache.longest("v", [7, 8, 0], 2)
    assert n == 2 and second.tokens.tolist() == [7, 8]
    cache.add("v", *_kv(1024), [([1, 2, 4, 1], 0, torch.arange(4)), ([7, 8, 1], 1, torch.arange(3))])
    assert cache.longest("v", [1, 2, 4, 0], 3)[0].tokens.tolist() == [1, 2, 4, 1]  # the first batch went
    assert len({id(b) for b in cache._batches()}) == 2  # the third and the fourth (the second went too)
    assert cache.longest("v", [1, 2, 3, 9, 9, 0], 5)[1] == 5


def test_a_versions_prefixes_go_when_its_sampling_clients_do():
    """Entries of a watched version are dropped once every owner watched for it is garbage; another
    version's stay, and a version watched again by a new owner is kept."""

    class Owner:
        pass

    cache = PrefixCache(1 << 30)
    old, twice, new = Owner(), Owner(), Owner()
    cache.watch(old, "v0")
    cache.watch(twice, "v0")
    cache.watch(new, "v1")
    cache.add("v0", *_kv(1024), [([1, 2, 3], 0, torch.arange(3))])
    cache.add("v1", *_kv(1024), [([1, 2, 3], 0, torch.arange(3))])
    del old
    assert cache.longest("v0", [1, 2, 3, 4], 3)[1] == 3  # one owner of v0 is alive still
    del twice
    assert cache.longest("v0", [1, 2, 3, 4], 3) == (None, 0)
    assert cache.longest("v1", [1, 2, 3, 4], 3)[1] == 3 and len(cache._batches()) == 1
    again = Owner()
    cache.watch(again, "v0")
    cache.add("v0", *_kv(1024), [([1, 2, 3], 0, torch.arange(3))])
    assert cache.longest("v0", [1, 2, 3, 4], 3)[1] == 3


def test_the_budget_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("TINKRL_PREFIX_CACHE_MB", "0")
    assert budget_from_env() == 0 and not PrefixCache(budget_from_env()).enabled
    monkeypatch.setenv("TINKRL_PREFIX_CACHE_MB", "1.5")
    assert budget_from_env() == 3 << 19
    for bad in ("lots", "-1"):
        monkeypatch.setenv("TINKRL_PREFIX_CACHE_MB", bad)
        with pytest.raises(ValueError, match="TINKRL_PREFIX_CACHE_MB"):
            budget_from_env()
