"""Each of the sampler's fast paths against the reference forward, as this machine's plan runs them.

    .venv/bin/python bench/sampler_paths.py [--samplers matched bfloat16] [--workloads train b d f]
        [--rounds 5] [--threads 2] [--results DIR]

For each sampler precision, the engine's own plan (`tinkrl/local/compute_plan.py`) and variants of it, each
with one part the plan puts in the kernels handed back to the reference's way, and the whole
reference forward (`transformer.py`, the trainer's arithmetic: torch's attention and elementwise
ops, oneDNN's products, the fp32 head):

  plan                  as the plan runs (every row of the table is measured against `reference`)
  reference             the reference forward for the whole step
  op by op              (bf16) the decode kernels called one by one, not one call a layer
  oneDNN products       (bf16) the projections' products through oneDNN, not the kernels
  fp32 head             (bf16) the head in fp32, not bf16 products
  reference prefill     (bf16) the prefill as the reference runs it

A variant is measured only where the plan runs the part it replaces. Every variant of every
sampler runs once per round, the order rotating round by round, all in one process on the same
SmolLM2-135M-Instruct weights and prompts (the machine's drift reaches them alike); the first round
warms up and is dropped. Workloads (`bench/vs_vllm.py`'s prompts; T=1, a fixed output length):
  train: make train's step: 16 prompts x 4 samples x 16 tokens, a new LoRA version each call
  b: 8 prompts x 8 samples x 64 tokens     d: 16 prompts x 256 tokens
  f: 8 episodes x 6 turns x 64 tokens, each turn continuing the last through the prefix cache
Records seconds per call, every round, per (sampler, variant) to
bench/results/sampler_paths/<machine class>.json; `python bench/report.py` shows each variant's
speed against its sampler's reference and the reference's own spread between rounds (a path pays
where it beats the reference by more than that spread).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
WORKLOADS = {"train": (16, 4, 16, 1), "b": (8, 8, 64, 1), "d": (16, 1, 256, 1), "f": (8, 1, 64, 6)}
VARIANTS = ("plan", "reference", "op by op", "oneDNN products", "fp32 head", "reference prefill")


def variants(plan) -> dict:
    """The plan, its variants that differ from it (see the module docstring), and the reference."""
    from tinkrl.local.compute_plan import Choice

    ref = Choice("reference", "the benchmark's")
    out = {"plan": plan}
    if plan.one_call_rows:
        out["op by op"] = dataclasses.replace(plan, one_call_rows=0)
    if plan.product_rows:
        out["oneDNN products"] = dataclasses.replace(
            plan, projections=Choice("onednn bf16", ref.why), product_rows=0, one_call_rows=0
        )
    if plan.logits.path not in ("fp32", "reference"):
        out["fp32 head"] = dataclasses.replace(plan, logits=Choice("fp32", ref.why))
    if plan.prefill.path == "kernels":
        out["reference prefill"] = dataclasses.replace(plan, prefill=ref)
    out["reference"] = dataclasses.replace(
        plan, decode=ref, prefill=ref, cache=Choice("float32", ref.why), logits=Choice("fp32", ref.why)
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samplers", nargs="+", choices=("matched", "bfloat16"), default=["matched", "bfloat16"])
    ap.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds (one more warms up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompts")
    sys.path.insert(0, str(ROOT / "bench"))
    import common
    from vs_vllm import OBSERVATION, prompt_ids, questions

    common.add_results_arg(ap)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch
    from tinker import types

    from tinkrl.local import ServiceClient
    from tinkrl.local.engine import Snapshot
    from tinkrl.local.kernels.paths import for_plan

    torch.set_num_threads(args.threads)
    services = {s: ServiceClient(device="cpu", dtype="float32", sampler_precision=s) for s in args.samplers}
    clients = {s: svc.create_sampling_client(base_model=MODEL) for s, svc in services.items()}
    tokenizer = next(iter(clients.values())).get_tokenizer()
    observation = tokenizer.encode(OBSERVATION, add_special_tokens=False)
    # a LoRA version like a training step's, for `train`: B random so the merged weights differ
    trainer = services[args.samplers[0]].create_lora_training_client(MODEL, rank=16, seed=0)
    lora = trainer.engine.submit(trainer.trainer.snapshot).result().lora
    lora = {k: (torch.randn_like(v) * 0.01 if ".lora_B." in k else v) for k, v in lora.items()}
    config = trainer.engine.submit(trainer.trainer.snapshot).result().config

    def run(sampler: str, name: str) -> float:
        n, samples, tokens, turns = WORKLOADS[name]
        engine, sc = clients[sampler].engine, clients[sampler]
        if name == "train":  # a new weight version: merged again, nothing reused from the last call
            sc = type(sc)(engine, Snapshot(f"bench:{uuid.uuid4().hex}", lora, config))
        engine.submit(engine.prefix_cache.clear).result()
        convs = prompt_ids(tokenizer, questions(n, args.seed * 1000 + len(name)))
        params = types.SamplingParams(max_tokens=tokens, temperature=1.0, stop=[])
        start = time.perf_counter()
        for _ in range(turns):
            futures = [sc.sample(types.ModelInput.from_ints(c), samples, params) for c in convs]
            got = [list(f.result().sequences[0].tokens) for f in futures]
            if any(len(g) != tokens for g in got):
                raise SystemExit(f"{sampler} {name}: replies of {tokens} tokens expected")
            convs = [c + g + observation for c, g in zip(convs, got)]
        return time.perf_counter() - start

    plans = {s: variants(c.engine.plan) for s, c in clients.items()}
    cases = [(s, v) for s in args.samplers for v in plans[s]]
    for name in args.workloads:
        times: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
        for r in range(args.rounds + 1):
            shift = r % len(cases)
            for sampler, variant in cases[shift:] + cases[:shift]:
                engine = clients[sampler].engine
                engine.paths = for_plan(plans[sampler][variant])
                seconds = run(sampler, name)
                if r:
                    times[(sampler, variant)].append(seconds)
            for sampler in args.samplers:
                clients[sampler].engine.paths = for_plan(clients[sampler].engine.plan)
            print(f"{name} round {r}: " + ", ".join(f"{s} {v} {t[-1]:.2f}s" for (s, v), t in times.items() if t))
        for sampler in args.samplers:
            plan = clients[sampler].engine.plan
            settings = {
                "model": MODEL,
                "sampler": sampler,
                "workload": name,
                "shape": WORKLOADS[name],
                "rounds": args.rounds,
                "threads": args.threads,
                "plan": plan.line(),
            }
            repeats = {v: times[(sampler, v)] for v in plans[sampler]}
            common.write_result("sampler_paths", f"{sampler} {name}", settings, repeats, args.results, device="cpu")


if __name__ == "__main__":
    main()
