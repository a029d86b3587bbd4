"""The bf16 sampler's projections at decode row counts, streaming every layer's weights as a step does.

    python bench/sampler_products.py [--rows 1 16 64] [--layers 30] [--threads 2] [--repeats 7]

SmolLM2-135M's projections by default (q/k/v fused 576 -> 960, o 576 -> 576, gate/up fused
576 -> 3072, down 1536 -> 576; random bf16 weights), one set per layer, so that each pass reads
every layer's weights from memory once, as a decode step does (a single layer's weights would sit
in the cache and time something no step sees). For each row count, median milliseconds of a pass
over all layers after two warm-ups, all in one process:
- oneDNN bf16: torch's bf16 product from oneDNN's blocked layout (the bf16 sampler's products on
  CPUs without AMX, and a prefill's on CPUs with AMX; bf16 outputs);
- AMX tiles: `linear_bf16`, fp32 sums rounded to bf16 outputs in the kernel (the bf16 sampler's
  decode products of up to `AMX_PRODUCT_ROWS` rows on CPUs with AMX, where `head_amx_available`);
- dot products: `linear_bf16` without AMX (`amx=False`; the bf16 sampler's decode products of up to
  `DOT_PRODUCT_ROWS` rows on CPUs with AVX512-BF16 and no AMX), once in the CPU's bf16 dot-product
  instruction ("dpbf16") and once in fp32 FMAs ("fma"): the two ways `dots_kernel` measures and picks
  from (the one it picked here is marked).
Beside each: the weights' bytes over its time (GB/s), to hold against what the machine reads.
Figures: docs/performance.md, "The bf16 sampler's products".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import median_ms  # noqa: E402

from tinkrl.local import decode_attention as da  # noqa: E402
from tinkrl.local.transformer import _packed  # noqa: E402

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}  # (out, in)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    g = torch.Generator().manual_seed(0)
    layers = [
        {name: (torch.randn(n, k, generator=g) * 0.05).bfloat16() for name, (n, k) in SHAPES.items()}
        for _ in range(args.layers)
    ]
    onednn = [{name: _packed(w) for name, w in layer.items()} for layer in layers]
    tiles = [{name: da.pack_head(w) for name, w in layer.items()} for layer in layers]
    nbytes = sum(w.numel() * 2 for layer in layers for w in layer.values())
    dots = da.head_bf16_applies(torch.zeros(1, 64))
    amx = dots and da.head_amx_available()
    print(f"{args.layers} layers, {nbytes / 1e6:.0f} MB of bf16 weights; AMX tiles: {'yes' if amx else 'no'}")
    picked = da.dots_kernel() if dots else None
    print(
        f"| rows | oneDNN bf16 | AMX tiles | dot products (dpbf16{' *' * (picked == 'dpbf16')}) "
        f"| dot products (fma{' *' * (picked == 'fma')}) |"
    )
    print("|---|---|---|---|---|")
    for rows in args.rows:
        xs = {name: torch.randn(rows, k, generator=g).bfloat16() for name, (_, k) in SHAPES.items()}

        def pass_onednn() -> None:
            for layer in onednn:
                for name, w in layer.items():
                    torch.ops.mkldnn._linear_pointwise(xs[name], w, None, "none", [], "")

        def pass_amx() -> None:
            for layer in tiles:
                for name, w in layer.items():
                    da.linear_bf16(xs[name], w, SHAPES[name][0])

        def pass_dots(kernel: str) -> Callable[[], None]:
            def run() -> None:
                with da.dots_kernel_as(kernel):
                    for layer in tiles:
                        for name, w in layer.items():
                            da.linear_bf16(xs[name], w, SHAPES[name][0], amx=False)

            return run

        ways: dict[str, Callable[[], None] | None] = {
            "onednn": pass_onednn,
            "amx": pass_amx if amx else None,
            "dpbf16": pass_dots("dpbf16") if dots else None,
            "fma": pass_dots("fma") if dots else None,
        }
        cells = []
        for fn in ways.values():
            if fn is None:
                cells.append("-")
                continue
            ms = median_ms(fn, args.repeats, 2)
            cells.append(f"{ms:.1f} ms ({nbytes / ms / 1e6:.1f} GB/s)")
        print(f"| {rows} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
