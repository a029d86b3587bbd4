"""One sampler decode step on CPU: its layers in the C kernels (`DecoderLayer.decode`) against op by op,
and, for the bf16 tree on CPUs with AVX512-BF16, each layer in one kernel call (`DecoderLayer.decode_bf16`).

    .venv/bin/python bench/decode_step.py [--rounds 9] [--threads 2]

SmolLM2-135M's shape with random weights (bench/engine.py's `smollm2`, no download), as the
sampler holds it: the matched tree (fp32 weights, q/k/v and gate/up fused, as the merged LoRA tree
RL samples with) and the bf16 sampling tree (`sampler_precision: bfloat16`: bf16 copies of the
projections' weights, fused, its KV cache in bf16, its head in bf16 products with fp32 sums). One
step is the forward of one new token per row over a KV cache of the given length, plus the head,
as `sample_batch` runs it. Per
(tree, rows x cached positions): the median milliseconds of a step with the layers in the kernels
and op by op (torch's ops with the decode-attention kernel), the ways alternating, the speed-up,
and the largest difference of the two ways' logprobs for the same step (bf16 products round
differently once an input differs in its last bit; fp32 agrees to rounding). Where the bf16 tree's
layers run in one call each (AMX tiles up to `AMX_LAYER_ROWS` rows, dot products up to
`DOT_PRODUCT_ROWS` without AMX), also the step with the kernels called one by one from Python, and
whether the two give the same logits to the bit; where its products run in the kernels
(`bf16_product_kernel`), also the step with them through oneDNN, the kernels called one by one (what
the kernels' products and the one call gain together). Figures: docs/performance.md, "Decode step".
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

from tinkrl.local import transformer  # noqa: E402
from tinkrl.local.transformer import (  # noqa: E402
    CausalLM,
    KVCache,
    build_causal_lm,
    fuse_projections,
    to_bf16_sampling,
)

SHAPES = ((128, 100), (64, 100), (32, 100), (16, 300), (16, 500))  # (rows, cached positions)


def trees() -> dict[str, CausalLM]:
    """The matched and the bf16 sampling tree of one random SmolLM2-shaped model."""
    from engine import RANDOM_ARCHS  # bench/engine.py
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(RANDOM_ARCHS["smollm2"])
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(spec.pop("model_type"), **spec)).eval()
    matched = build_causal_lm(hf, torch.float32, "cpu")
    fuse_projections(matched)
    bf16 = to_bf16_sampling(build_causal_lm(hf, torch.float32, "cpu"))  # as the engine's bf16 sampling tree
    return {"matched (fp32)": matched, "bf16 sampler": bf16}


def step_ms(lm: CausalLM, rows: int, positions: int, rounds: int) -> dict[str, float]:
    """Median ms of a decode step at `positions` cached positions, in the kernels and op by op."""
    cache = KVCache.allocate(lm.config, rows, positions + 8, "cpu", lm.cache_dtype("cpu"))
    cache.k.normal_(), cache.v.normal_()
    attn = torch.ones(rows, positions + 8, dtype=torch.long)
    tokens = torch.randint(0, lm.config.vocab_size, (rows, 1))
    original = (CausalLM._decodes_in_kernels, CausalLM._layers_in_one_call, transformer.bf16_product_kernel)
    in_kernels, one_call, products = original

    def never(*_) -> bool:  # as a method: not in the kernels
        return False

    def per_kernel(*_) -> None:  # as a method: not one call a layer
        return None

    ways = {"kernels": (in_kernels, one_call, products), "op by op": (never, per_kernel, products)}
    with torch.no_grad():
        if lm._layers_in_one_call(torch.zeros(rows, 1, lm.config.hidden_size)):
            ways["kernels one by one"] = (in_kernels, per_kernel, products)
            if products(rows) is not None:
                ways["oneDNN products"] = (in_kernels, per_kernel, per_kernel)

    def use(way: tuple) -> None:  # (decides, layers, products) as the three hooks
        CausalLM._decodes_in_kernels, CausalLM._layers_in_one_call, transformer.bf16_product_kernel = way

    times: dict[str, list[float]] = {w: [] for w in ways}
    logits = {}
    with torch.no_grad():
        for way in ways:  # the same step every way: the same logits, to rounding
            use(ways[way])
            mask = attn[:, None, None, : positions + 1].bool()
            hidden = lm(tokens, torch.full((rows, 1), positions), mask, cache, positions)
            logits[way] = lm.logits(hidden[:, -1]).log_softmax(-1)
        for r in range(rounds + 2):
            for way in ways:
                use(ways[way])
                pos = positions + r % 4  # a few different lengths, all in the cache
                t0 = time.perf_counter()
                hidden = lm(tokens, torch.full((rows, 1), pos), attn[:, None, None, : pos + 1].bool(), cache, pos)
                lm.logits(hidden[:, -1])
                if r >= 2:  # two warm-up rounds
                    times[way].append((time.perf_counter() - t0) * 1000)
    use(original)
    out: dict[str, float | bool] = dict(medians(times))
    out["max |dlogprob|"] = (logits["kernels"] - logits["op by op"]).abs().max().item()
    if "kernels one by one" in logits:
        out["same bits"] = torch.equal(logits["kernels"], logits["kernels one by one"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads")
    print(
        "| tree | rows x cached positions | op by op | kernels | speed-up | max \\|dlogprob\\| | kernels one by one"
        " | oneDNN products one by one |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, lm in trees().items():
        for rows, positions in SHAPES:
            got = step_ms(lm, rows, positions, args.rounds)
            ops, kernels = got["op by op"], got["kernels"]
            row = f"| {name} | {rows} x {positions} | {ops:.1f} ms | {kernels:.1f} ms | {ops / kernels:.2f}x |"
            one_by_one = "-"
            if "same bits" in got:
                same = "same logits" if got["same bits"] else "logits differ"
                one_by_one = f"{got['kernels one by one']:.1f} ms ({same})"
            onednn = f"{got['oneDNN products']:.1f} ms" if "oneDNN products" in got else "-"
            print(f"{row} {got['max |dlogprob|']:.1e} | {one_by_one} | {onednn} |", flush=True)


if __name__ == "__main__":
    main()
