"""Episodes in the run directory and their export to Docent: the fields each episode row carries, the
SDK's own models reading the export of a real run and eval, training-time export, and the upload path
against a local stand-in of the Docent API."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tinker
from aiohttp import web
from docent.data_models import AgentRun

from tinkrl.aio_thread import serve_app_in_thread
from tinkrl.rl.advantages import compute_advantages
from tinkrl.rl.metrics import episode_rows
from tinkrl.rl.types import Trajectory, TrajectoryGroup, Transition
from tinkrl.traces.docent import docent_message, to_agent_run
from tinkrl.traces.runs import episode_from_row, episode_steps, run_episodes, run_info
from tinkrl.tracking import read_jsonl


def _transition(ob: list[int], ac: list[int], done: bool, stop: str = "stop", logs=None) -> Transition:
    return Transition(tinker.ModelInput.from_ints(ob), ac, [-0.5] * len(ac), 0.0, done, stop, logs=logs or {})


def test_episode_rows_carry_advantages_tokens_truncation_and_the_text(renderer) -> None:
    tok = renderer.tokenizer
    prompt, obs = tok.encode("What is 2+2?"), tok.encode(" tool says 4.")
    first, second = tok.encode(" Let me check."), tok.encode(" It is 4.")

    def two_turns(stop: str) -> Trajectory:  # turn 2's prompt extends turn 1's context by `obs`
        return Trajectory(
            [
                _transition(prompt, first, False),
                _transition(prompt + first + obs, second, True, stop, {"answer": "4"}),
            ],
            None,
        )

    group = TrajectoryGroup([two_turns("stop"), two_turns("length")], [0.0, 0.0], [{}, {}], ["math"])
    group.trajectories_G[0].transitions[1].reward = 1.0
    failed = TrajectoryGroup([], [], [], ["math"], [Trajectory([], None, "sandbox_died", "OOM")])
    rows = episode_rows([("m", group), ("m", failed)], 7, tok, trained={id(group)})

    assert [r["episode"] for r in rows[:2]] == [0, 1]
    assert [r["advantage"] for r in rows[:2]] == pytest.approx(list(compute_advantages([1.0, 0.0])))
    assert rows[0]["trained"] and rows[0]["reward"] == 1.0 and rows[0]["turns"] == 2
    assert rows[0]["ac_tokens"] == len(first) + len(second) and rows[0]["ob_tokens"] == len(prompt)
    assert not rows[0]["truncated"] and rows[1]["truncated"]
    assert rows[0]["answer"] == "4" and rows[0]["tags"] == ["math"]
    # the text: the prompt, each action, and only the tokens the environment added in between
    assert [m["role"] for m in rows[0]["transcript"]] == ["prompt", "assistant", "observation", "assistant"]
    assert [m["content"] for m in rows[0]["transcript"]] == [tok.decode(t) for t in (prompt, first, obs, second)]
    assert rows[2] == {
        "step": 7,
        "env": "m",
        "group": 1,
        "reward": None,
        "trained": False,
        "tags": ["math"],
        "failure_mode": "sandbox_died",
        "failure_detail": "OOM",
    }
    assert episode_from_row(rows[2]).id == "s7/m/g1/failed"


def test_a_training_run_writes_every_episode_with_its_numbers(tiny_run) -> None:
    run = tiny_run["run"]
    assert episode_steps(run) == [0, 1, 2]
    episodes = run_episodes(run)
    assert len(episodes) == 3 * 8 and len({e.id for e in episodes}) == 24
    for e in episodes:
        assert e.env == "arithmetic" and e.task and e.ac_tokens > 0 and e.ob_tokens > 0
        assert [m["role"] for m in e.messages] == ["prompt", "assistant"]
        assert "reference" in e.logs
    for step in (0, 1, 2):  # a group's advantages are centred on its mean reward
        for g in (0, 1):
            advs = [e.advantage for e in episodes if e.step == step and e.group == g]
            assert len(advs) == 4 and abs(sum(advs)) < 1e-6


def test_the_docent_export_is_read_back_by_the_sdk(tiny_run, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCENT_")}
    env["HOME"] = str(tmp_path)
    out = tmp_path / "runs.json"
    cmd = [sys.executable, "-m", "tinkrl.cli", "export", "traces", str(tiny_run["run"]), "--docent", "--steps", "1:"]
    done = subprocess.run([*cmd, "--out", str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"wrote 16 Docent agent runs to {out}" in done.stdout
    runs = [AgentRun.model_validate(r) for r in json.loads(out.read_text())]
    info = run_info(tiny_run["run"])
    assert sorted({r.metadata["step"] for r in runs}) == [1, 2]
    for r in runs:
        m = r.metadata
        assert m["run"] == "arith" and m["model"] == info["model"] == "tinkrl/tiny-llama"
        assert m["env"] == "arithmetic" and m["task_id"] and m["reward"] == 0.0 and "advantage" in m
        assert [msg.role for msg in r.transcripts[0].messages] == ["user", "assistant"]
    # an episode names the sampler checkpoint that sampled it when those weights were saved
    saved = {c["batch"]: c["sampler_path"] for c in read_jsonl(tiny_run["run"] / "checkpoints.jsonl")}
    assert all(r.metadata.get("checkpoint") == saved.get(r.metadata["step"]) for r in runs)

    # the training-time export (docent.export_every=2) wrote the same runs, step by step
    written = sorted(p.name for p in (tiny_run["run"] / "docent").iterdir())
    assert written == ["steps_000000-000001.json", "steps_000002-000002.json"]
    early = [AgentRun.model_validate(r) for r in json.loads((tiny_run["run"] / "docent" / written[0]).read_text())]
    assert sorted({r.metadata["step"] for r in early}) == [0, 1] and len(early) == 16


def test_eval_trials_export_with_their_tool_calls(tiny_run, tmp_path) -> None:
    out = tmp_path / "eval.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCENT_")} | {"HOME": str(tmp_path)}
    cmd = [sys.executable, "-m", "tinkrl.cli", "export", "traces", str(tiny_run["eval"]), "--docent", "--out", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    runs = [AgentRun.model_validate(r) for r in json.loads(out.read_text())]
    trials = read_jsonl(tiny_run["eval"] / "results.jsonl")
    assert [(r.metadata["task_id"], r.metadata["episode"]) for r in runs] == [
        (t["task_id"], t["attempt"]) for t in trials
    ]
    assert all(r.metadata["source"] == "eval" and r.metadata["model"] == "tinkrl/tiny-llama" for r in runs)
    assert [m.role for m in runs[0].transcripts[0].messages][:3] == ["system", "user", "assistant"]

    # an OpenAI-style call becomes Docent's ToolCall with parsed arguments; a broken one keeps its text
    call = {"id": "c1", "type": "function", "function": {"name": "execute_bash", "arguments": '{"cmd": "ls"}'}}
    broken = {"id": "c2", "type": "function", "function": {"name": "execute_bash", "arguments": '{"cmd": '}}
    msg = docent_message({"role": "assistant", "content": None, "tool_calls": [call, broken]}, 0)
    assert msg["tool_calls"][0]["arguments"] == {"cmd": "ls"} and "parse_error" not in msg["tool_calls"][0]
    assert msg["tool_calls"][1]["arguments"] == {"raw": '{"cmd": '} and msg["tool_calls"][1]["parse_error"]
    ep = episode_from_row({"step": 0, "env": "t", "group": 0, "episode": 0, "reward": 1.0, "tasks/transcript": []})
    ep.messages = [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "a"}]
    agent_run = to_agent_run(ep, {"name": "r"})
    assert agent_run.transcripts[0].messages[0].tool_calls[0].function == "execute_bash"


class DocentStandIn:
    """The few routes of Docent's REST API the SDK's upload uses, on 127.0.0.1."""

    def __init__(self) -> None:
        self.collections: dict[str, str] = {}
        self.runs: dict[str, list[dict]] = {}
        self.auth: list[str] = []
        self.encodings: list[str | None] = []
        self.app = web.Application()
        r = self.app.router
        r.add_get("/rest/api-keys/test", self.key_test)
        r.add_get("/rest/collections", self.list_collections)
        r.add_post("/rest/create", self.create)
        r.add_post("/rest/{cid}/agent_runs", self.add_runs)
        r.add_post("/rest/{cid}/agent_runs/jobs/batch_status", self.status)

    async def key_test(self, request: web.Request) -> web.Response:
        self.auth.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != "Bearer dk-test":
            return web.json_response({"detail": "invalid API key"}, status=401)
        return web.json_response({"ok": True})

    async def list_collections(self, request: web.Request) -> web.Response:
        return web.json_response([{"id": cid, "name": name} for cid, name in self.collections.items()])

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        cid = f"col-{len(self.collections)}"
        self.collections[cid] = body["name"]
        return web.json_response({"collection_id": cid})

    async def add_runs(self, request: web.Request) -> web.Response:
        self.encodings.append(request.headers.get("Content-Encoding"))
        raw = await request.read()  # aiohttp inflates a gzip body
        self.runs.setdefault(request.match_info["cid"], []).extend(json.loads(raw)["agent_runs"])
        return web.json_response({"job_id": f"job-{len(self.runs)}"}, status=202)

    async def status(self, request: web.Request) -> web.Response:
        ids = (await request.json())["job_ids"]
        return web.json_response({"jobs": [{"job_id": j, "status": "completed"} for j in ids]})


def test_with_credentials_the_export_uploads_to_the_docent_api(tiny_run, tmp_path) -> None:
    stand_in = DocentStandIn()
    with serve_app_in_thread(stand_in.app) as url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DOCENT_")} | {"HOME": str(tmp_path)}
        env |= {"DOCENT_API_KEY": "dk-test", "DOCENT_API_URL": url, "DOCENT_FRONTEND_URL": url}
        cmd = [sys.executable, "-m", "tinkrl.cli", "export", "traces", str(tiny_run["run"]), "--docent"]
        for steps in ("0", "1:"):  # twice into one collection: the second finds it by name
            done = subprocess.run(
                [*cmd, "--collection", "arith-runs", "--steps", steps],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stdout + done.stderr
        assert "uploaded 16 agent runs to Docent collection 'arith-runs' (col-0)" in done.stdout
        assert stand_in.collections == {"col-0": "arith-runs"} and set(stand_in.auth) == {"Bearer dk-test"}
        assert stand_in.encodings == ["gzip", "gzip"]
        received = [AgentRun.model_validate(r) for r in stand_in.runs["col-0"]]
        assert sorted(r.metadata["step"] for r in received) == [0] * 8 + [1] * 8 + [2] * 8
        assert not (tiny_run["run"] / "docent_agent_runs.json").exists()

        # a wrong key: one line naming the failure, exit 1
        env["DOCENT_API_KEY"] = "wrong"
        bad = subprocess.run([*cmd, "--steps", "0"], env=env, capture_output=True, text=True, timeout=120)
        assert bad.returncode == 1 and "Docent upload failed" in bad.stderr and "Traceback" not in bad.stderr


def test_bad_input_gets_one_line(tmp_path) -> None:
    cmd = [sys.executable, "-m", "tinkrl.cli", "export", "traces", str(tmp_path), "--docent"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "neither a run directory" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run([*cmd, "--steps", "x"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "expected A:B" in done.stderr


def test_episode_files_of_every_run_dir_read_back(tmp_path) -> None:
    """A row written before rows had an `episode` index still gets a unique id."""
    folder = tmp_path / "run" / "episodes"
    folder.mkdir(parents=True)
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 0}\n')
    rows = [{"step": 0, "env": "e", "group": 0, "reward": r} for r in (1.0, 0.0)]
    (folder / "step_000000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [e.id for e in run_episodes(tmp_path / "run")] == ["s0/e/g0/e0", "s0/e/g0/e1"]
