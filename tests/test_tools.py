"""Agent tools against a real sandbox, including malformed calls and timeouts."""

import json

import pytest
from helpers.requirements import needs_bwrap

from tinkrl.agents.tools import TOOL_NAMES, TOOL_SCHEMAS, run_tool
from tinkrl.sandbox import get_provider
from tinkrl.sandbox.base import SandboxSpec

pytestmark = needs_bwrap


@pytest.fixture(scope="module")
def sb():
    p = get_provider("bwrap")
    s = p.create(SandboxSpec(workdir="/app"))
    yield s
    p.close()


def test_schemas_are_openai_function_tools():
    assert TOOL_NAMES == ["execute_bash", "file_editor", "search", "submit"]
    for schema in TOOL_SCHEMAS:
        fn = schema["function"]
        assert schema["type"] == "function" and fn["parameters"]["type"] == "object"
        assert set(fn["parameters"]["required"]) <= set(fn["parameters"]["properties"])
        json.dumps(schema)


def test_execute_bash_reports_exit_code_and_keeps_state(sb):
    obs, done = run_tool(sb, "execute_bash", {"command": "mkdir -p /app/w && cd /app/w && echo hi; false"})
    assert obs == "hi\n[exit code: 1]" and not done
    assert run_tool(sb, "execute_bash", '{"command": "pwd"}')[0] == "/app/w\n[exit code: 0]"


def test_execute_bash_timeout_is_an_observation(sb):
    obs, done = run_tool(sb, "execute_bash", {"command": "echo started; sleep 30", "timeout": 1})
    assert "started" in obs and "timed out after 1s" in obs and not done
    assert run_tool(sb, "execute_bash", {"command": "echo again"})[0].startswith("again")


def test_file_editor_create_view_replace_insert_undo(sb):
    path = "/app/pkg/mod.py"
    assert (
        "created"
        in run_tool(sb, "file_editor", {"command": "create", "path": path, "file_text": "def f():\n    return 1\n"})[0]
    )
    assert "already exists" in run_tool(sb, "file_editor", {"command": "create", "path": path, "file_text": ""})[0]
    view = run_tool(sb, "file_editor", {"command": "view", "path": path})[0]
    assert "     1\tdef f():\n     2\t    return 1" in view
    assert (
        "     2\t    return 1"
        in run_tool(sb, "file_editor", {"command": "view", "path": path, "view_range": [2, -1]})[0]
    )
    obs = run_tool(
        sb, "file_editor", {"command": "str_replace", "path": path, "old_str": "return 1", "new_str": "return 2"}
    )[0]
    assert "return 2" in obs and sb.read_file(path) == b"def f():\n    return 2\n"
    run_tool(sb, "file_editor", {"command": "insert", "path": path, "insert_line": 0, "new_str": "import os"})
    assert sb.read_file(path).startswith(b"import os\ndef f")
    run_tool(sb, "file_editor", {"command": "undo_edit", "path": path})
    run_tool(sb, "file_editor", {"command": "undo_edit", "path": path})
    assert sb.read_file(path) == b"def f():\n    return 1\n"
    assert "/app/pkg/mod.py" in run_tool(sb, "file_editor", {"command": "view", "path": "/app/pkg"})[0]


def test_file_editor_refusals(sb):
    sb.write_file("/app/dup.txt", "x\nx\n")
    cases = [
        ({"command": "str_replace", "path": "/app/dup.txt", "old_str": "x", "new_str": "y"}, "occurs 2 times"),
        ({"command": "str_replace", "path": "/app/dup.txt", "old_str": "zzz", "new_str": "y"}, "not found"),
        ({"command": "view", "path": "/app/nope.txt"}, "does not exist"),
        ({"command": "view", "path": "dup.txt"}, "not absolute"),
        ({"command": "insert", "path": "/app/dup.txt", "insert_line": 99, "new_str": "y"}, "out of range"),
        ({"command": "view", "path": "/app/dup.txt", "view_range": [5, 1]}, "out of bounds"),
        ({"command": "undo_edit", "path": "/app/dup.txt"}, "no edit"),
        ({"command": "delete", "path": "/app/dup.txt"}, "unknown file_editor command"),
        ({"command": "create", "path": "/usr/x.txt", "file_text": "x"}, "Read-only"),
    ]
    for args, expected in cases:
        obs, done = run_tool(sb, "file_editor", args)
        assert obs.startswith("Error:") and expected in obs, (args, obs)
    assert sb.read_file("/app/dup.txt") == b"x\nx\n"


def test_search(sb):
    sb.write_file("/app/s/a.py", "needle = 1\nneedle()\n")
    sb.write_file("/app/s/.hidden/b.py", "needle\n")
    obs = run_tool(sb, "search", {"search_term": "needle", "path": "/app/s"})[0]
    assert "Found 2 matches" in obs and "/app/s/a.py (2 matches)" in obs and ".hidden" not in obs
    assert "2:needle()" in run_tool(sb, "search", {"search_term": "needle", "path": "/app/s/a.py"})[0]
    assert "No matches" in run_tool(sb, "search", {"search_term": "haystack", "path": "/app/s"})[0]


def test_malformed_calls_become_error_observations(sb):
    cases = [
        ("execute_bash", "{not json"),
        ("execute_bash", "[1, 2]"),
        ("execute_bash", {}),
        ("execute_bash", {"command": ["ls"]}),
        ("execute_bash", {"command": "ls", "timeout": "soon"}),
        ("file_editor", {"path": "/app"}),
        ("search", {"path": "/app"}),
        ("rm_rf", {"path": "/"}),
        ("file_editor", {"command": "view", "path": "/app/dup.txt", "view_range": "1-2"}),
    ]
    for name, args in cases:
        obs, done = run_tool(sb, name, args)
        assert obs.startswith("Error:") and not done, (name, args, obs)


def test_submit_ends_the_episode(sb):
    assert run_tool(sb, "submit", {}) == ("Submitted.", True)
    assert run_tool(sb, "submit", None)[1] is True
