"""The bf16 sampler's prefill on CPU: its norms and SiLU in the C kernels (`DecoderLayer.prefill`)
against `forward`'s torch ops.

    .venv/bin/python bench/prefill.py [--rounds 9] [--threads 2]

SmolLM2-135M's shape with random weights (bench/engine.py's `smollm2`, no download), as the bf16
sampler holds it (`sampler_precision: bfloat16`: bf16 copies of the projections' weights, fused, its
KV cache in bf16; bench/decode_step.py's tree). One prefill is the forward of every row's prompt
tokens into an empty KV cache, plus the head at each row's last position, as `sample_batch` runs it
for the prompts after their shared opening. Per rows x prompt tokens: the median milliseconds of a
prefill each way, the ways alternating, the speed-up, and the largest difference of the two ways'
last-position logprobs (bf16 products round differently once an input differs in its last bit).
Figures: docs/performance.md, "Prefill".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import medians  # noqa: E402
from decode_step import trees  # noqa: E402

from tinkrl.local.transformer import CausalLM, KVCache, causal_mask  # noqa: E402

# (rows, prompt tokens): 32 short questions after their chat opening (vs_vllm's a), a GRPO step's 8
# prompts, 64 rollouts' prompts, and one agent turn's conversation so far
SHAPES = ((32, 18), (8, 40), (64, 24), (1, 500), (4, 1000))


def prefill_ms(lm: CausalLM, rows: int, tokens: int, rounds: int) -> dict[str, float]:
    """Median ms of a prefill of `rows` x `tokens` prompt tokens, in the kernels and through `forward`."""
    g = torch.Generator().manual_seed(rows * tokens)
    ids = torch.randint(0, lm.config.vocab_size, (rows, tokens), generator=g)
    attn = torch.ones(rows, tokens, dtype=torch.long)
    positions = torch.arange(tokens).expand(rows, tokens)
    mask = causal_mask(attn, tokens)
    in_kernels = CausalLM._prefills_in_kernels

    def never(*_) -> bool:  # as a method: `forward`'s ops
        return False

    ways = {"kernels": in_kernels, "forward": never}
    times: dict[str, list[float]] = {w: [] for w in ways}
    logprobs = {}
    with torch.no_grad():
        for r in range(rounds + 2):
            for way, decides in ways.items():
                CausalLM._prefills_in_kernels = decides
                cache = KVCache.allocate(lm.config, rows, tokens + 1, "cpu", lm.cache_dtype("cpu"))
                t0 = time.perf_counter()
                logits = lm.logits(lm(ids, positions, mask, cache, 0)[:, -1])
                if r >= 2:  # two warm-up rounds
                    times[way].append((time.perf_counter() - t0) * 1000)
                logprobs[way] = logits.log_softmax(-1)
    CausalLM._prefills_in_kernels = in_kernels
    out = medians(times)
    out["max |dlogprob|"] = (logprobs["kernels"] - logprobs["forward"]).abs().max().item()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads")
    print("| rows x prompt tokens | forward | kernels | speed-up | max \\|dlogprob\\| |")
    print("|---|---|---|---|---|")
    lm = trees()["bf16 sampler"]
    for rows, tokens in SHAPES:
        got = prefill_ms(lm, rows, tokens, args.rounds)
        ops, kernels = got["forward"], got["kernels"]
        print(
            f"| {rows} x {tokens} | {ops:.1f} ms | {kernels:.1f} ms | {ops / kernels:.2f}x "
            f"| {got['max |dlogprob|']:.1e} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
