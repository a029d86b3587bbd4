"""Decode attention on CPU: torch's kernel against tinkrl's (tinkrl/local/decode_attention.c).

    .venv/bin/python bench/decode_attention.py [--rounds 15] [--threads 2]

One decode step's attention over all 30 layers of SmolLM2-135M's shape (9 query heads, 3 KV heads,
head_dim 64), each layer's KV cache its own tensor (as in the sampler: a step reads 30 layers'
caches, which do not stay in the CPU's caches), a few padding positions masked in every row. Per
(rows, cached positions): the median milliseconds of torch's `scaled_dot_product_attention`, of the
kernel, and of reading the same keys and values once (`sum`, a floor set by the memory), the
rounds interleaved. Then what dropping 4 finished rows of 64 costs: copying the cache
(`KVCache.select`, the only way with torch's kernel) against keeping the rows in place
(`KVCache.keep`). Figures: docs/performance.md, "Decode attention".
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tinkrl.local.decode_attention import decode_attention, load_kernel  # noqa: E402
from tinkrl.local.transformer import KVCache  # noqa: E402

H, H_KV, D, LAYERS = 9, 3, 64, 30
SHAPES = ((64, 100), (64, 200), (16, 300), (16, 550))  # (rows, cached positions)


def _median_ms(fn, rounds: int) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def attention_row(rows: int, positions: int, rounds: int) -> dict[str, float]:
    """Medians (ms) of one step's attention over every layer, torch's kernel and ours interleaved."""
    cap = positions + 64  # the cache is longer than what is written so far
    k = torch.randn(LAYERS, rows, H_KV, cap, D)
    v = torch.randn(LAYERS, rows, H_KV, cap, D)
    q = torch.randn(rows, H, 1, D)
    mask = torch.zeros(rows, 1, 1, positions)
    mask[..., 3:9] = float("-inf")
    runs = {
        "torch": lambda: [
            F.scaled_dot_product_attention(
                q, k[i, :, :, :positions], v[i, :, :, :positions], attn_mask=mask, enable_gqa=True
            )
            for i in range(LAYERS)
        ],
        "kernel": lambda: [
            decode_attention(q, k[i, :, :, :positions], v[i, :, :, :positions], mask) for i in range(LAYERS)
        ],
        "read once": lambda: [(k[i, :, :, :positions].sum(), v[i, :, :, :positions].sum()) for i in range(LAYERS)],
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            times[name].append(_median_ms(fn, 1))
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fn, why = load_kernel()
    if fn is None:
        sys.exit(f"the decode-attention kernel is not available here: {why}")
    torch.set_grad_enabled(False)
    print("| rows x cached positions | KV bytes read | torch's kernel | tinkrl's kernel | read once | speed-up |")
    print("|---|---|---|---|---|---|")
    for rows, positions in SHAPES:
        ms = attention_row(rows, positions, args.rounds)
        mb = 2 * LAYERS * rows * H_KV * positions * D * 4 / 1e6
        print(
            f"| {rows} x {positions} | {mb:.0f} MB | {ms['torch']:.1f} ms | {ms['kernel']:.1f} ms "
            f"| {ms['read once']:.1f} ms | {ms['torch'] / ms['kernel']:.2f}x |"
        )
    cache = KVCache(torch.randn(LAYERS, 64, H_KV, 116, D), torch.randn(LAYERS, 64, H_KV, 116, D))
    keep = torch.arange(60)
    copy_ms = _median_ms(lambda: cache.select(keep), args.rounds)
    keep_ms = _median_ms(lambda: cache.keep(keep), args.rounds)
    print(
        f"\ndropping 4 of 64 rows (116 positions): copying the cache {copy_ms:.1f} ms, keeping rows in place {keep_ms:.3f} ms"
    )


if __name__ == "__main__":
    main()
