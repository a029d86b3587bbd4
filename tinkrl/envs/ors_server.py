"""`tinkrl serve env`, at the path `tinkrl/cli.py` names; the command lives in `tinkrl.envs.ors.server`."""

from tinkrl.envs.ors.server import cli_main

__all__ = ["cli_main"]
