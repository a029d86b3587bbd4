"""`tinkrl sandbox run` prints the command's output and exits with its status."""

import pytest
from helpers.requirements import needs_bwrap

from tinkrl.commands.sandbox import cli_main
from tinkrl.sandbox import get_provider
from tinkrl.sandbox.base import SandboxError

pytestmark = needs_bwrap


def test_run_prints_output_and_exit_status(capsys):
    assert cli_main(["run", "--workdir", "/testbed", "--", "pwd; echo oops >&2; exit 3"]) == 3
    out = capsys.readouterr()
    assert out.out == "/testbed\n" and out.err == "oops\n"
    assert cli_main(["run", "--", "echo", "a b", "c"]) == 0
    assert capsys.readouterr().out == "a b c\n"
    assert cli_main(["run", "--timeout", "0.5", "--", "sleep 5"]) == 124
    assert cli_main(["run", "--"]) == 2


def test_unknown_provider_is_one_clear_error():
    with pytest.raises(SandboxError, match="unknown sandbox provider 'nope'"):
        get_provider("nope")
