"""`tinkrl sft`: supervised fine-tuning on chat or agent-trajectory JSONL, through the Tinker API.

    tinkrl sft --data conversations.jsonl [--model M] [--steps 100] [--batch-size 32] [--learning-rate 1e-4]
    tinkrl sft --data trajectories.jsonl --backend tinker --log-path runs/sft

One conversation per line, `{"messages": [...]}` (OpenAI chat messages, as tinker-cookbook's
supervised recipes read them); the loss is on every assistant turn's tokens, laid out as a
multi-turn episode is sampled (`tinkrl.rl.supervised`: one datum, or one per stretch of turns
where the chat format rewrites its history), so a trajectory trained here is the same tokens RL
later samples. Per-step lines go to `<log-path>/metrics.jsonl`; the last line
printed is `final sampler weights: tinker://...`, which `tinkrl train resume_from=...` (its state),
`tinkrl eval --checkpoint` and `tinkrl export` take.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from tinkrl.errors import TinkrlError


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="tinkrl sft", description="Supervised fine-tuning on JSONL conversations.")
    p.add_argument("--data", required=True, metavar="FILE.jsonl", help='one {"messages": [...]} per line')
    p.add_argument("--model", default=None, help="base model (default: the default model)")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="datums per step (default 32): a conversation, or a stretch of its turns (rl/supervised.py)",
    )
    p.add_argument("--learning-rate", type=float, default=1e-4, help="Adam learning rate (default 1e-4)")
    p.add_argument("--lora-rank", type=int, default=32, help="LoRA rank (default 32)")
    p.add_argument("--max-length", type=int, default=4096, help="tokens per datum at most (default 4096)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=("local", "tinker"), default="local")
    p.add_argument("--log-path", default="runs/sft", help="where metrics.jsonl goes (default runs/sft)")
    return p


async def _main(args: argparse.Namespace) -> int:
    from tinkrl.backends import make_service_client
    from tinkrl.config import BackendConfig
    from tinkrl.rl.supervised import load_conversations

    conversations = load_conversations(args.data)
    backend = BackendConfig(backend=args.backend)
    if args.model:
        backend.model_name = args.model
    with make_service_client(backend) as service:  # leaving it, the service records how the run ended
        return await _train(args, service, backend.model_name, conversations)


async def _train(
    args: argparse.Namespace, service: Any, model_name: str, conversations: list[list[dict[str, Any]]]
) -> int:
    """Fit `conversations` on a new LoRA of `model_name`, then save its state and sampler weights."""
    from tinker import types

    from tinkrl.renderers import get_renderer
    from tinkrl.rl.supervised import conversation_datums, to_datum, train_supervised
    from tinkrl.tracking import append_jsonl

    tc = await asyncio.to_thread(
        service.create_lora_training_client, base_model=model_name, rank=args.lora_rank, seed=args.seed
    )
    renderer = get_renderer(tc.get_tokenizer(), model_name)
    datums = [
        to_datum(tokens, weights, args.max_length)
        for conv in conversations
        for tokens, weights in conversation_datums(renderer, conv)
    ]
    log_dir = Path(args.log_path)
    log_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = log_dir / "metrics.jsonl"
    t0 = time.time()
    print(
        f"tinkrl sft: {len(conversations)} conversations ({len(datums)} datums), {args.steps} steps of {args.batch_size} on {model_name}"
    )

    def on_step(step: int, m: dict[str, float]) -> None:
        append_jsonl(metrics_path, {"step": step, **m, "time/total": time.time() - t0})
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step}: nll {m['sft/nll']:.4f}", flush=True)

    adam = types.AdamParams(learning_rate=args.learning_rate)
    await train_supervised(tc, datums, args.steps, args.batch_size, adam, args.seed, on_step)
    state = await tc.save_state("final")
    sampler = await tc.save_weights_for_sampler("final")
    print(f"final state: {state.path}")
    print(f"final sampler weights: {sampler.path}")
    return 0


def cli_main(argv: list[str]) -> int:
    """`tinkrl sft`: exit 0 when trained, 2 on bad input (a one-line error)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "lora_rank", "max_length"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.learning_rate <= 0:
        parser.error("--learning-rate must be positive")
    try:
        return asyncio.run(_main(args))
    except TinkrlError as e:
        print(f"tinkrl sft: {e}", file=sys.stderr)
        return 2
