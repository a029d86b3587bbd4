"""`tinkrl export PATH --out DIR [--merged]`: a checkpoint as a PEFT adapter or a merged HF model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cli_main(argv: list[str]) -> int:
    """`tinkrl export`: exit 1 when the checkpoint or its base model cannot be found."""
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
