"""The shell action format: bash blocks and DONE parsed into calls, outputs as user turns."""

from __future__ import annotations

import json

from tinkrl.agents.shell_actions import EMPTY_BLOCK, EXTRA_BLOCKS, NO_COMMAND, parse_shell_reply, reference_reply


def _names_and_commands(calls: list[dict]) -> list[tuple[str, str | None]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]).get("command")) for c in calls]


def test_a_bash_block_is_one_command() -> None:
    calls, errors, notes = parse_shell_reply("Sure:\n```bash\nmkdir backups\n```")
    assert _names_and_commands(calls) == [("execute_bash", "mkdir backups")]
    assert errors == [] and notes == []


def test_done_after_the_block_submits_after_running_it() -> None:
    calls, errors, _ = parse_shell_reply("```sh\ncp a.txt b.txt\n```\nDONE")
    assert _names_and_commands(calls) == [("execute_bash", "cp a.txt b.txt"), ("submit", None)]
    assert errors == []


def test_done_alone_submits_and_done_inside_prose_does_not() -> None:
    assert _names_and_commands(parse_shell_reply("DONE")[0]) == [("submit", None)]
    assert _names_and_commands(parse_shell_reply("**DONE**.")[0]) == [("submit", None)]
    calls, errors, _ = parse_shell_reply("I am not DONE yet, let me think.")
    assert calls == [] and errors == [NO_COMMAND]


def test_only_the_first_block_runs_and_the_model_is_told() -> None:
    calls, _, notes = parse_shell_reply("```bash\nls\n```\nthen\n```bash\nrm -r /app\n```")
    assert _names_and_commands(calls) == [("execute_bash", "ls")]
    assert notes == [EXTRA_BLOCKS]


def test_a_labelled_block_wins_over_an_unlabelled_one_and_a_cut_block_still_runs() -> None:
    calls, _, _ = parse_shell_reply("```\noutput here\n```\n```bash\nwc -l < f.txt > n.txt\n```")
    assert _names_and_commands(calls) == [("execute_bash", "wc -l < f.txt > n.txt")]
    calls, _, _ = parse_shell_reply("```bash\necho hi > a.txt")  # cut by max_tokens before the fence closed
    assert _names_and_commands(calls) == [("execute_bash", "echo hi > a.txt")]


def test_an_empty_block_is_an_error() -> None:
    calls, errors, _ = parse_shell_reply("```bash\n\n```")
    assert calls == [] and errors == [EMPTY_BLOCK]


def test_reference_replies_parse_back() -> None:
    assert _names_and_commands(parse_shell_reply(reference_reply("sort -u a > b"))[0]) == [
        ("execute_bash", "sort -u a > b")
    ]
    assert _names_and_commands(parse_shell_reply(reference_reply(None))[0]) == [("submit", None)]
