"""`tinkrl export PATH --out DIR [--merged]`: a checkpoint as a PEFT adapter or a merged HF model.

`tinkrl export traces RUN_DIR --docent [--collection NAME] [--steps A:B] [--out FILE]`: a run's
episodes (or a `tinkrl eval` output's trials) as Docent agent runs, uploaded when `DOCENT_API_KEY` is
set, else written to a JSON file the Docent SDK reads back.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _steps(spec: str | None) -> range | None:
    """`A:B` (B excluded), `A:` (to the end), or one step `A`."""
    if not spec:
        return None
    lo, sep, hi = spec.partition(":")
    try:
        start = int(lo or 0)
        return range(start, int(hi) if hi else 10**9) if sep else range(start, start + 1)
    except ValueError as e:
        raise SystemExit(f"tinkrl export traces: --steps {spec!r}: expected A:B, A: or A") from e


def traces_main(argv: list[str]) -> int:
    """`tinkrl export traces`: exit 1 on a bad directory, a missing SDK or a failed upload."""
    parser = argparse.ArgumentParser(prog="tinkrl export traces", description=__doc__)
    parser.add_argument("path", type=Path, help="a run directory or a tinkrl eval output directory")
    parser.add_argument("--docent", action="store_true", required=True, help="as Docent agent runs")
    parser.add_argument("--collection", help="Docent collection name or id (default: the directory's name)")
    parser.add_argument("--steps", help="only these training steps: A:B (B excluded), A:, or A")
    parser.add_argument("--out", type=Path, help="JSON file to write (default: PATH/docent_agent_runs.json)")
    parser.add_argument("--file", action="store_true", help="write the JSON file even when credentials are set")
    args = parser.parse_args(argv)
    from tinkrl.errors import TinkrlError
    from tinkrl.traces.docent import export_traces
    from tinkrl.traces.runs import episode_steps

    steps = _steps(args.steps)
    try:
        wanted = None if steps is None else [s for s in episode_steps(args.path) if s in steps]
        print(export_traces(args.path, wanted, args.collection, args.out, args.file))
    except TinkrlError as e:
        print(f"tinkrl export traces: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # the Docent API answered an error (auth, network): one line
        print(f"tinkrl export traces: Docent upload failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


def cli_main(argv: list[str]) -> int:
    """`tinkrl export`: exit 1 when the checkpoint or its base model cannot be found."""
    if argv[:1] == ["traces"]:
        return traces_main(argv[1:])
    parser = argparse.ArgumentParser(prog="tinkrl export", description=__doc__)
    parser.add_argument("path", help="tinker://<run>/sampler_weights/<name>, .../weights/<name>, or a directory")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--merged", action="store_true", help="merge LoRA into the base weights (HF model dir)")
    args = parser.parse_args(argv)
    from tinkrl.errors import TinkrlError
    from tinkrl.local.checkpoints import export_checkpoint

    try:
        out = export_checkpoint(args.path, args.out, args.merged)
    except TinkrlError as e:  # a missing checkpoint or base model: one line, not a traceback
        print(f"tinkrl export: {e}", file=sys.stderr)
        return 1
    print(f"wrote {'merged model' if args.merged else 'PEFT adapter'} to {out}")
    return 0
