"""The `tinkrl` command: train, sft, dpo, eval, render, export, view, tasks, sandbox, launch, serve.

Each subcommand is a module of `tinkrl.commands` with a `cli_main(argv) -> exit code` (its
argument parsing, wiring the library parts together), imported only when it runs, so
`tinkrl --help` answers at once.
"""

from __future__ import annotations

import importlib
import sys

from tinkrl.allocator import reexec_on_tcmalloc

# subcommand -> one-line help; `tinkrl NAME` runs tinkrl.commands.NAME
COMMANDS: dict[str, str] = {
    "train": "RL training from a config: tinkrl train [CONFIG.yaml] [key=value ...]",
    "sft": "supervised fine-tuning on JSONL conversations: tinkrl sft --data FILE.jsonl",
    "dpo": "preference training (DPO) on pairs: tinkrl dpo [CONFIG.yaml] dpo.pairs=FILE.jsonl [key=value ...]",
    "eval": "run an agent on task dirs: tinkrl eval --tasks DIR --n K",
    "render": "a conversation as a model's prompt tokens: tinkrl render MODEL --messages FILE.json",
    "export": "a checkpoint as a PEFT adapter or merged HF model; traces to Docent: tinkrl export traces RUN_DIR",
    "view": "a local web page over runs and evals (curves, episodes, transcripts): tinkrl view RUN_DIR...",
    "tasks": "task directories: tinkrl tasks check DIR...",
    "sandbox": "sandboxes: tinkrl sandbox run -- CMD, tinkrl sandbox reap",
    "launch": "run a command on Beaker or as a Kubernetes Job: tinkrl launch beaker|k8s|image ...",
}
# `tinkrl serve NAME` runs tinkrl.commands.serve_NAME
SERVE: dict[str, str] = {
    "tinker": "the Tinker HTTP protocol over the embedded engine",
    "openai": "an OpenAI-compatible server over the policy, with token capture",
    "env": "serve tinkrl environments over the Open Reward Standard",
}


def _usage() -> str:
    lines = ["usage: tinkrl COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<14}{help_}" for name, help_ in COMMANDS.items()]
    lines += [f"  serve {name:<8}{help_}" for name, help_ in SERVE.items()]
    return "\n".join(lines)


def _run(module: str, argv: list[str]) -> int:
    return int(importlib.import_module(f"tinkrl.commands.{module}").cli_main(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    """Dispatch `tinkrl COMMAND ...`; returns the exit code."""
    if argv is None:  # the command itself, not a caller in-process: start again on tcmalloc where there is one
        reexec_on_tcmalloc()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "serve":
        if not rest or rest[0] not in SERVE:
            print(f"tinkrl serve: choose one of {', '.join(SERVE)}", file=sys.stderr)
            return 2
        return _run(f"serve_{rest[0]}", rest[1:])
    if cmd not in COMMANDS:
        print(f"tinkrl: unknown command {cmd!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return _run(cmd, rest)


if __name__ == "__main__":
    sys.exit(main())
