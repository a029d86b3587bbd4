"""tinkrl vs TRL's GRPOTrainer on one workload, in one run, on this machine.

Workload: 2-digit addition asked plainly, SmolLM2-135M-Instruct, 8 prompts x 4 samples per
step, 16 new tokens, LoRA r16 on all linear layers, beta=0 (no KL), one optimisation
iteration per batch, no vLLM, the same thread count and precision on both sides.

    python bench/vs_trl.py --steps 5 [--precision float32] [--lr 5e-4]

Step time is the median over the measured steps (the first step is warm-up).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def problems(n: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append((f"What is {a} + {b}?", a + b))
    return out


def last_number(text: str) -> int | None:
    nums = re.findall(r"-?\d+", text.replace(",", ""))
    return int(nums[-1]) if nums else None


def run_trl(steps: int, lr: float, precision: str, out_dir: Path) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tinkrl.local.models import resolve_model_dir

    path = resolve_model_dir(MODEL)
    tok = AutoTokenizer.from_pretrained(path)
    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": q}], "answer": a}
                              for q, a in problems(8 * max(steps, 1000), seed=1)])

    def reward(completions, answer, **_):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [1.0 if last_number(t) == a else 0.0 for t, a in zip(texts, answer)]

    times: list[float] = []

    class Timer(TrainerCallback):
        start = 0.0

        def on_step_begin(self, args, state, control, **kw):
            self.start = time.time()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.time() - self.start)

    args = GRPOConfig(output_dir=str(out_dir), per_device_train_batch_size=32, num_generations=4,
                      max_completion_length=16, learning_rate=lr, beta=0.0, num_iterations=1,
                      max_steps=steps, logging_steps=1, save_strategy="no",
                      report_to=[], use_cpu=not torch.cuda.is_available(), bf16=precision == "bfloat16",
                      temperature=1.0, gradient_accumulation_steps=1, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok,
                          peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"),
                          callbacks=[Timer()])
    trainer.train()
    return {"step_times": times}


def run_tinkrl(steps: int, lr: float, precision: str, out_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "tinkrl.cli", "train", "configs/default.yaml", "batch_size=32", "group_size=4",
           "max_tokens=16", f"learning_rate={lr}", f"precision={precision}", "eval_every=0", "eval_problems=0",
           "save_every=0", f"max_steps={steps}", f"log_path={out_dir}"]
    subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {"step_times": [r["time/step"] for r in rows]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--precision", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ours = run_tinkrl(args.steps, args.lr, args.precision, Path(tmp) / "tinkrl")
        trl = run_trl(args.steps, args.lr, args.precision, Path(tmp) / "trl")
    t_ours = statistics.median(ours["step_times"][1:] or ours["step_times"])
    t_trl = statistics.median(trl["step_times"][1:] or trl["step_times"])
    print(json.dumps({"precision": args.precision, "threads": torch.get_num_threads(), "steps": args.steps,
                      "tinkrl_step_s": t_ours, "trl_step_s": t_trl, "speedup": t_trl / t_ours,
                      "tinkrl_steps": ours["step_times"], "trl_steps": trl["step_times"]}, indent=1))


if __name__ == "__main__":
    main()
