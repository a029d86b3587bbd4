"""How far the bf16 sampler's logprobs are from the fp32 trainer's, on the tokens it sampled.

    .venv/bin/python bench/sampler_mismatch.py [--requests 64] [--tokens 64] [--threads 2]

SmolLM2-135M-Instruct (the engine's own weights), an engine with `sampler_precision: bfloat16`: a
fresh LoRA snapshot (B = 0, so the base model) samples `--requests` chat prompts (bench/engine.py)
for `--tokens` tokens each at T=1, then the same engine's trainer scores those sequences
(`forward`, cross_entropy). Prints mean, p99 and max |trainer - sampler| logprob over the sampled
tokens, once with the KV cache as the bf16 sampler keeps it (bf16 on CPU where the decode kernels
read it) and once with it held in fp32, each in its own process. The two passes sample different
tokens where their logprobs differ, so their maxima are single tokens apart; compare the means.
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
CACHES = ("bf16 cache", "fp32 cache")


def measure(requests: int, tokens: int, fp32_cache: bool) -> dict[str, float]:
    """Mean, p99 and max |dlogprob| of one sampling pass, the cache as the sampler keeps it or fp32."""
    import numpy as np
    import torch
    from engine import prompts  # bench/engine.py
    from tinker import types

    from tinkrl.local import ServiceClient
    from tinkrl.local.transformer import CausalLM

    if fp32_cache:
        CausalLM.cache_dtype = lambda self, device: torch.float32
    service = ServiceClient(device="cpu", dtype="float32", sampler_precision="bfloat16")
    trainer = service.create_lora_training_client(MODEL, rank=16, seed=0)
    sampler = trainer.save_weights_and_get_sampling_client()
    asked = prompts(sampler.get_tokenizer(), requests)
    params = types.SamplingParams(max_tokens=tokens, temperature=1.0, stop=[], seed=3)
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
    ap.add_argument("--child", choices=CACHES, help=argparse.SUPPRESS)  # one pass, in its own process
    args = ap.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(measure(args.requests, args.tokens, args.child == "fp32 cache")), flush=True)
        return
    print("| bf16 sampler's KV cache | sampled tokens | mean \\|dlogprob\\| | p99 | max |\n|---|---|---|---|---|")
    for cache in CACHES:
        child = [sys.executable, __file__, "--child", cache, "--requests", str(args.requests)]
        child += ["--tokens", str(args.tokens), "--threads", str(args.threads)]
        done = subprocess.run(child, check=True, stdout=subprocess.PIPE, text=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"| {cache} | {r['tokens']} | {r['mean']:.2e} | {r['p99']:.2e} | {r['max']:.2e} |", flush=True)


if __name__ == "__main__":
    main()
