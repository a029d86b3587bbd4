"""`tinkrl eval`: run an agent K times on each task and report pass@1 / pass@K and each task's verdict.

    tinkrl eval --tasks tasks --model HuggingFaceTB/SmolLM2-135M-Instruct --n 4
    tinkrl eval --tasks tasks --checkpoint tinker://RUN/sampler_weights/final --n 4
    tinkrl eval --tasks tasks --checkpoint tinker://RUN/sampler_weights/final --backend tinker
    tinkrl eval --dataset-path tasks --task-id 'tb-*' --base-url http://localhost:8000/v1 --served-model M

Sandboxes go where the run config says (`--config FILE`, else `$TINKRL_CONFIG`, the file the
Helm chart mounts): its `sandbox:` section is the one `tinkrl train` uses (provider, namespace,
node selector, tolerations, pull secrets, limits); `--sandbox NAME` picks the provider and
`--set sandbox.KEY=VALUE` changes one setting.

`tb run` / `minitb run` command lines run as written with the program replaced by `tinkrl eval`
(the word `run` may stay): `--agent terminus-tinker` is tinkrl's agent, `--agent-kwarg
checkpoint_path=... --agent-kwarg model_name=...` its checkpoint and base model, and `--dataset
NAME==VERSION`, `--dataset-path`, `--task-id` (repeatable), `--n-concurrent`, `--output-path`,
`--log-level` mean what they mean there.

`--model`/`--checkpoint` sample through the Tinker API (`--backend auto`, the default: the Tinker
service for a checkpoint not on this machine or a model not on it when TINKER_API_KEY is set, else
the embedded engine; `local` / `tinker` decide outright); `--base-url` evaluates any
OpenAI-compatible endpoint. Results go to `<output-path>/<run-id>/` (see
`tinkrl.agents.evaluation`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tinkrl.errors import TinkrlError

if TYPE_CHECKING:
    from tinkrl.config import BackendConfig, SandboxConfig

# the agents `--agent` names: terminal-bench's name for a Terminus agent sampling through Tinker is tinkrl's own
AGENTS = {"terminus-tinker": "tinkrl's agent, sampling through the Tinker API (or --base-url)"}
# `--agent-kwarg KEY=VALUE` -> (the flag it sets, its type)
AGENT_KWARGS: dict[str, tuple[str, type]] = {
    "checkpoint_path": ("checkpoint", str),
    "model_name": ("model", str),
    "temperature": ("temperature", float),
    "max_turns": ("max_turns", int),
    "max_tokens": ("max_tokens", int),
}
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DEFAULT_MAX_TURNS = 10  # the tasks environment's own default


def build_parser() -> argparse.ArgumentParser:
    """The command line, with the `tb run` / `minitb run` spellings of the flags it shares."""
    p = argparse.ArgumentParser(prog="tinkrl eval", description="Run an agent on task directories and report pass@k.")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--tasks",
        "--dataset-path",
        "-p",
        dest="tasks",
        action="append",
        metavar="DIR",
        help="task dirs, dirs of them, or .json/.jsonl row files (repeatable; default: tasks)",
    )
    where.add_argument(
        "--dataset",
        "-d",
        metavar="NAME==VERSION",
        help="a terminal-bench registry dataset (NAME alone: its newest version), fetched once into the tinkrl cache",
    )
    p.add_argument(
        "--task-id",
        "-t",
        dest="task_ids",
        action="append",
        metavar="ID",
        help="only these tasks (ids or shell globs; repeatable)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", help="base model to sample through the Tinker API (default: the default model)")
    src.add_argument("--checkpoint", help="sampler weights or a state (tinker://... or a directory)")
    src.add_argument("--base-url", help="an OpenAI-compatible endpoint, e.g. http://localhost:8000/v1")
    p.add_argument(
        "--agent", default="terminus-tinker", choices=sorted(AGENTS), help="the agent (tb run's --agent spelling)"
    )
    p.add_argument(
        "--agent-kwarg",
        dest="agent_kwargs",
        action="append",
        metavar="KEY=VALUE",
        help=f"an agent setting (repeatable): {', '.join(AGENT_KWARGS)}; model_name with checkpoint_path is its "
        "base model",
    )
    p.add_argument("--api-key", help="key for --base-url (default: $OPENAI_API_KEY, else $TINKRL_API_KEY)")
    p.add_argument("--served-model", help="model name at --base-url (default: the first it lists)")
    p.add_argument("--n", "--n-attempts", dest="n", type=int, default=1, help="trials per task (K)")
    p.add_argument(
        "--max-turns",
        type=int,
        default=None,
        help=f"assistant turns per episode (default: what the --checkpoint's run trained with, else {DEFAULT_MAX_TURNS})",
    )
    p.add_argument("--max-tokens", type=int, default=512, help="tokens per turn")
    p.add_argument("--max-context-tokens", type=int, default=8192)
    p.add_argument("--episode-timeout", type=float, default=None, help="seconds (default: the task's agent timeout)")
    p.add_argument(
        "--wall-clock-timeout",
        action="store_true",
        help="count the model's time against the episode timeout too (default: only commands')",
    )
    p.add_argument("--command-timeout", type=float, default=60.0, help="seconds per execute_bash call at most")
    p.add_argument(
        "--action-format",
        choices=("tools", "shell"),
        default=None,
        help="tools: JSON tool calls; shell: one ```bash block per turn (default: what the --checkpoint's run "
        "trained with, else tools)",
    )
    p.add_argument(
        "--tool-format", choices=("hermes", "xml"), default=None, help="default: the checkpoint's, else hermes"
    )
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--n-concurrent", type=int, default=4)
    p.add_argument(
        "--output-path",
        default=None,
        help="results go to OUTPUT_PATH/RUN_ID/ (default: RUNS_DIR/eval, the run config's runs_dir, else runs/eval)",
    )
    p.add_argument("--run-id", default=None, help="default: the start time, YYYY-MM-DD__HH-MM-SS")
    p.add_argument(
        "--sandbox",
        default=None,
        help="sandbox provider: bwrap, docker, kubernetes or harbor (default: the run config's sandbox.provider, else bwrap)",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a run config (tinkrl train's YAML) whose sandbox: section places the sandboxes: namespace, node "
        "selector, tolerations, pull secrets, limits (default: $TINKRL_CONFIG, which the Helm chart sets)",
    )
    p.add_argument(
        "--set",
        dest="sandbox_sets",
        action="append",
        default=[],
        metavar="sandbox.KEY=VALUE",
        help="a sandbox setting over the run config's (repeatable), e.g. sandbox.kubernetes.namespace=team-a",
    )
    p.add_argument(
        "--backend",
        choices=("auto", "local", "tinker"),
        default="auto",
        help="for --model/--checkpoint: local (the embedded engine), tinker (the service at $TINKER_BASE_URL), "
        "or auto (tinker for what is not on this machine when TINKER_API_KEY is set)",
    )
    p.add_argument("--device", default=None, help="embedded engine device (cuda/cpu; default: the best there is)")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="warning", help="logging level (default: warning)")
    return p


def _apply_agent_kwargs(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Set the flags the `--agent-kwarg KEY=VALUE` settings name; `args.base_model` is model_name when a
    checkpoint is given too (the checkpoint's base model)."""
    args.base_model = None
    given: dict[str, str] = {}
    for item in args.agent_kwargs or []:
        key, eq, value = item.partition("=")
        if not eq:
            parser.error(f"--agent-kwarg {item!r}: expected KEY=VALUE")
        if key not in AGENT_KWARGS:
            parser.error(f"--agent-kwarg {key}: the {args.agent} agent takes {', '.join(AGENT_KWARGS)}")
        given[key] = value
    for key, value in given.items():
        dest, kind = AGENT_KWARGS[key]
        if key in ("checkpoint_path", "model_name") and getattr(args, dest) is not None:
            parser.error(f"--agent-kwarg {key} and --{dest} both given: keep one")
        try:
            setattr(args, dest, kind(value))
        except ValueError:
            parser.error(f"--agent-kwarg {key}={value}: expected a {kind.__name__}")
    if args.checkpoint and args.model:  # model_name with checkpoint_path: the checkpoint's base model
        args.base_model, args.model = args.model, None
    if args.base_url and (args.checkpoint or args.model):
        parser.error("--base-url evaluates a served model: no --model/--checkpoint/model_name/checkpoint_path")


def _backend_config(args: argparse.Namespace) -> BackendConfig:
    """The backend the flags name for --model/--checkpoint: --backend, --device when given, and the model
    (--model, else model_name given with a checkpoint, else the default model)."""
    from tinkrl.config import BackendConfig

    fields: dict[str, Any] = {"backend": args.backend}
    if args.device:
        fields["device"] = args.device
    if args.model or args.base_model:
        fields["model_name"] = args.model or args.base_model
    return BackendConfig(**fields)


def _backend(args: argparse.Namespace) -> tuple[str, str]:
    """(local or tinker, why) for --model/--checkpoint: the seam's one choice (`backends.choose_backend`),
    which asks the checkpoint path map whether --checkpoint is on this machine."""
    from tinkrl.backends import choose_backend

    return choose_backend(_backend_config(args), args.checkpoint)


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    for name in ("n", "max_turns", "max_tokens", "n_concurrent"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_context_tokens < 64:
        parser.error("--max-context-tokens must be at least 64")
    if args.temperature < 0:
        parser.error("--temperature must be >= 0")
    if (args.api_key or args.served_model) and not args.base_url:
        parser.error("--api-key and --served-model go with --base-url")
    if args.device and args.backend == "tinker":
        parser.error("--device goes with the embedded engine (--backend local or auto)")
    if args.dataset:
        from tinkrl.taskdirs.datasets import parse_spec

        try:
            parse_spec(args.dataset)
        except TinkrlError as e:
            parser.error(f"--dataset: {e}")


async def _main(args: argparse.Namespace) -> int:
    from tinkrl.agents.evaluation import (
        OpenAIPolicy,
        SamplingClientPolicy,
        format_table,
        run_trials,
        summarize,
        write_outputs,
    )
    from tinkrl.aio_thread import widen_default_executor
    from tinkrl.envs.agent_tasks.config import TasksEnvConfig
    from tinkrl.sandbox import LazyProvider, get_provider

    widen_default_executor()  # trials waiting for a sandbox slot never starve those holding one
    cfg = TasksEnvConfig(
        **({"dataset": args.dataset} if args.dataset else {"path": args.tasks or ["tasks"]}),
        task_ids=args.task_ids,
        max_turns=args.max_turns or DEFAULT_MAX_TURNS,
        max_tokens_per_turn=args.max_tokens,
        max_context_tokens=args.max_context_tokens,
        episode_timeout_s=args.episode_timeout,
        timeout_includes_sampling=args.wall_clock_timeout,
        command_timeout_s=args.command_timeout,
        action_format=args.action_format or "tools",
        tool_format=args.tool_format or "hermes",
        gate=False,
    )
    tasks = cfg.load_tasks()
    provider = get_provider(args.sandbox_config.provider, **args.sandbox_config.provider_options())
    # Closed last to first also when a step fails: the OpenAI client or the Tinker service, then the sandboxes.
    async with contextlib.AsyncExitStack() as cleanup:
        cleanup.callback(provider.close)
        if args.base_url:
            policy: Any = OpenAIPolicy(
                args.base_url,
                args.api_key,
                args.served_model,
                cfg,
                LazyProvider(provider),
                args.temperature,
            )
            cleanup.push_async_callback(policy.client.close)
            model_name = await policy.resolve_model()
            model_label = model_name
        else:
            from tinkrl.backends import checkpoint_metadata, make_service_client
            from tinkrl.renderers import get_renderer

            chosen, why = _backend(args)
            print(f"tinkrl eval: backend {chosen} ({why})", file=sys.stderr)
            backend = _backend_config(args).model_copy(update={"backend": chosen})
            # Leaving the stack finishes the service's session with the evaluation's outcome.
            service = cleanup.enter_context(make_service_client(backend))
            if args.checkpoint:
                sc = await asyncio.to_thread(service.create_sampling_client, model_path=args.checkpoint)
                model_label = args.checkpoint
                trained = await asyncio.to_thread(checkpoint_metadata, service, args.checkpoint)
                for name in ("action_format", "tool_format", "max_turns"):
                    if getattr(args, name) is None and name in trained:
                        value = int(trained[name]) if name == "max_turns" else trained[name]
                        setattr(cfg, name, value)
                        print(f"tinkrl eval: {name}={value}, as the checkpoint was trained", file=sys.stderr)
            else:
                sc = await asyncio.to_thread(service.create_sampling_client, base_model=backend.model_name)
                model_label = backend.model_name
            model_name = sc.get_base_model()
            if args.base_model and model_name != args.base_model:
                raise TinkrlError(f"{args.checkpoint} was trained from {model_name}, not model_name={args.base_model}")
            renderer = get_renderer(sc.get_tokenizer(), model_name, cfg.tool_format)
            policy = SamplingClientPolicy(sc, cfg, renderer, LazyProvider(provider), args.temperature)
        run_id = args.run_id or dt.datetime.now().strftime("%Y-%m-%d__%H-%M-%S")
        print(f"tinkrl eval: sandboxes: {_where(args.sandbox_config)}", file=sys.stderr)
        out_dir = Path(args.output_path) / run_id
        print(f"tinkrl eval: {len(tasks)} tasks x {args.n} trials with {model_label} -> {out_dir}", file=sys.stderr)
        t0 = time.monotonic()
        trials = await run_trials(
            tasks, policy, args.n, args.n_concurrent, partial_path=out_dir / "results.partial.jsonl"
        )
        seconds = time.monotonic() - t0
    rows, overall = summarize(trials, args.n)
    table = format_table(rows, overall, args.n)
    meta = {
        "run_id": run_id,
        "model": model_label,
        "base_model": model_name,
        "n_attempts": args.n,
        "temperature": args.temperature,
        "max_turns": cfg.max_turns,
        "max_tokens": args.max_tokens,
        "max_context_tokens": args.max_context_tokens,
        "action_format": cfg.action_format,
        "tool_format": cfg.tool_format,
        "seconds": round(seconds, 1),
        "base_url": args.base_url,
    }
    write_outputs(out_dir, trials, rows, overall, table, meta)
    (out_dir / "results.partial.jsonl").unlink(missing_ok=True)  # results.jsonl has them all, in order
    print(table)
    print(f"results: {out_dir} ({seconds:.0f}s)", file=sys.stderr)
    return 1 if trials and all(t.failure_mode is not None for t in trials) else 0


def sandbox_settings(args: argparse.Namespace) -> SandboxConfig:
    """The sandbox config of this evaluation: the run config's `sandbox:` section (`--config`, else
    `$TINKRL_CONFIG`: the one `tinkrl train` reads), `--set sandbox.*=...` over it, `--sandbox` picking the
    provider. ConfigError when it is bad."""
    from tinkrl.config import load_sandbox_config

    sets = list(args.sandbox_sets) + ([f"sandbox.provider={args.sandbox}"] if args.sandbox else [])
    return load_sandbox_config(args.config, sets)


def default_output_path(config_path: str | None) -> str:
    """`<runs_dir>/eval`: next to the run config's runs (`/runs` on the cluster, on the synced volume)."""
    from tinkrl.config import runs_dir_of

    return str(Path(runs_dir_of(config_path)) / "eval")


def _where(sandbox: SandboxConfig) -> str:
    """Where the sandboxes run, in a few words (printed at the start)."""
    if sandbox.provider != "kubernetes":
        return sandbox.provider
    k = sandbox.kubernetes
    placed = ",".join(f"{key}={value}" for key, value in k.node_selector.items())
    return f"kubernetes pods in namespace {k.namespace}" + (f" on nodes {placed}" if placed else "")


def cli_main(argv: list[str]) -> int:
    """`tinkrl eval` (or `tinkrl eval run`, tb's spelling): exit 1 when every trial failed on infrastructure,
    2 on a bad flag or setup error."""
    parser = build_parser()
    args = parser.parse_args(argv[1:] if argv[:1] == ["run"] else argv)
    _apply_agent_kwargs(args, parser)
    _check(args, parser)
    from tinkrl.errors import ConfigError

    try:
        args.sandbox_config = sandbox_settings(args)
        args.output_path = args.output_path or default_output_path(args.config)
    except ConfigError as e:
        parser.error(str(e))
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(format="tinkrl eval: %(levelname)s %(name)s: %(message)s")
    before = root.level
    root.setLevel(getattr(logging, args.log_level.upper()))
    try:
        return asyncio.run(_main(args))
    except TinkrlError as e:
        print(f"tinkrl eval: {e}", file=sys.stderr)
        return 2
    finally:
        root.setLevel(before)
