"""How far the bf16 sampler's logprobs are from the fp32 trainer's, on the tokens it sampled.

    .venv/bin/python bench/sampler_mismatch.py [--requests 64] [--tokens 64] [--threads 2]
        [--variants NAME ...] [--seeds 3 ...]

SmolLM2-135M-Instruct (the engine's own weights), an engine with `sampler_precision: bfloat16`: a
fresh LoRA snapshot (B = 0, so the base model) samples `--requests` chat prompts (bench/engine.py)
for `--tokens` tokens each at T=1, then the same engine's trainer scores those sequences
(`forward`, cross_entropy). Prints mean, p99 and max |trainer - sampler| logprob over the sampled
tokens, in passes each in its own process: the bf16 sampler as it runs (on CPU with the
decode kernels: a bf16 KV cache, and bf16 products in the head where the CPU has bf16 dot
products), with the head in fp32, with the head and the cache in fp32, and (on AMX) with each
decode layer in one call up to 64 rows, its products in AMX tiles rather than oneDNN's from 33
rows on, and with every product through oneDNN (`oneDNN products`: neither AMX tiles nor, on CPUs
without AMX, dot products, with the layers op by op). The passes sample different tokens where
their logprobs differ, so their maxima are single tokens apart; compare the means, over several
`--seeds` (each seed a pass per variant).
Figures: docs/engine.md, "Sampler precision".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
VARIANTS = {  # name -> (fp32 KV cache, fp32 head, rows of a decode step whose layers run in one call, oneDNN)
    "as it runs": (False, False, None, False),
    "fp32 head": (False, True, None, False),
    "fp32 head and KV cache": (True, True, None, False),
    "one call a layer to 64 rows": (False, False, 64, False),
    "oneDNN products": (False, False, None, True),
}


def measure(
    requests: int, tokens: int, seed: int, fp32_cache: bool, fp32_head: bool, layer_rows: int | None, onednn: bool
) -> dict[str, float]:
    """Mean, p99 and max |dlogprob| of one sampling pass: the sampler as it runs, or with its KV cache
    and/or its head in fp32, or its decode layers in one call up to `layer_rows` rows, or every
    projection's product through oneDNN (`onednn`), not the kernels' tiles or dot products."""
    import numpy as np
    import torch
    from engine import prompts  # bench/engine.py
    from tinker import types

    from tinkrl.local import ServiceClient, transformer

    if fp32_cache:
        transformer.CausalLM.cache_dtype = lambda self, device: torch.float32
    if fp32_head:
        transformer.head_bf16_applies = lambda x: False
    if layer_rows is not None:
        transformer.AMX_LAYER_ROWS = layer_rows
    if onednn:
        transformer.bf16_product_kernel = lambda rows: None
    service = ServiceClient(device="cpu", dtype="float32", sampler_precision="bfloat16")
    trainer = service.create_lora_training_client(MODEL, rank=16, seed=0)
    sampler = trainer.save_weights_and_get_sampling_client()
    asked = prompts(sampler.get_tokenizer(), requests)
    params = types.SamplingParams(max_tokens=tokens, temperature=1.0, stop=[], seed=seed)
    futures = [sampler.sample(types.ModelInput.from_ints(p), 1, params) for p in asked]
    sampled = [f.result().sequences[0] for f in futures]
    data = []
    for prompt, seq in zip(asked, sampled):
        full = prompt + list(seq.tokens)
        inputs = {"target_tokens": np.asarray(full[1:], dtype=np.int64), "weights": np.ones(len(full) - 1, np.float32)}
        data.append(types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs=inputs))
    scored = trainer.forward(data, "cross_entropy").result().loss_fn_outputs
    diff = np.concatenate(
        [
            np.abs(out["logprobs"].to_numpy()[len(p) - 1 :] - np.asarray(seq.logprobs))
            for out, p, seq in zip(scored, asked, sampled)
        ]
    )
    return {
        "tokens": int(diff.size),
        "mean": float(diff.mean()),
        "p99": float(np.quantile(diff, 0.99)),
        "max": float(diff.max()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS)[:3])
    ap.add_argument("--seeds", nargs="+", type=int, default=[3], help="sampling seeds; a pass per variant each")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)  # one pass, in its own process
    args = ap.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(measure(args.requests, args.tokens, args.seeds[0], *VARIANTS[args.child])), flush=True)
        return
    print("| bf16 sampler | seed | sampled tokens | mean \\|dlogprob\\| | p99 | max |\n|---|---|---|---|---|---|")
    for seed in args.seeds:
        for variant in args.variants:  # the variants alternate, seed by seed
            child = [sys.executable, __file__, "--child", variant, "--requests", str(args.requests)]
            child += ["--tokens", str(args.tokens), "--threads", str(args.threads), "--seeds", str(seed)]
            done = subprocess.run(child, check=True, stdout=subprocess.PIPE, text=True)
            r = json.loads(done.stdout.strip().splitlines()[-1])
            row = f"| {variant} | {seed} | {r['tokens']} | {r['mean']:.2e} | {r['p99']:.2e} | {r['max']:.2e} |"
            print(row, flush=True)


if __name__ == "__main__":
    main()
