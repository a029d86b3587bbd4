"""Training memory and speed against sequence length: one datum of N tokens through a LoRA step.

    python bench/training_memory.py [--model M] [--tokens 1024 4096 16384] [--systems tinkrl peft]
        [--repeats 2] [--long-repeats 1]

Each (system, length, repeat) runs in a fresh process, which first takes one short step (lazy set-up
left out), then measures one `forward_backward` of a datum of N random tokens, every position
trained (`importance_sampling`, fp32, LoRA rank 16 on every linear layer): its wall time, tokens/s,
and its peak resident memory above the resident memory before it (Linux's high-water mark, reset
before the call through /proc/self/clear_refs). `tinkrl` runs the embedded engine as its plan sets it
up (the plan's line is recorded); `peft` runs transformers + peft on the same model with gradient
checkpointing (non-reentrant) and SDPA attention, its logprobs from the full logits. Both run on
the allocator the `tinkrl` command runs on (tcmalloc where installed; `TINKRL_ALLOCATOR=system`:
glibc's). Writes
bench/results/training_memory/<machine class>.json, one record per model and system.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import common

from tinkrl.allocator import preload_env, tcmalloc_path

SYSTEMS = ("tinkrl", "peft")


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _measure(step) -> dict:
    """One call of `step()`: seconds, and peak RSS above the RSS before it, in bytes."""
    import gc

    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = _rss_kib("VmRSS")
    t0 = time.perf_counter()
    step()
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak_bytes": (_rss_kib("VmHWM") - before) * 1024}


def _datum(tokens: int, seed: int):
    import numpy as np
    from tinker import types

    rng = np.random.default_rng(seed)
    ids = rng.integers(100, 40000, tokens + 1).tolist()
    inputs = {
        "target_tokens": np.asarray(ids[1:], dtype=np.int64),
        "logprobs": np.full(tokens, -2.0, dtype=np.float32),
        "advantages": rng.standard_normal(tokens).astype(np.float32),
    }
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs=inputs)


def child_tinkrl(model: str, tokens: int) -> dict:
    from tinkrl.local import ServiceClient

    tc = ServiceClient(device="cpu", dtype="float32").create_lora_training_client(model, rank=16, seed=0)
    tc.forward_backward([_datum(64, 1)], "importance_sampling").result()
    datum = _datum(tokens, 0)
    out = _measure(lambda: tc.forward_backward([datum], "importance_sampling").result())
    return {**out, "plan": tc.engine.plan.line()}


def child_peft(model: str, tokens: int) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tinkrl.local.models import resolve_model_dir

    hf = AutoModelForCausalLM.from_pretrained(resolve_model_dir(model), dtype=torch.float32, attn_implementation="sdpa")
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    hf.enable_input_require_grads()
    peft_model = get_peft_model(hf, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    peft_model.train()

    def step(datum) -> None:
        ids = torch.tensor([datum.model_input.to_ints()])
        target = torch.as_tensor(datum.loss_fn_inputs["target_tokens"].to_numpy())[None]
        old = torch.as_tensor(datum.loss_fn_inputs["logprobs"].to_numpy())[None]
        adv = torch.as_tensor(datum.loss_fn_inputs["advantages"].to_numpy())[None]
        logits = peft_model(input_ids=ids).logits.float()
        lp = logits.log_softmax(-1).gather(-1, target[..., None])[..., 0]
        (-(torch.exp(lp - old) * adv).sum()).backward()

    step(_datum(64, 1))
    datum = _datum(tokens, 0)
    return _measure(lambda: step(datum))


def _why_failed(out: subprocess.CompletedProcess) -> str:
    """A failed child in a few words: killed for memory, or its error's last line."""
    if out.returncode in (-9, 137):
        return "killed by the kernel (out of memory)"
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    return lines[-1][:200] if lines else f"exit status {out.returncode}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--long-repeats", type=int, default=1, help="repeats of lengths over 4096 tokens")
    ap.add_argument("--label", default="", help="names the record beside model and system (e.g. the code measured)")
    ap.add_argument("--child", nargs=2, metavar=("SYSTEM", "TOKENS"), help=argparse.SUPPRESS)
    common.add_results_arg(ap)
    args = ap.parse_args()
    if args.child:
        system, tokens = args.child[0], int(args.child[1])
        print(json.dumps((child_tinkrl if system == "tinkrl" else child_peft)(args.model, tokens)))
        return
    for system in args.systems:
        repeats: dict[str, list[float]] = {}
        failed: dict[str, str] = {}  # length: why it did not run (out of memory, the plan's refusal)
        plan = ""
        for tokens in args.tokens:
            for _ in range(args.repeats if tokens <= 4096 else args.long_repeats):
                cmd = [sys.executable, __file__, "--model", args.model, "--child", system, str(tokens)]
                out = subprocess.run(cmd, capture_output=True, text=True, env=preload_env(dict(os.environ)))
                if out.returncode != 0:
                    print(f"{system} at {tokens} tokens failed:\n{out.stderr[-2000:]}", file=sys.stderr)
                    failed[str(tokens)] = _why_failed(out)
                    break
                row = json.loads(out.stdout.strip().splitlines()[-1])
                plan = row.get("plan", plan)
                repeats.setdefault(f"{tokens}/seconds", []).append(row["seconds"])
                repeats.setdefault(f"{tokens}/tok_s", []).append(tokens / row["seconds"])
                repeats.setdefault(f"{tokens}/peak_mb_per_token", []).append(row["peak_bytes"] / tokens / 2**20)
                repeats.setdefault(f"{tokens}/peak_gb", []).append(row["peak_bytes"] / 2**30)
                print(f"{system} {tokens} tokens: {row['seconds']:.1f} s, peak +{row['peak_bytes'] / 2**30:.2f} GB")
        settings = {"model": args.model, "system": system, "label": args.label, "tokens": args.tokens, "plan": plan}
        settings |= {"loss": "importance_sampling", "precision": "float32", "lora_rank": 16, "failed": failed}
        settings["allocator"] = (
            "tcmalloc" if tcmalloc_path() and os.environ.get("TINKRL_ALLOCATOR") != "system" else "glibc"
        )
        if repeats:
            workload = " ".join(w for w in (args.model, system, args.label) if w)
            common.write_result("training_memory", workload, settings, repeats, args.results)


if __name__ == "__main__":
    main()
