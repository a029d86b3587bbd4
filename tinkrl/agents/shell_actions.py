"""The shell action format: one fenced bash block per turn, its output as the next user turn.

A small model writes Markdown code blocks long before it writes JSON tool calls, and a short
system prompt leaves the context for the task. Each assistant turn is read as:
- a ```` ```bash ```` block (also ```` ```sh ````, ```` ```shell ```` or an unlabelled block): its
  text runs as one `execute_bash` call; only the first block of a turn runs;
- `DONE` on a line of its own (after the block, or alone): the episode ends and is graded;
- neither: an error observation saying what to write.

The calls are OpenAI-style (`execute_bash`, `submit`), so `TaskSession` runs them as it runs
tool calls; their results go back as user turns (`observation_message`). The JSON tool-call
format (`action_format: tools`) stays the default for task directories.
"""

from __future__ import annotations

import re

from tinkrl.renderers.base import tool_call

ACTION_FORMATS = ("tools", "shell")
DONE_MARKER = "DONE"
SHELL_SYSTEM_PROMPT = (
    "You are an agent in a Linux shell. The working directory is {workdir}. Each reply is one "
    "command in a ```bash code block; you then see its output. When the task is done, reply DONE."
)
NO_COMMAND = (
    f"No command found. Reply with one command in a ```bash code block, or {DONE_MARKER} when the task is done."
)
EMPTY_BLOCK = "The ```bash block is empty: put one command in it."
EXTRA_BLOCKS = "Only the first ```bash block of a reply runs; send the next command in your next reply."

_BLOCK = re.compile(r"```[ \t]*(bash|sh|shell|console)?[ \t]*\n(.*?)(?:\n?```|\Z)", re.S)
_DONE = re.compile(rf"^\s*\**{DONE_MARKER}\**[.!]?\s*$", re.M)


def parse_shell_reply(text: str) -> tuple[list[dict], list[str], list[str]]:
    """A reply as (calls, errors, notes): `execute_bash` with the first block's text and/or `submit`
    when DONE stands on a line of its own after it; errors for a reply with neither (or an empty
    block); a note when blocks after the first were not run."""
    blocks = list(_BLOCK.finditer(text))
    labelled = [b for b in blocks if b.group(1)]
    block = labelled[0] if labelled else (blocks[0] if blocks else None)
    calls: list[dict] = []
    errors: list[str] = []
    notes: list[str] = []
    after = text
    if block is not None:
        command = block.group(2).strip("\n")
        if command.strip():
            calls.append(tool_call("execute_bash", {"command": command}))
        else:
            errors.append(EMPTY_BLOCK)
        after = text[block.end() :]
        if _BLOCK.search(after):
            notes.append(EXTRA_BLOCKS)
    if _DONE.search(after):
        calls.append(tool_call("submit", {}))
    elif block is None:
        errors.append(NO_COMMAND)
    return calls, errors, notes


def observation_message(output: str) -> dict:
    """A command's result as the user turn the model reads next."""
    return {"role": "user", "content": output}


def reference_reply(command: str | None) -> str:
    """The reply that runs `command` in this format, or says DONE when it is None (for reference trajectories)."""
    return DONE_MARKER if command is None else f"```bash\n{command}\n```"
