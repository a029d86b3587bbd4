"""Decode attention on CPU: torch's kernel against tinkrl's (tinkrl/local/decode_attention.c).

    .venv/bin/python bench/decode_attention.py [--rounds 15] [--threads 2]

One decode step's attention over all 30 layers of SmolLM2-135M's shape (9 query heads, 3 KV heads,
head_dim 64), each layer's KV cache its own tensor (as in the sampler: a step reads 30 layers'
caches, which do not stay in the CPU's caches), a few padding positions masked in every row. Per
(rows, cached positions): the median milliseconds of torch's `scaled_dot_product_attention`, of the
kernel, of reading the same keys and values once (`sum`, a floor set by the memory), and of the
kernel on a bf16 copy of the cache (as the bf16 sampler keeps it), the rounds interleaved. Then
what dropping 4 finished rows of 64 costs: copying the cache (`KVCache.select`, the only way with
torch's kernel) against keeping the rows in place (`KVCache.keep`).

`--sampler` also times whole `sample_batch` calls of SmolLM2-135M-Instruct (fp32, the engine's
base tree; prompts of bench/engine.py) with the kernel and with torch's kernel (rows then copied
when they finish), alternating in one process: make train's shape (16 prompts x 4 samples, up to
16 tokens, stopping at end of turn), the same up to 64 tokens, and 64 x 128 fixed-length tokens.
Figures: docs/performance.md, "Decode attention".
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import median_ms  # noqa: E402

from tinkrl.local.decode_attention import decode_attention, load_kernel  # noqa: E402
from tinkrl.local.transformer import KVCache  # noqa: E402

H, H_KV, D, LAYERS = 9, 3, 64, 30
SHAPES = ((64, 100), (64, 200), (16, 300), (16, 550))  # (rows, cached positions)


def attention_row(rows: int, positions: int, rounds: int) -> dict[str, float]:
    """Medians (ms) of one step's attention over every layer, torch's kernel and ours interleaved."""
    cap = positions + 64  # the cache is longer than what is written so far
    k = torch.randn(LAYERS, rows, H_KV, cap, D)
    v = torch.randn(LAYERS, rows, H_KV, cap, D)
    k16, v16 = k.bfloat16(), v.bfloat16()  # the bf16 sampler's cache
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
        "kernel, bf16 cache": lambda: [
            decode_attention(q, k16[i, :, :, :positions], v16[i, :, :, :positions], mask) for i in range(LAYERS)
        ],
        "read once": lambda: [(k[i, :, :, :positions].sum(), v[i, :, :, :positions].sum()) for i in range(LAYERS)],
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            times[name].append(median_ms(fn, 1))
    return {name: statistics.median(t) for name, t in times.items()}


def sampler_rows(rounds: int) -> None:
    """Whole sampling calls with either kernel, alternating; prints a table row per workload."""
    from engine import prompts  # bench/engine.py
    from tinker import types

    import tinkrl.local.transformer as transformer
    from tinkrl.local.engine import Engine
    from tinkrl.local.sampler import SampleJob, sample_batch

    eng = Engine.get("HuggingFaceTB/SmolLM2-135M-Instruct", "cpu", torch.float32)
    ours = (transformer.decode_attention, transformer.reads_cache)
    theirs = (lambda *a: None, lambda k: False)  # torch's kernel, rows copied when they finish
    asked = prompts(eng.tokenizer, 64)
    workloads = {  # name -> (prompts, samples each, max tokens, stop: None = end of turn, [] = none)
        "16 prompts x 4 samples, <= 16 tokens": (16, 4, 16, None),
        "16 prompts x 4 samples, <= 64 tokens": (16, 4, 64, None),
        "64 x 128 tokens": (64, 1, 128, []),
    }
    print("| sampling call | torch's kernel | tinkrl's kernel | speed-up |\n|---|---|---|---|")
    for name, (n, k, new, stop) in workloads.items():
        times: dict[str, list[float]] = {"torch": [], "kernel": []}
        for r in range(rounds):
            for side, (attention, in_place) in (("kernel", ours), ("torch", theirs)):
                transformer.decode_attention, transformer.reads_cache = attention, in_place
                torch.manual_seed(r)  # both sides draw the same tokens
                params = types.SamplingParams(max_tokens=new, temperature=1.0, stop=stop)
                jobs = [SampleJob(p, k, params) for p in asked[:n]]
                t0 = time.perf_counter()
                eng.submit(lambda: sample_batch(eng.base, jobs, eng.tokenizer, eng.eos_id, eng.max_context)).result()
                times[side].append(time.perf_counter() - t0)
        transformer.decode_attention, transformer.reads_cache = ours
        a, b = statistics.median(times["torch"]), statistics.median(times["kernel"])
        print(f"| {name} | {a:.2f} s | {b:.2f} s | {a / b:.2f}x |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sampler", action="store_true", help="also time whole sampling calls (loads SmolLM2)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fn, why = load_kernel()
    if fn is None:
        sys.exit(f"the decode-attention kernel is not available here: {why}")
    if args.sampler:  # first: this thread's own torch work would start a second OpenMP team beside the engine's
        sampler_rows(max(3, args.rounds // 3))
    torch.set_grad_enabled(False)
    print(
        "\n| rows x cached positions | KV bytes read | torch's kernel | tinkrl's kernel | read once | speed-up "
        "| tinkrl's kernel, bf16 cache |"
    )
    print("|---|---|---|---|---|---|---|")
    for rows, positions in SHAPES:
        ms = attention_row(rows, positions, args.rounds)
        mb = 2 * LAYERS * rows * H_KV * positions * D * 4 / 1e6
        print(
            f"| {rows} x {positions} | {mb:.0f} MB | {ms['torch']:.1f} ms | {ms['kernel']:.1f} ms "
            f"| {ms['read once']:.1f} ms | {ms['torch'] / ms['kernel']:.2f}x | {ms['kernel, bf16 cache']:.1f} ms |"
        )
    cache = KVCache(torch.randn(LAYERS, 64, H_KV, 116, D), torch.randn(LAYERS, 64, H_KV, 116, D))
    keep = torch.arange(60)
    copy_ms = median_ms(lambda: cache.select(keep), args.rounds)
    keep_ms = median_ms(lambda: cache.keep(keep), args.rounds)
    print(
        f"\ndropping 4 of 64 rows (116 positions): copying the cache {copy_ms:.1f} ms, keeping rows in place {keep_ms:.3f} ms"
    )


if __name__ == "__main__":
    main()
