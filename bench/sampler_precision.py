"""The engine's two sampler precisions side by side on this CPU: `matched` (the trainer's own fp32
arithmetic) and `bfloat16` (bf16 copies of the weights; residual stream, attention and logits fp32).

    python bench/sampler_precision.py [--random smollm2 | --model NAME] [--threads 2] [--repeats 2]

Each precision runs in its own process, one after the other (one engine, one OpenMP team: see
bench/engine.py), through `SamplingClient.sample` as RL calls it: 32 requests x 16 tokens and
64 requests x 128 tokens, fixed lengths at T=1 (workloads a and c of bench/vs_vllm.py), one
warm-up call each, then `--repeats` timed calls; it prints each call's generated tokens/s. It
measures speed only: with `--random` (the default; no download) the weights are random. What the
precisions compute is tested in tests/test_sampler_precision.py. Figures: docs/performance.md,
"Sampler precision by CPU class".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

WORKLOADS = {"32 x 16 tokens": (32, 16), "64 x 128 tokens": (64, 128)}  # name -> (requests, new tokens)
PRECISIONS = ("matched", "bfloat16")


def run_child(model: str, precision: str, threads: int, repeats: int) -> dict[str, list[float]]:
    """Tokens/s of each timed call per workload, sampling `model` with one sampler precision."""
    import torch
    from engine import prompts  # bench/engine.py
    from tinker import types

    from tinkrl.local import ServiceClient

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    service = ServiceClient(device="cpu", dtype="float32", sampler_precision=precision)
    client = service.create_sampling_client(base_model=model)
    asked = prompts(client.get_tokenizer(), max(n for n, _ in WORKLOADS.values()))
    client.sample(types.ModelInput.from_ints(asked[0]), 1, types.SamplingParams(max_tokens=1, stop=[])).result()
    print(f"[{precision}] start-up {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    out: dict[str, list[float]] = {}
    for name, (n, new) in WORKLOADS.items():
        params = types.SamplingParams(max_tokens=new, temperature=1.0, stop=[])
        out[name] = []
        for call in range(1 + repeats):
            t = time.perf_counter()
            futures = [client.sample(types.ModelInput.from_ints(p), 1, params) for p in asked[:n]]
            for f in futures:
                f.result()
            if call:  # the first call warms up
                out[name].append(n * new / (time.perf_counter() - t))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--random", default="smollm2", help="random weights of this bench/engine.py architecture")
    ap.add_argument("--model", help="a real model instead of random weights")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--child", choices=PRECISIONS, help=argparse.SUPPRESS)  # one precision, in its own process
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_child(args.model, args.child, args.threads, args.repeats)), flush=True)
        return
    if not args.model:
        from engine import random_model_dir  # bench/engine.py

        args.model = random_model_dir(args.random)
    rows = {}
    for precision in PRECISIONS:
        child = [sys.executable, __file__, "--child", precision, "--model", args.model]
        child += ["--threads", str(args.threads), "--repeats", str(args.repeats)]
        done = subprocess.run(child, check=True, stdout=subprocess.PIPE, text=True)
        rows[precision] = json.loads(done.stdout.strip().splitlines()[-1])
    print("| workload | " + " | ".join(f"{p} tok/s" for p in PRECISIONS) + " |")
    print("|---|" + "---|" * len(PRECISIONS))
    for name in WORKLOADS:
        cells = [", ".join(f"{x:.0f}" for x in rows[p][name]) for p in PRECISIONS]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
