"""Embedded-engine throughput, side by side with transformers/peft in one process.

Sampling: 32 requests x 16 new tokens through `SamplingClient.sample` (concurrent calls, and
the same 32 jobs handed to the sampler as one pre-made batch) against `transformers`
`generate` on one left-padded batch of the same 32 prompts; also the concurrent calls through
a LoRA (r16) sampling client, as RL samples. Training: LoRA
forward+backward tokens/s through `TrainingClient.forward_backward` against a plain peft
loop over the same datums. Each comparison at one precision on both sides.

Each precision runs in its own process, and the transformers/peft side runs on the engine's
worker thread: torch on CPU gives every thread that runs a parallel op its own OpenMP team,
and two teams on one machine slow each other (~1.7x on 2 cores), so a second engine or a
main-thread baseline in the same process would distort both sides.

    python bench/engine.py [--precision float32 bfloat16] [--model NAME | --random smollm2|qwen2.5-0.5b]
        [--device cpu|cuda] [--repeats 3] [--skip-training] [--compile] [--results DIR]

Writes bench/results/engine/<machine class>.json (one record per model and precision: every
repeat's tokens/s and their medians); `python bench/report.py` puts it into docs/performance.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tinker import types  # noqa: E402

from tinkrl.local.models import TINY_ARCHS  # noqa: E402

RANDOM_ARCHS = {  # real architectures, random weights (no download)
    "tiny": {**TINY_ARCHS["tinkrl/tiny-llama"], "vocab_size": 49152, "rope_theta": 100000.0},  # quick trial runs
    "smollm2": dict(
        model_type="llama",
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        vocab_size=49152,
        tie_word_embeddings=True,
        rope_theta=100000.0,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        rope_theta=1000000.0,
    ),
}


def random_model_dir(arch: str) -> str:
    """Materialise a random-weight model of a real architecture (with SmolLM2's tokenizer when it fits)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tinkrl.local.models import load_tokenizer, tinkrl_home

    out = tinkrl_home() / "models" / f"random--{arch}"
    if not (out / "config.json").is_file():
        spec = dict(RANDOM_ARCHS[arch])
        cfg = AutoConfig.for_model(
            spec.pop("model_type"), max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=2, **spec
        )
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.save_pretrained(out)
        load_tokenizer("tinkrl/tiny-llama").save_pretrained(out)
    return str(out)


def prompts(tokenizer, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {10 + 3 * i} + {97 - 2 * i}?"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


def on_engine_thread(engine, fn):
    """Run a transformers/peft baseline on the engine's worker thread (one OpenMP team, see the
    module docstring), under torch's default fp32 matmul precision rather than the engine's."""

    def call():
        previous = torch.backends.mkldnn.matmul.fp32_precision, torch.backends.cuda.matmul.fp32_precision
        torch.backends.mkldnn.matmul.fp32_precision = torch.backends.cuda.matmul.fp32_precision = "ieee"
        try:
            return fn()
        finally:
            torch.backends.mkldnn.matmul.fp32_precision, torch.backends.cuda.matmul.fp32_precision = previous

    return engine.submit(call).result()


def timed(fn, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls of `fn`, after two warm-up calls."""
    for _ in range(2):  # warm-up: the first calls pack weights and grow caches
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return times


def bench_sampling(model_name: str, precision: str, device: str, repeats: int, n: int = 32, new: int = 16) -> dict:
    from transformers import AutoModelForCausalLM

    from tinkrl.local import ServiceClient
    from tinkrl.local.models import resolve_model_dir
    from tinkrl.local.sampler import SampleJob, sample_batch

    sc = ServiceClient(device=device, dtype=precision).create_sampling_client(base_model=model_name)
    engine = sc.engine
    ps = prompts(engine.tokenizer, n)
    params = types.SamplingParams(max_tokens=new, temperature=1.0, stop=[])

    def concurrent(client=sc):
        with ThreadPoolExecutor(n) as pool:
            futs = list(pool.map(lambda p: client.sample(types.ModelInput.from_ints(p), 1, params), ps))
            return [f.result() for f in futs]

    def prebatched():
        jobs = [SampleJob(p, 1, params) for p in ps]
        engine.submit(
            lambda: sample_batch(engine.base, engine.paths, jobs, engine.tokenizer, engine.eos_id, engine.max_context)
        ).result()

    t_conc = timed(concurrent, repeats)
    t_pre = timed(prebatched, repeats)
    # what RL samples with: the same requests through a LoRA (r16, all modules) sampling client
    lora = ServiceClient(device=device, dtype=precision).create_lora_training_client(model_name, rank=16, seed=0)
    sc_lora = lora.save_weights_and_get_sampling_client()
    t_lora = timed(functools.partial(concurrent, sc_lora), repeats)
    del lora, sc_lora

    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    path = resolve_model_dir(model_name) if not model_name.startswith("/") else model_name
    hf = on_engine_thread(engine, lambda: AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval())
    tok = engine.tokenizer
    width = max(map(len, ps))
    ids = torch.tensor([[tok.pad_token_id or 2] * (width - len(p)) + p for p in ps], device=device)
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps], device=device)

    def generate():
        with torch.no_grad():
            hf.generate(
                input_ids=ids,
                attention_mask=attn,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                pad_token_id=tok.pad_token_id or 2,
            )

    t_hf = on_engine_thread(engine, lambda: timed(generate, repeats))
    tokens = n * new
    return {  # tokens/s of each repeat; ratios come from the medians (bench/report.py)
        "sampling/tinkrl_concurrent_tok_s": [tokens / t for t in t_conc],
        "sampling/tinkrl_prebatched_tok_s": [tokens / t for t in t_pre],
        "sampling/hf_generate_tok_s": [tokens / t for t in t_hf],
        "sampling/tinkrl_lora_concurrent_tok_s": [tokens / t for t in t_lora],
    }


def bench_training(
    model_name: str, precision: str, device: str, repeats: int, rank: int = 16, compile: bool = False
) -> dict:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tinkrl.local import ServiceClient
    from tinkrl.local.models import resolve_model_dir

    svc = ServiceClient(device=device, dtype=precision, compile=compile)
    tc = svc.create_lora_training_client(model_name, rank=rank, seed=0)
    tok = tc.get_tokenizer()
    gen = torch.Generator().manual_seed(0)
    results = {}
    # RL-shaped data: 8 prompts x 8 responses of 16 tokens (shared prompts), and 64 distinct prompts.
    for label, ps in (("grouped", [p for p in prompts(tok, 8) for _ in range(8)]), ("distinct", prompts(tok, 64))):
        seqs = [p + torch.randint(100, 40000, (16,), generator=gen).tolist() for p in ps]
        datums = [
            types.Datum(
                model_input=types.ModelInput.from_ints(s[:-1]),
                loss_fn_inputs={"target_tokens": s[1:], "weights": [0.0] * (len(s) - 17) + [1.0] * 16},
            )
            for s in seqs
        ]
        n_tokens = sum(len(s) - 1 for s in seqs)
        t_ours = timed(lambda: tc.forward_backward(datums, "cross_entropy").result(), repeats)

        dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
        path = resolve_model_dir(model_name) if "/" in model_name and not model_name.startswith("/") else model_name
        peft_model = on_engine_thread(
            tc.engine,
            lambda: get_peft_model(
                AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device),
                LoraConfig(r=rank, lora_alpha=32, target_modules="all-linear"),
            ),
        )
        width = max(map(len, seqs))
        ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs], device=device)
        attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=device)
        labels = ids.clone()
        for row, s in enumerate(seqs):
            labels[row, : len(s) - 16] = -100
            labels[row, len(s) :] = -100

        def peft_step():
            out = peft_model(input_ids=ids, attention_mask=attn, labels=labels)
            out.loss.backward()

        t_peft = on_engine_thread(tc.engine, lambda: timed(peft_step, repeats))
        results[f"train_{label}/tinkrl_tok_s"] = [n_tokens / t for t in t_ours]
        results[f"train_{label}/peft_tok_s"] = [n_tokens / t for t in t_peft]
        peft_model = None  # frees the copy before the next workload
    return results


def save_results(args: argparse.Namespace, rows: dict[str, dict[str, list[float]]]) -> None:
    """One record per precision in <results>/engine/<machine class>.json."""
    import common  # bench/common.py, beside this script

    model = f"random {args.random}" if args.random else args.model
    for precision, repeats in rows.items():
        settings = {
            "model": model,
            "precision": precision,
            "device": args.device,
            "repeats": args.repeats,
            "compile": args.compile,
            "training": not args.skip_training,
        }
        common.write_result("engine", f"{model} {precision}", settings, repeats, args.results, device=args.device)


def main() -> None:
    import common  # bench/common.py, beside this script

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--random", choices=sorted(RANDOM_ARCHS), help="random weights of a real architecture")
    ap.add_argument("--precision", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-training", action="store_true")
    ap.add_argument("--compile", action="store_true", help="tinkrl's training side with compile=True")
    ap.add_argument("--rows-out", type=Path, help=argparse.SUPPRESS)  # a child's figures, for its parent
    common.add_results_arg(ap)
    args = ap.parse_args()
    model = random_model_dir(args.random) if args.random else args.model
    rows: dict[str, dict[str, list[float]]] = {}  # precision -> metric -> repeats
    if len(args.precision) > 1:  # one process per precision (see the module docstring)
        for precision in args.precision:
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                child = [
                    sys.executable,
                    __file__,
                    "--model",
                    args.model,
                    "--device",
                    args.device,
                    "--repeats",
                    str(args.repeats),
                    "--precision",
                    precision,
                    "--rows-out",
                    out.name,
                ]
                child += ["--random", args.random] if args.random else []
                child += ["--skip-training"] * args.skip_training + ["--compile"] * args.compile
                subprocess.run(child, check=True)
                rows.update(json.loads(Path(out.name).read_text()))
    else:
        precision = args.precision[0]
        row = bench_sampling(model, precision, args.device, args.repeats)
        if not args.skip_training:
            row.update(bench_training(model, precision, args.device, args.repeats, compile=args.compile))
        print(json.dumps({k: [round(x, 1) for x in v] for k, v in row.items()}), flush=True)
        rows[precision] = row
    if args.rows_out:
        args.rows_out.write_text(json.dumps(rows))
    else:
        save_results(args, rows)


if __name__ == "__main__":
    main()
