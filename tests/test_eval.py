"""`tinkrl eval` end to end: the embedded engine (tiny random model) and an OpenAI-compatible endpoint.

The endpoint is a scripted test double of a remote model on 127.0.0.1: it answers with
structured `tool_calls`, with tool calls left in the text (the renderer's parser takes
over), or with HTTP 500 (an infrastructure failure, recorded, and the run goes on).
"""

from __future__ import annotations

import json
import logging
import shlex
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers.http_json import send_json
from helpers.ors import free_port
from helpers.requirements import needs_bwrap

from tinkrl.agents.evaluation import pass_at_k
from tinkrl.commands.eval import cli_main

TASKS = Path(__file__).resolve().parents[1] / "tasks"


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 3, 2) == 1.0 and pass_at_k(1, 1, 1) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(1, 0, 2)


def test_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["--model", "m", "--base-url", "http://127.0.0.1:1/v1"])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        cli_main(["--n", "0"])
    assert "--n must be at least 1" in capsys.readouterr().err
    assert cli_main(["--tasks", str(TASKS), "--task-id", "no-such-task", "--model", "tinkrl/tiny-llama"]) == 2
    assert "no task matches 'no-such-task'" in capsys.readouterr().err


@needs_bwrap
def test_eval_with_the_embedded_engine_writes_results_and_table(tmp_path, capsys):
    rc = cli_main(
        [
            "--tasks",
            str(TASKS),
            "--task-id",
            "hello-file",
            "--task-id",
            "calc__calc-1",
            "--model",
            "tinkrl/tiny-llama",
            "--n",
            "2",
            "--max-turns",
            "2",
            "--max-tokens",
            "8",
            "--output-path",
            str(tmp_path),
            "--run-id",
            "tiny",
            "--n-concurrent",
            "4",
        ]
    )
    assert rc == 0
    out = tmp_path / "tiny"
    trials = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(t["task_id"], t["attempt"]) for t in trials] == [
        ("hello-file", 1),
        ("hello-file", 2),
        ("calc__calc-1", 1),
        ("calc__calc-1", 2),
    ]
    for t in trials:
        # random weights never solve a task: every trial runs its 2 turns and is graded 0
        assert t["failure_mode"] is None and t["reward"] == 0.0 and t["turns"] == 2
        assert t["end_reason"] == "max_turns" and t["sampled_tokens"] <= 16
        assert [m["role"] for m in t["transcript"][:3]] == ["system", "user", "assistant"]
    summary = json.loads((out / "results.json").read_text())
    assert summary["overall"]["pass@1"] == 0.0 and summary["overall"]["pass@2"] == 0.0
    assert summary["model"] == "tinkrl/tiny-llama" and len(summary["tasks"]) == 2
    table = (out / "results.md").read_text()
    assert "| hello-file | harbor | 2 | 0 | 0 | 0.000 |" in table and "pass@2" in table
    assert table.strip() in capsys.readouterr().out
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert preds == [
        {
            "instance_id": "calc__calc-1",
            "model_name_or_path": "tinkrl/tiny-llama",
            "model_patch": preds[0]["model_patch"],
        }
    ]
    assert (out / "predictions.attempt2.jsonl").is_file() and not (out / "results.partial.jsonl").exists()


@needs_bwrap
def test_eval_through_the_tinker_backend_matches_the_local_engine(tmp_path, monkeypatch):
    """`--backend tinker`: the same episodes through the official SDK and `tinkrl serve tinker`."""
    from helpers.tinker_sessions import finish_reasons

    from tinkrl.local import ServiceClient
    from tinkrl.tinker_server.app import TinkerServer, serve_in_thread

    def run(run_id: str, *backend: str) -> list[dict]:
        argv = ["--tasks", str(TASKS), "--task-id", "hello-file", "--model", "tinkrl/tiny-llama", "--n", "1"]
        argv += ["--max-turns", "2", "--max-tokens", "8", "--temperature", "0", "--output-path", str(tmp_path)]
        assert cli_main([*argv, "--run-id", run_id, *backend]) == 0
        return [json.loads(line) for line in (tmp_path / run_id / "results.jsonl").read_text().splitlines()]

    local = run("local")
    server = TinkerServer(ServiceClient())
    with serve_in_thread(server=server) as url:
        monkeypatch.setenv("TINKER_BASE_URL", url)
        monkeypatch.setenv("TINKER_API_KEY", "tml-local")
        hosted = run("tinker", "--backend", "tinker")
    assert finish_reasons(server) == ["success"]  # the evaluation's session, finished when it was
    assert len(local) == len(hosted) == 1 and hosted[0]["failure_mode"] is None
    assert hosted[0]["turns"] == 2 and hosted[0]["sampled_tokens"] == local[0]["sampled_tokens"]
    assert hosted[0]["transcript"] == local[0]["transcript"]  # greedy: the same tokens either way


# ---------------------------------------------------------------------------------------------
# A scripted remote model behind an OpenAI-compatible endpoint

HELLO = "printf 'Hello, world!\\n' > /app/hello.txt"
CALC_FIX = (
    "python3 - <<'EOF'\np = 'calc/ops.py'\ns = open(p).read()\n"
    "s = s.replace('    return a / b', '    if b == 0:\\n        raise ValueError(\"division by zero\")\\n"
    "    return a / b')\nopen(p, 'w').write(s)\nEOF"
)


def _completion(content, calls=(), finish="tool_calls"):
    tool_calls = [
        {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for cid, name, args in calls
    ]
    msg = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted-model",
        "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
    }


class ScriptedModel(BaseHTTPRequestHandler):
    requests: list[dict] = []

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: dict) -> None:
        send_json(self, status, body)

    def do_GET(self):
        if self.path.endswith("/models"):
            self._send(
                200,
                {
                    "object": "list",
                    "data": [{"id": "scripted-model", "object": "model", "created": 0, "owned_by": "tests"}],
                },
            )
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(req)
        instruction = req["messages"][1]["content"]
        turn = sum(m["role"] == "assistant" for m in req["messages"])
        if "hello.txt" in instruction:
            if turn == 0:
                return self._send(200, _completion(None, [("call_hello_1", "execute_bash", {"command": HELLO})]))
            # a server without a tool parser: the call stays in the text
            return self._send(
                200, _completion('Done.\n<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>', finish="stop")
            )
        if "calc.divide" in instruction:
            return self._send(
                200, _completion("Fixing it.", [("c1", "execute_bash", {"command": CALC_FIX}), ("c2", "submit", {})])
            )
        self._send(500, {"error": {"message": "the model server crashed"}})


@pytest.fixture
def endpoint():
    ScriptedModel.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedModel)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@needs_bwrap
def test_eval_against_an_openai_compatible_endpoint(endpoint, tmp_path, capsys):
    rc = cli_main(
        [
            "--dataset-path",
            str(TASKS),
            "-t",
            "hello-file",
            "-t",
            "calc__calc-1",
            "-t",
            "fix-permissions",
            "--base-url",
            endpoint,
            "--api-key",
            "sk-test",
            "--n",
            "1",
            "--max-turns",
            "3",
            "--output-path",
            str(tmp_path),
            "--run-id",
            "remote",
            "--temperature",
            "0",
        ]
    )
    assert rc == 0
    out = tmp_path / "remote"
    trials = {t["task_id"]: t for t in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    hello, calc, perms = trials["hello-file"], trials["calc__calc-1"], trials["fix-permissions"]
    assert hello["reward"] == 1.0 and hello["turns"] == 2 and hello["end_reason"] == "submit"
    assert hello["tool_calls"] == 2  # one structured, one parsed from the text
    assert calc["reward"] == 1.0 and calc["turns"] == 1
    assert perms["failure_mode"] == "model_error" and perms["reward"] is None and "crashed" in perms["failure_detail"]

    reqs = [r for r in ScriptedModel.requests if "hello.txt" in r["messages"][1]["content"]]
    assert [t["function"]["name"] for t in reqs[0]["tools"]] == ["execute_bash", "file_editor", "search", "submit"]
    assert reqs[0]["model"] == "scripted-model" and reqs[0]["temperature"] == 0
    second = reqs[1]["messages"]
    assert second[2]["tool_calls"][0]["id"] == "call_hello_1"
    assert second[3] == {"role": "tool", "tool_call_id": "call_hello_1", "content": "[exit code: 0]"}

    summary = json.loads((out / "results.json").read_text())
    assert summary["overall"]["infra_failures"] == 1 and summary["overall"]["resolved"] == 2
    # each task's verdict: solved, or error when no trial could run (neither solved nor unsolved)
    assert summary["resolved_ids"] == ["hello-file", "calc__calc-1"] and summary["unresolved_ids"] == []
    assert verdicts(capsys.readouterr().out) == {
        "hello-file": "solved",
        "calc__calc-1": "solved",
        "fix-permissions": "error",
        "all (3 tasks)": "2/3",
    }
    assert summary["overall"]["pass@1"] == 1.0  # infra failures are left out, not scored 0
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 1 and preds[0]["instance_id"] == "calc__calc-1"
    assert preds[0]["model_name_or_path"] == "scripted-model"
    assert '+        raise ValueError("division by zero")' in preds[0]["model_patch"]


# ---------------------------------------------------------------------------------------------
# seed 001's `minitb run` (and `tb run`) command lines


def verdicts(text: str) -> dict[str, str]:
    """{task: its solved column} from the results table in `text` (printed, or results.md)."""
    rows = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("| ")][1:]
    return {cells[0].strip(): cells[-1].strip() for cells in rows}


@needs_bwrap
def test_seed_minitb_run_command_as_written(tmp_path, isolated_home, capsys, caplog, monkeypatch):
    """Seed 001's `minitb run` command, with `minitb` replaced by `tinkrl eval` and its checkpoint, model,
    task dir and task id by a tiny checkpoint, its base model and shipped tasks (the task id twice)."""
    from tinkrl.cli import main as tinkrl
    from tinkrl.local import ServiceClient

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    tc = ServiceClient().create_lora_training_client("tinkrl/tiny-llama", rank=4)
    checkpoint = tc.save_weights_for_sampler("000061").result().path
    assert checkpoint.startswith("tinker://") and checkpoint.endswith("/sampler_weights/000061")
    command = f"""tinkrl eval run
      --agent terminus-tinker
      --agent-kwarg checkpoint_path={checkpoint}
      --agent-kwarg model_name=tinkrl/tiny-llama
      --dataset-path {TASKS}
      --task-id hello-file --task-id tb-hello
      --n-concurrent 1
      --output-path {tmp_path / "tbench"}
      --log-level debug"""
    rc = tinkrl(shlex.split(command)[1:])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert f"backend local ({checkpoint} is on this machine)" in err
    [run_dir] = (tmp_path / "tbench").iterdir()
    summary = json.loads((run_dir / "results.json").read_text())
    assert summary["model"] == checkpoint and summary["base_model"] == "tinkrl/tiny-llama"
    # random weights solve nothing: each task is reported, printed and written, as not solved
    assert summary["unresolved_ids"] == ["hello-file", "tb-hello"] and summary["resolved_ids"] == []
    assert [(r["task"], r["solved"]) for r in summary["tasks"]] == [("hello-file", False), ("tb-hello", False)]
    expected = {"hello-file": "unsolved", "tb-hello": "unsolved", "all (2 tasks)": "0/2"}
    assert verdicts(out) == verdicts((run_dir / "results.md").read_text()) == expected
    trials = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [t["task_id"] for t in trials] == ["hello-file", "tb-hello"] and all(
        t["failure_mode"] is None for t in trials
    )
    assert any(r.levelno == logging.DEBUG for r in caplog.records)  # --log-level debug


def test_tb_run_flags_check_their_values(capsys):
    for argv, message in [
        (["run", "--agent", "oracle"], "argument --agent: invalid choice: 'oracle'"),
        (["--agent-kwarg", "temperature"], "--agent-kwarg 'temperature': expected KEY=VALUE"),
        (
            ["--agent-kwarg", "beam=4"],
            "--agent-kwarg beam: the terminus-tinker agent takes checkpoint_path, model_name",
        ),
        (["--agent-kwarg", "max_turns=many"], "--agent-kwarg max_turns=many: expected a int"),
        (["--checkpoint", "c", "--agent-kwarg", "checkpoint_path=d"], "--agent-kwarg checkpoint_path and --checkpoint"),
        (["--base-url", "http://x/v1", "--agent-kwarg", "model_name=m"], "--base-url evaluates a served model"),
        (["--log-level", "loud"], "argument --log-level: invalid choice: 'loud'"),
    ]:
        with pytest.raises(SystemExit) as e:
            cli_main(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err, argv


def test_a_registry_dataset_offline_is_one_line(tmp_path, monkeypatch, capsys):
    """`--dataset NAME==VERSION` (tb run's spelling) with no cached copy and no registry: one line."""
    monkeypatch.setenv("TINKRL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TINKRL_TB_REGISTRY", f"http://127.0.0.1:{free_port()}/registry.json")
    argv = [
        "run",
        "--dataset",
        "terminal-bench-core==0.1.1",
        "--task-id",
        "hello-world",
        "--model",
        "tinkrl/tiny-llama",
    ]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "terminal-bench-core" in err[0], err


def test_backend_auto_samples_a_remote_checkpoint_on_the_tinker_service(isolated_home, monkeypatch):
    """The seed's `tb run` names a checkpoint on the Tinker service: with TINKER_API_KEY set it is sampled
    there; a checkpoint on this machine, or no key, stays on the embedded engine."""
    from tinkrl.commands.eval import _apply_agent_kwargs, _backend, build_parser

    def backend(*argv: str) -> str:
        parser = build_parser()
        args = parser.parse_args(list(argv))
        _apply_agent_kwargs(args, parser)
        return _backend(args)[0]

    remote = "checkpoint_path=tinker://a4782131-a6c1-41bb-800d-af2f9b5a3db1/sampler_weights/000061"
    seed = ["--agent", "terminus-tinker", "--agent-kwarg", remote, "--agent-kwarg", "model_name=Qwen/Qwen3-8B"]
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    assert backend(*seed) == "local"
    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    assert backend(*seed) == "tinker"
    (isolated_home / "checkpoints" / "a4782131-a6c1-41bb-800d-af2f9b5a3db1" / "sampler_weights" / "000061").mkdir(
        parents=True
    )
    assert backend(*seed) == "local"
    assert backend(*seed, "--backend", "tinker") == "tinker"
