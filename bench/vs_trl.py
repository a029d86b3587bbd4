"""tinkrl vs TRL's GRPOTrainer on one workload, in one run, on this machine.

Workload: 2-digit addition asked plainly, SmolLM2-135M-Instruct, 8 prompts x 4 samples per
step, 16 new tokens, LoRA r16 on all linear layers, beta=0 (no KL), one optimisation
iteration per batch, no vLLM, the same thread count and precision on both sides.

    python bench/vs_trl.py --steps 5 [--precision float32] [--lr 5e-4] [--results DIR]
    python bench/vs_trl.py --accuracy [--wall 300] [--lrs-tinkrl ...] [--lrs-trl ...]

Step time is the median over the measured steps (the first step is warm-up). `--accuracy`:
each system trains at each of its learning rates for the same wall time (model loading
included), then answers tinkrl's 100 held-out problems greedily; each system's best counts
(their losses normalise differently, so their best learning rates differ).

Writes bench/results/vs_trl/<machine class>.json (step times) or
bench/results/vs_trl_accuracy/<machine class>.json. Needs TRL: `make bench-deps`.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import add_results_arg, write_result

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


def arithmetic_split():
    from tinkrl.envs.math.arithmetic import ArithmeticProblems

    return ArithmeticProblems(10, 99, ["+"])  # the default `arithmetic` env: 2-digit addition, 10 % held out


def run_trl(steps: int, lr: float, precision: str, out_dir: Path, wall_s: float | None = None) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tinkrl.local.models import resolve_model_dir

    t_start = time.time()  # the wall budget counts model loading, as tinkrl's time_budget_s does
    path = resolve_model_dir(MODEL)
    tok = AutoTokenizer.from_pretrained(path)
    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if wall_s is None:
        rows = problems(8 * max(steps, 1000), seed=1)
    else:  # the accuracy comparison: train on tinkrl's train split, evaluate on its held-out problems
        split, rng = arithmetic_split(), random.Random(1)
        rows = [(p.question, int(p.answer)) for p in (split.sample(rng, test=False) for _ in range(8 * 2000))]
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": q}], "answer": a} for q, a in rows])

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
            if wall_s is not None and time.time() - t_start + times[-1] > wall_s:
                control.should_training_stop = True  # another step would overrun the wall budget

    args = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=32,
        num_generations=4,
        max_completion_length=16,
        learning_rate=lr,
        beta=0.0,
        num_iterations=1,
        max_steps=steps if wall_s is None else 100_000,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        bf16=precision == "bfloat16",
        temperature=1.0,
        gradient_accumulation_steps=1,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=tok,
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"),
        callbacks=[Timer()],
    )
    trainer.train()
    out = {"step_times": times}
    if wall_s is not None:
        out["greedy_correct"] = hf_greedy_accuracy(trainer.model, tok)
    return out


def hf_greedy_accuracy(model, tok) -> float:
    """Greedy accuracy on tinkrl's 100 held-out problems, asked plainly through the chat template."""
    held_out = arithmetic_split().test_problems(100)
    texts = [
        tok.apply_chat_template([{"role": "user", "content": p.question}], tokenize=False, add_generation_prompt=True)
        for p in held_out
    ]
    tok.padding_side = "left"
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    model.eval()  # left in train mode with gradient checkpointing, generate() without a cache emits garbage
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=16,
            do_sample=False,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        )
    replies = tok.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(last_number(r) == int(p.answer) for r, p in zip(replies, held_out)) / len(held_out)


def run_tinkrl(lr: float, precision: str, out_dir: Path, steps: int | None = None, wall_s: float | None = None) -> dict:
    """`steps` steps training every rollout, as TRL does (the same work on both sides); or, with
    `wall_s`, the default config for that many seconds (model loading included), then its greedy
    eval on 100 held-out problems."""
    cmd = [
        sys.executable,
        "-m",
        "tinkrl.cli",
        "train",
        "configs/default.yaml",
        "batch_size=32",
        "group_size=4",
        "max_tokens=16",
        f"learning_rate={lr}",
        f"precision={precision}",
        "eval_every=0",
        "save_every=0",
        f"log_path={out_dir}",
    ]
    if wall_s is None:
        cmd += ["eval_problems=0", f"max_steps={steps}", "remove_constant_reward_groups=false"]
    else:
        cmd += ["eval_problems=100", "max_steps=100000", f"time_budget_s={wall_s}"]
    subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    out = {"step_times": [r["time/step"] for r in rows]}
    if wall_s is not None:
        out["greedy_correct"] = rows[-1]["eval/arithmetic/greedy_correct"]
    return out


def accuracy_sweep(wall_s: float, lrs_ours: list[float], lrs_trl: list[float], precision: str, tmp: Path) -> dict:
    """Each system at each of its learning rates for the same wall time; each one's best accuracy."""
    ours = {lr: run_tinkrl(lr, precision, tmp / f"tinkrl-{lr}", wall_s=wall_s) for lr in lrs_ours}
    trl = {lr: run_trl(0, lr, precision, tmp / f"trl-{lr}", wall_s=wall_s) for lr in lrs_trl}

    def summary(runs: dict) -> dict:
        return {
            str(lr): {"greedy_correct": r["greedy_correct"], "steps": len(r["step_times"])} for lr, r in runs.items()
        }

    return {"tinkrl": summary(ours), "trl": summary(trl)}


def trl_version() -> str:
    """TRL's version, or exit with the command that installs it."""
    from importlib import metadata

    try:
        return metadata.version("trl")
    except metadata.PackageNotFoundError:
        raise SystemExit("TRL is not installed: `make bench-deps` installs the benchmarks' dependencies") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--precision", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument(
        "--accuracy",
        action="store_true",
        help="accuracy at equal wall time: each system at 3 learning rates for --wall seconds",
    )
    ap.add_argument("--wall", type=float, default=300.0)
    ap.add_argument("--lrs-tinkrl", type=float, nargs="*", default=[2.5e-4, 5e-4, 1e-3])
    ap.add_argument("--lrs-trl", type=float, nargs="*", default=[2.5e-4, 5e-4, 1e-3])
    add_results_arg(ap)
    args = ap.parse_args()
    settings = {"model": MODEL, "precision": args.precision, "trl": trl_version()}
    if args.accuracy:
        with tempfile.TemporaryDirectory() as tmp:
            sweep = accuracy_sweep(args.wall, args.lrs_tinkrl, args.lrs_trl, args.precision, Path(tmp))
        print(json.dumps(sweep, indent=1))
        repeats = {  # one run per system and learning rate
            f"{system}/{lr}/{k}": [v]
            for system, runs in sweep.items()
            for lr, run in runs.items()
            for k, v in run.items()
        }
        write_result("vs_trl_accuracy", args.precision, {**settings, "wall_s": args.wall}, repeats, args.results)
        return
    with tempfile.TemporaryDirectory() as tmp:
        ours = run_tinkrl(args.lr, args.precision, Path(tmp) / "tinkrl", steps=args.steps)
        trl = run_trl(args.steps, args.lr, args.precision, Path(tmp) / "trl")
    repeats = {  # the first step is warm-up (and tinkrl's compile)
        "tinkrl_step_s": ours["step_times"][1:] or ours["step_times"],
        "trl_step_s": trl["step_times"][1:] or trl["step_times"],
    }
    print(json.dumps(repeats, indent=1))
    settings |= {"steps": args.steps, "lr": args.lr}
    write_result("vs_trl", args.precision, settings, repeats, args.results)


if __name__ == "__main__":
    main()
