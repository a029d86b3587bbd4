"""The `tinkrl` command: train, eval, export, tasks, sandbox, serve.

Each subcommand lives with the code it drives and is imported lazily, so `tinkrl --help`
and config errors answer at once without loading torch.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, function, one-line help). Each function takes argv and returns an exit code.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "train": (
        "tinkrl.commands.train",
        "cli_main",
        "RL training from a config: tinkrl train [CONFIG.yaml] [key=value ...]",
    ),
    "eval": ("tinkrl.commands.eval", "cli_main", "run an agent on task dirs: tinkrl eval --tasks DIR --n K"),
    "export": ("tinkrl.local.export", "cli_main", "export a checkpoint as a PEFT adapter or merged HF model"),
    "tasks": ("tinkrl.taskdirs.cli", "cli_main", "task directories: tinkrl tasks check DIR..."),
    "sandbox": ("tinkrl.sandbox.cli", "cli_main", "sandboxes: tinkrl sandbox run -- CMD, tinkrl sandbox reap"),
}
SERVE: dict[str, tuple[str, str, str]] = {
    "tinker": ("tinkrl.tinker_server.cli", "cli_main", "the Tinker HTTP protocol over the embedded engine"),
    "openai": ("tinkrl.proxy.cli", "cli_main", "an OpenAI-compatible server over the policy, with token capture"),
    "env": ("tinkrl.envs.ors.server", "cli_main", "serve tinkrl environments over the Open Reward Standard"),
}


def _usage() -> str:
    lines = ["usage: tinkrl COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<14}{help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += [f"  serve {name:<8}{help_}" for name, (_, _, help_) in SERVE.items()]
    return "\n".join(lines)


def _run(entry: tuple[str, str, str], argv: list[str]) -> int:
    module, func, _ = entry
    return int(getattr(importlib.import_module(module), func)(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "serve":
        if not rest or rest[0] not in SERVE:
            print(f"tinkrl serve: choose one of {', '.join(SERVE)}", file=sys.stderr)
            return 2
        return _run(SERVE[rest[0]], rest[1:])
    if cmd not in COMMANDS:
        print(f"tinkrl: unknown command {cmd!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return _run(COMMANDS[cmd], rest)


if __name__ == "__main__":
    sys.exit(main())
