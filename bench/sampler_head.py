"""The bf16 sampler's unembedding on this CPU, each way it can compute, at decode row counts.

    python bench/sampler_head.py [--rows 1 2 8 16 32 64] [--vocab 49152] [--width 576] [--threads 2]

SmolLM2's head shape by default (random weights). For each row count it times, median of
`--repeats` calls after 3 warm-ups, all in one process:
- fp32: torch's fp32 product, the matched sampler's head;
- dot products: `head_bf16` in AVX512-BF16 dot products (where the kernels have them);
- AMX tiles: `head_bf16` in AMX tiles (where `head_amx_available`);
- oneDNN bf16: torch's bf16 product, whose logits are rounded to bf16 (not used: shown for the
  speed the hardware gives, and its error).
Beside each `head_bf16` way and oneDNN's: the largest difference from the float64 products of the
same bf16-rounded operands (fp32 sums differ by ~1e-6; bf16 logits by ~1e-2). Which way the
sampler takes at each row count is `head_bf16`'s default (`AMX_HEAD_ROWS`). Figures:
docs/performance.md, "The bf16 sampler's head".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import median_ms  # noqa: E402

from tinkrl.local import decode_attention as da  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 8, 16, 32, 64])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--width", type=int, default=576)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(args.vocab, args.width, generator=g) * 0.05
    weight_bf16, packed = weight.bfloat16(), da.pack_head(weight)
    dots = da.head_bf16_applies(torch.zeros(1, args.width))
    amx = dots and da.head_amx_available()
    print(f"dot products: {'yes' if dots else 'no'}; AMX tiles: {'yes' if amx else 'no'}; {args.threads} threads")
    print("| rows | fp32 | dot products | AMX tiles | oneDNN bf16 (bf16 logits) |")
    print("|---|---|---|---|---|")
    for rows in args.rows:
        x = torch.randn(rows, args.width, generator=g)
        exact = x.bfloat16().double() @ weight_bf16.double().t()
        ways: dict[str, Callable[[], torch.Tensor] | None] = {
            "fp32": lambda: F.linear(x, weight),
            "dots": (lambda: da.head_bf16(x, packed, args.vocab, amx=False)) if dots else None,
            "amx": (lambda: da.head_bf16(x, packed, args.vocab, amx=True)) if amx else None,
            "onednn": lambda: F.linear(x.bfloat16(), weight_bf16),
        }
        cells = []
        for name, f in ways.items():
            if f is None:
                cells.append("n/a")
                continue
            ms = median_ms(f, args.repeats, warmups=3)
            err = "" if name == "fp32" else f" (max err {(f().double() - exact).abs().max().item():.0e})"
            cells.append(f"{ms:.2f} ms{err}")
        print(f"| {rows} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
