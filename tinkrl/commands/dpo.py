"""`tinkrl dpo [CONFIG.yaml] [key=value ...]`: Direct Preference Optimization from a run config.

    tinkrl dpo configs/dpo.yaml
    tinkrl dpo dpo.pairs=pairs.jsonl dpo.beta=0.1 max_steps=100 batch_size=16
    tinkrl dpo dpo.pairs=hf:Anthropic/hh-rlhf model_name=meta-llama/Llama-3.2-1B backend=tinker

The config is `tinkrl train`'s (the same keys, dialects, `--dry-run` and `--help`), with its `dpo:`
section naming the pairs, the reference and beta; `batch_size` counts pairs per step, and
`environments:`, when set, are evaluated held-out before the first step and after the last. The
pairs are read and checked before any model loads (a bad record is one line naming it); the run
then trains in its run directory as an RL run does (`tinkrl.rl.dpo`), resumes there, logs to W&B
when enabled and shows in `tinkrl view`. The last line printed is `final sampler weights: ...`,
which `tinkrl eval --checkpoint`, `tinkrl export` and `teacher=` take.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys

from tinkrl.config import load_dotenv_file
from tinkrl.errors import ConfigError

USAGE = """usage: tinkrl dpo [CONFIG.yaml] [key=value ...] [--dry-run]

The keys are tinkrl train's (tinkrl train --help lists them); dpo.pairs names the pairs (a JSONL
file, hf:DATASET, or a tinkrl run directory), dpo.beta and dpo.reference the loss's settings.
--dry-run prints the resolved plan as JSON and exits."""


def cli_main(argv: list[str]) -> int:
    """`tinkrl dpo`: exit 0 when the run finishes (or the dry run's plan is printed), 2 on a config or pair
    error, 1 on another error."""
    from tinkrl.commands.train import carry_out, help_text, load, parse_cli

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    load_dotenv_file()
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE + "\n\n" + help_text().split("\n\n", 1)[1])
        return 0
    try:
        config_path, overrides, mode = parse_cli(argv)
        if mode == "prepare":
            raise ConfigError("--prepare is tinkrl train's; tinkrl dpo takes --dry-run")
        config = load(config_path, overrides)
        if not config.dpo.pairs:
            raise ConfigError(
                "tinkrl dpo needs dpo.pairs: a JSONL file of pairs, hf:DATASET, or a tinkrl run directory"
            )
        from tinkrl.commands.plan import make_plan

        plan = make_plan(config)
    except ConfigError as e:
        print(f"tinkrl dpo: error: {e}", file=sys.stderr)
        return 2
    if mode == "dry-run":
        print(json.dumps(plan.as_dict(), indent=2))
        return 0

    def work() -> None:
        from tinkrl.envs import build_environments, checkpoint_metadata
        from tinkrl.rl.dpo import main, read_pairs

        pairs = read_pairs(plan.config)
        print(f"pairs: {len(pairs)} from {config.dpo.pairs}", flush=True)
        factory = lambda renderer, run_dir: build_environments(plan.config, renderer, run_dir)  # noqa: E731
        asyncio.run(main(plan, pairs, factory, checkpoint_metadata(plan.config)))

    return carry_out("tinkrl dpo", plan, work)
