"""Agent tools that act on a Sandbox: execute_bash, file_editor, search, submit.

Each tool has an OpenAI-style JSON schema (`TOOL_SCHEMAS`) and `run_tool(sandbox, name,
arguments)` dispatches an already-parsed call. Whatever the model gets wrong — bad JSON,
an unknown tool, a missing or mistyped argument, a path that does not exist — comes back
as an error observation for the model to read, never an exception. A command that times
out returns a timeout observation and the sandbox stays usable. Only infrastructure
failures (`SandboxError`: the sandbox itself died) propagate, so the rollout can record a
failure_mode instead of training on them.
"""

from __future__ import annotations

import json
import shlex
import weakref
from collections.abc import Callable
from typing import Any

from tinkrl.sandbox.base import Sandbox, SandboxError

MAX_OBSERVATION_CHARS = 16_000
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 600.0
SNIPPET_LINES = 4
MAX_SEARCH_FILES = 100


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


TOOL_SCHEMAS: list[dict] = [
    _fn(
        "execute_bash",
        "Run a bash command in the sandbox. The working directory and exported variables carry over to the next "
        "call; background processes keep running. Long-running commands are killed at the timeout.",
        {
            "command": {"type": "string", "description": "the bash command to run"},
            "timeout": {
                "type": "number",
                "description": f"seconds before the command is killed (default "
                f"{DEFAULT_TIMEOUT_S:g}, at most {MAX_TIMEOUT_S:g})",
            },
        },
        ["command"],
    ),
    _fn(
        "file_editor",
        "View, create and edit files. `view` shows a file with line numbers (or lists a directory), `create` "
        "writes a new file, `str_replace` replaces exactly one occurrence of old_str with new_str, `insert` adds "
        "new_str after line insert_line (0 = at the top), `undo_edit` reverts the last edit of a file.",
        {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
            "path": {"type": "string", "description": "absolute path of the file or directory"},
            "file_text": {"type": "string", "description": "content for `create`"},
            "old_str": {"type": "string", "description": "text to replace (`str_replace`), must occur exactly once"},
            "new_str": {"type": "string", "description": "replacement (`str_replace`) or text to insert (`insert`)"},
            "insert_line": {"type": "integer", "description": "line after which to insert (`insert`)"},
            "view_range": {
                "type": "array",
                "items": {"type": "integer"},
                "description": "[start, end] lines to view, 1-based; end -1 means to the end",
            },
        },
        ["command", "path"],
    ),
    _fn(
        "search",
        "Search for a literal string in a file or, recursively, in a directory (hidden files skipped).",
        {
            "search_term": {"type": "string", "description": "the text to look for"},
            "path": {"type": "string", "description": "file or directory to search (default: the working directory)"},
        },
        ["search_term"],
    ),
    _fn("submit", "Finish the task: call this when you are done. Nothing after it is run.", {}, []),
]
TOOL_NAMES = [s["function"]["name"] for s in TOOL_SCHEMAS]


class ToolError(Exception):
    """A bad call: the message is the observation the model sees."""


def clip(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    """`text` cut to about `limit` characters, keeping its head and tail."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters omitted ...]\n{text[-half:]}"


def _arg(args: dict, name: str, kind: type | tuple, required: bool = True, default: Any = None) -> Any:
    if name not in args or args[name] is None:
        if required:
            raise ToolError(f"missing required argument {name!r}")
        return default
    value = args[name]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, kind) or (kind in (int, float) and isinstance(value, bool)):
        want = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ToolError(f"argument {name!r} must be a {want}, got {type(value).__name__}")
    return value


# -- execute_bash ----------------------------------------------------------------------------
def execute_bash(sandbox: Sandbox, args: dict) -> str:
    """Run `command` in the sandbox; the observation is its output and exit code, or a timeout note."""
    command = _arg(args, "command", str)
    if not command.strip():
        raise ToolError("argument 'command' is empty")
    timeout = _arg(args, "timeout", float, required=False, default=DEFAULT_TIMEOUT_S)
    if timeout <= 0:
        raise ToolError("argument 'timeout' must be positive")
    timeout = min(timeout, MAX_TIMEOUT_S)
    r = sandbox.exec(command, timeout=timeout)
    out = r.output
    if r.timed_out:
        return clip(
            f"{out}\n[the command timed out after {timeout:g}s and was killed; the sandbox is still usable]".lstrip(
                "\n"
            )
        )
    return clip(f"{out}{'' if not out or out.endswith(chr(10)) else chr(10)}[exit code: {r.exit_code}]")


# -- file_editor -----------------------------------------------------------------------------
_HISTORY: weakref.WeakKeyDictionary[Sandbox, dict[str, list[bytes | None]]] = weakref.WeakKeyDictionary()


def _abs_path(args: dict) -> str:
    path = _arg(args, "path", str)
    if not path.startswith("/"):
        raise ToolError(f"path {path!r} is not absolute; give the full path, e.g. /app/{path.lstrip('./')}")
    return path


def _read_text(sandbox: Sandbox, path: str) -> str:
    try:
        data = sandbox.read_file(path)
    except FileNotFoundError:
        raise ToolError(f"{path} does not exist") from None
    except IsADirectoryError:
        raise ToolError(f"{path} is a directory") from None
    except OSError as e:
        raise ToolError(f"cannot read {path}: {e.strerror or e}") from None
    if b"\0" in data[:8192]:
        raise ToolError(f"{path} is a binary file")
    return data.decode("utf-8", "replace")


def _write(sandbox: Sandbox, path: str, text: str, old: bytes | None) -> None:
    try:
        sandbox.write_file(path, text.encode())
    except IsADirectoryError:
        raise ToolError(f"{path} is a directory") from None
    except OSError as e:
        raise ToolError(f"cannot write {path}: {e.strerror or e}") from None
    _HISTORY.setdefault(sandbox, {}).setdefault(path, []).append(old)


def _numbered(text: str, start: int = 1) -> str:
    return "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(text.split("\n"), start))


def _snippet(text: str, center_line: int, n_new: int = 1) -> str:
    lines = text.split("\n")
    lo = max(center_line - SNIPPET_LINES, 1)
    hi = min(center_line + n_new - 1 + SNIPPET_LINES, len(lines))
    return _numbered("\n".join(lines[lo - 1 : hi]), lo)


def _is_dir(sandbox: Sandbox, path: str) -> bool:
    r = sandbox.exec(f"test -d {shlex.quote(path)}", timeout=10, workdir="/")
    return r.exit_code == 0


def file_editor(sandbox: Sandbox, args: dict) -> str:
    """View, create, str_replace, insert or undo_edit a file; edits are remembered per sandbox so they can be undone."""
    command = _arg(args, "command", str)
    path = _abs_path(args)
    if command == "view":
        if _is_dir(sandbox, path):
            r = sandbox.exec(
                f"find {shlex.quote(path)} -maxdepth 2 -not -path '*/.*' | sort | head -300", timeout=30, workdir="/"
            )
            return clip(f"Files and directories up to 2 levels deep in {path}, hidden items excluded:\n{r.output}")
        text = _read_text(sandbox, path)
        text = text[:-1] if text.endswith("\n") else text  # like cat -n: no phantom last line
        view_range = args.get("view_range")
        if view_range is None:
            return clip(f"Here's the result of running `cat -n` on {path}:\n{_numbered(text)}\n")
        if (
            not isinstance(view_range, list)
            or len(view_range) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in view_range)
        ):
            raise ToolError("argument 'view_range' must be a list of two integers [start, end]")
        lines = text.split("\n")
        start, end = view_range
        end = len(lines) if end == -1 else end
        if not 1 <= start <= len(lines) or end < start or end > len(lines):
            raise ToolError(f"view_range {view_range} is out of bounds: the file has {len(lines)} lines")
        return clip(
            f"Here's the result of running `cat -n` on {path} (lines {start}-{end}):\n"
            f"{_numbered(chr(10).join(lines[start - 1 : end]), start)}\n"
        )
    if command == "create":
        file_text = _arg(args, "file_text", str)
        try:
            sandbox.read_file(path)
            raise ToolError(f"{path} already exists; use str_replace or insert to edit it")
        except (FileNotFoundError, IsADirectoryError) as e:
            if isinstance(e, IsADirectoryError):
                raise ToolError(f"{path} is a directory") from None
        _write(sandbox, path, file_text, None)
        return f"File created successfully at {path}"
    if command == "str_replace":
        old_str = _arg(args, "old_str", str)
        new_str = _arg(args, "new_str", str, required=False, default="")
        if not old_str:
            raise ToolError("argument 'old_str' is empty")
        text = _read_text(sandbox, path)
        count = text.count(old_str)
        if count == 0:
            raise ToolError(f"old_str was not found verbatim in {path}; no change made")
        if count > 1:
            lines = [i + 1 for i, line in enumerate(text.split("\n")) if old_str.split("\n")[0] in line]
            raise ToolError(
                f"old_str occurs {count} times in {path} (lines {lines[:10]}); include more context "
                "so it is unique; no change made"
            )
        new_text = text.replace(old_str, new_str)
        _write(sandbox, path, new_text, text.encode())
        line = text[: text.index(old_str)].count("\n") + 1
        return (
            f"The file {path} has been edited. A snippet of the result:\n"
            f"{_snippet(new_text, line, new_str.count(chr(10)) + 1)}\nReview it; edit again if needed."
        )
    if command == "insert":
        new_str = _arg(args, "new_str", str)
        insert_line = _arg(args, "insert_line", int)
        text = _read_text(sandbox, path)
        lines = text.split("\n")
        if not 0 <= insert_line <= len(lines):
            raise ToolError(f"insert_line {insert_line} is out of range: the file has {len(lines)} lines")
        new_lines = new_str.split("\n")
        new_text = "\n".join(lines[:insert_line] + new_lines + lines[insert_line:])
        _write(sandbox, path, new_text, text.encode())
        return (
            f"The file {path} has been edited. A snippet of the result:\n"
            f"{_snippet(new_text, insert_line + 1, len(new_lines))}\nReview it; edit again if needed."
        )
    if command == "undo_edit":
        history = _HISTORY.get(sandbox, {}).get(path)
        if not history:
            raise ToolError(f"no edit of {path} to undo")
        previous = history.pop()
        if previous is None:
            sandbox.exec(f"rm -f -- {shlex.quote(path)}", timeout=10, workdir="/")
            return f"Undid the creation of {path} (file removed)"
        try:
            sandbox.write_file(path, previous)
        except OSError as e:
            raise ToolError(f"cannot write {path}: {e.strerror or e}") from None
        return f"Last edit of {path} undone. Now:\n{clip(_numbered(previous.decode('utf-8', 'replace')))}"
    raise ToolError(f"unknown file_editor command {command!r}; use one of view, create, str_replace, insert, undo_edit")


# -- search ----------------------------------------------------------------------------------
def search(sandbox: Sandbox, args: dict) -> str:
    """Literal search: matching files with counts in a directory (hidden ones skipped), matching lines in a file."""
    term = _arg(args, "search_term", str)
    if not term:
        raise ToolError("argument 'search_term' is empty")
    path = _arg(args, "path", str, required=False, default=".")
    q, qp = shlex.quote(term), shlex.quote(path)
    script = (
        f"if [ -d {qp} ]; then echo __DIR__; grep -rIcF --exclude-dir='.[!.]*' -- {q} {qp} | grep -v ':0$'; "
        f"elif [ -f {qp} ]; then echo __FILE__; grep -nF -- {q} {qp}; else echo __NOPATH__; fi"
    )
    r = sandbox.exec(script, timeout=60)
    if r.timed_out:
        return f"The search in {path} timed out; narrow it to a smaller directory."
    kind, _, out = r.stdout.partition("\n")
    if kind == "__NOPATH__" or kind not in ("__DIR__", "__FILE__"):
        raise ToolError(f"{path} does not exist")
    if not out.strip():
        return f'No matches found for "{term}" in {path}'
    if kind == "__DIR__":
        rows = [line.rsplit(":", 1) for line in out.strip().split("\n")]
        if len(rows) > MAX_SEARCH_FILES:
            return f'More than {MAX_SEARCH_FILES} files matched "{term}" in {path}. Please narrow your search.'
        total = sum(int(n) for _, n in rows)
        body = "\n".join(f"{f} ({n} matches)" for f, n in rows)
        return clip(f'Found {total} matches for "{term}" in {path}:\n{body}\nEnd of matches for "{term}" in {path}')
    return clip(f'Matches for "{term}" in {path}:\n{out}')


# -- dispatch --------------------------------------------------------------------------------
def submit(sandbox: Sandbox, args: dict) -> str:
    """Finish the task: `run_tool` reports the episode done."""
    return "Submitted."


TOOLS: dict[str, Callable[[Sandbox, dict], str]] = {
    "execute_bash": execute_bash,
    "file_editor": file_editor,
    "search": search,
    "submit": submit,
}


def run_tool(sandbox: Sandbox, name: str, arguments: dict | str | None) -> tuple[str, bool]:
    """Run one parsed tool call; returns (observation, done). Never raises for a bad call."""
    if name not in TOOLS:
        return f"Error: unknown tool {name!r}; available tools: {', '.join(TOOL_NAMES)}", False
    if arguments is None or arguments == "":
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as e:
            return f"Error: the arguments of {name} are not valid JSON ({e.msg} at position {e.pos})", False
    if not isinstance(arguments, dict):
        return f"Error: the arguments of {name} must be a JSON object, got {type(arguments).__name__}", False
    try:
        return TOOLS[name](sandbox, arguments), name == "submit"
    except ToolError as e:
        return f"Error: {e}", False
    except SandboxError:
        raise  # the sandbox died: an infrastructure failure, not the model's doing
    except Exception as e:  # a tool bug must not crash the rollout either
        return f"Error: {name} failed: {type(e).__name__}: {e}", False
