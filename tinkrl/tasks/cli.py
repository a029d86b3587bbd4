"""`tinkrl tasks`: the command lives in `tinkrl.taskdirs.cli`; this is the path `tinkrl/cli.py` names."""

from tinkrl.taskdirs.cli import cli_main

__all__ = ["cli_main"]
