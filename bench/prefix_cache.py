"""Multi-turn episodes with the engine's prefix cache and without it, alternating in one process.

    .venv/bin/python bench/prefix_cache.py [--episodes 8] [--turns 6] [--tokens 64] [--rounds 5] [--threads 2]

SmolLM2-135M-Instruct (the default model), the CPU's default precisions. An episode is what an agent
sends: a chat-template prompt, then every turn the whole conversation so far (the previous prompt,
the reply just sampled, and an observation of 114 tokens) for `--tokens` new tokens at T=1,
no stop tokens. All episodes' requests of a turn are submitted at once, so the engine batches them.
With the cache on (`TINKRL_PREFIX_CACHE_MB`'s default) a turn prefills only what follows the
previous turn's reply; off (`budget_bytes` = 0) it prefills the whole conversation. Per way: the
median seconds of the episodes' turns, generated tokens/s, and the speed-up. Figures:
docs/performance.md, "Prefix cache".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from tinker import types

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import medians  # noqa: E402
from vs_vllm import OBSERVATION  # noqa: E402  (vs_vllm's workload f sends the same tool output)

from tinkrl.local import ServiceClient  # noqa: E402
from tinkrl.local.models import DEFAULT_MODEL  # noqa: E402
from tinkrl.local.prefix_cache import DEFAULT_BUDGET_MB, budget_from_env  # noqa: E402

QUESTIONS = [
    "List the files in the current directory and say which is largest.",
    "Find the failing test in this repository and explain why it fails.",
    "Write a shell command that counts the lines of every Python file.",
    "What does the function parse_config return when the file is empty?",
]


def episodes(sc, tokenizer, n: int, turns: int, tokens: int) -> float:
    """Run `n` episodes of `turns` turns; the wall seconds of all their sampling calls."""
    observation = tokenizer.encode(OBSERVATION)
    convs = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)] + f" (task {i})"}],
                add_generation_prompt=True,
                tokenize=False,
            )
        )
        for i in range(n)
    ]
    params = types.SamplingParams(max_tokens=tokens, temperature=1.0, stop=[])
    t0 = time.perf_counter()
    for _ in range(turns):
        futs = [sc.sample(types.ModelInput.from_ints(c), 1, params) for c in convs]
        replies = [list(f.result().sequences[0].tokens) for f in futs]
        assert all(len(r) == tokens for r in replies)
        convs = [c + r + observation for c, r in zip(convs, replies)]
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sc = ServiceClient(device="cpu").create_sampling_client(base_model=DEFAULT_MODEL)
    tokenizer, cache = sc.get_tokenizer(), sc.engine.prefix_cache
    budget = budget_from_env() or DEFAULT_BUDGET_MB << 20  # on even where the environment turns it off
    ways = {"cache": budget, "no cache": 0}
    times: dict[str, list[float]] = {w: [] for w in ways}
    for r in range(args.rounds + 1):
        for way, bytes_ in ways.items():
            cache.clear()
            cache.budget_bytes = bytes_
            dt = episodes(sc, tokenizer, args.episodes, args.turns, args.tokens)
            if r:  # one warm-up round
                times[way].append(dt)
            print(f"round {r} {way}: {dt:.2f} s", file=sys.stderr, flush=True)
    med = medians(times)
    generated = args.episodes * args.turns * args.tokens
    print(f"{args.episodes} episodes x {args.turns} turns x {args.tokens} tokens, {sc.engine.sampler} sampler")
    for way, s in med.items():
        print(f"{way:>9}: {s:.2f} s, {generated / s:.0f} tok/s")
    print(f"speed-up: {med['no cache'] / med['cache']:.2f}x")


if __name__ == "__main__":
    main()
