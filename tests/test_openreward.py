"""The ORS env against a server written with the openreward SDK (tests/helpers/ors_toy_env.py).

Actions are scripted token sequences (what a policy would sample), so these tests pin the
protocol handling: prompt and tools from the server, tool calls sent and rewards reduced,
malformed calls returned to the model, sessions closed, a dead server recorded as InfraFailure.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from helpers.ors import start_toy_server, stop

from tinkrl.config import EnvEntry, SplitConfig
from tinkrl.envs import EnvContext
from tinkrl.envs.ors.client import open_session_count
from tinkrl.envs.ors.config import OpenRewardEnvConfig
from tinkrl.envs.ors.env import OpenRewardEnv, RemoteEnvSpec, build_datasets, reduce_rewards, resolve_client
from tinkrl.errors import ConfigError, InfraFailure


@pytest.fixture(scope="module")
def toy_server():
    proc, url = start_toy_server()
    yield url
    stop(proc)


def action(renderer, text: str) -> list[int]:
    """Tokens as the sampler returns them: the text then the stop token."""
    return renderer.tokenizer.encode(text, add_special_tokens=False) + [renderer.im_end]


def call(name: str, **args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def make_spec(url, renderer, reduction="sum", nonterminal=0.0, **env_fields) -> RemoteEnvSpec:
    cfg = OpenRewardEnvConfig(**env_fields)
    client = resolve_client("adder", "adder", url, cfg)
    return RemoteEnvSpec("adder", client, renderer, cfg, reduction, nonterminal)


def run(coro):
    return asyncio.run(coro)


def test_reduce_rewards():
    assert reduce_rewards([-0.1, 1.0], True, "sum", 5.0) == pytest.approx(0.9)
    assert reduce_rewards([-0.1, 1.0], True, "mean", 5.0) == pytest.approx(0.45)
    assert reduce_rewards([-0.1, 1.0], True, "max", 5.0) == 1.0
    assert reduce_rewards([-0.1, 1.0], True, "min", 5.0) == -0.1
    assert reduce_rewards([-0.1], False, "mean", -1.0) == pytest.approx(-0.55)
    assert reduce_rewards([], False, "sum", -1.0) == -1.0
    assert reduce_rewards([], True, "sum", -1.0) == 0.0


def test_episode_prompt_tools_rewards_and_token_extension(toy_server, renderer):
    async def episode():
        env = OpenRewardEnv(make_spec(toy_server, renderer, "sum"), "train", 3)
        ob, stop_cond = await env.initial_observation()
        text = renderer.tokenizer.decode(ob.to_ints())
        assert "What is 3 + 7?" in text and '"name": "submit"' in text and '"name": "hint"' in text
        assert stop_cond == [renderer.im_end]
        a1 = action(renderer, call("hint"))
        r1 = await env.step(a1)
        assert not r1.episode_done and r1.reward == 0.0
        nxt = r1.next_observation.to_ints()
        assert nxt[: len(ob.to_ints()) + len(a1)] == ob.to_ints() + a1  # prefix extends token for token
        assert "The sum is between 3 and 10." in renderer.tokenizer.decode(nxt[len(ob.to_ints()) + len(a1) :])
        r2 = await env.step(action(renderer, "The answer: " + call("submit", answer="10")))
        assert r2.episode_done
        assert r2.reward == pytest.approx(0.9)  # -0.1 (hint) + 1.0 (correct), summed
        assert r2.metrics["finished"] == 1.0 and r2.metrics["tool_calls"] == 2.0
        record = json.loads(r2.logs["openreward.rollout"])
        assert record["rewards"] == [-0.1, 1.0] and record["split"] == "train" and record["index"] == 3
        assert open_session_count() == 0  # closed as soon as the episode ended
        await env.close()  # idempotent

    run(episode())


def test_malformed_and_unknown_calls_go_back_to_the_model(toy_server, renderer):
    async def episode():
        env = OpenRewardEnv(make_spec(toy_server, renderer, "mean", nonterminal=-1.0, max_turns=3), "test", 0)
        ob, _ = await env.initial_observation()
        assert "What is 100 + 1?" in renderer.tokenizer.decode(ob.to_ints())
        r = await env.step(action(renderer, "<tool_call>{not json}</tool_call>"))
        assert not r.episode_done
        tail = renderer.tokenizer.decode(r.next_observation.to_ints())
        assert "not valid JSON" in tail
        r = await env.step(action(renderer, call("launch_rockets", target="moon")))
        assert "Error (not_found)" in renderer.tokenizer.decode(r.next_observation.to_ints())
        r = await env.step(action(renderer, call("submit", wrong_field="1")))  # 3rd turn = max_turns
        assert r.episode_done
        assert r.metrics["finished"] == 0.0 and r.metrics["tool_errors"] == 3.0
        assert r.reward == -1.0  # no tool reward; the non-terminal reward alone, averaged
        await env.close()
        assert open_session_count() == 0

    run(episode())


def test_no_tool_call_is_nudged_and_turn_limit_is_nonterminal(toy_server, renderer):
    async def episode():
        env = OpenRewardEnv(make_spec(toy_server, renderer, "sum", nonterminal=-0.5, max_turns=2), "train", 0)
        await env.initial_observation()
        r = await env.step(action(renderer, "I think it is 1."))
        assert "No tool call found" in renderer.tokenizer.decode(r.next_observation.to_ints())
        r = await env.step(action(renderer, call("hint")))
        assert r.episode_done and r.reward == pytest.approx(-0.6)  # -0.1 hint + -0.5 non-terminal
        await env.close()

    run(episode())


def test_datasets_over_splits(toy_server, renderer, tmp_path: Path):
    entry = EnvEntry(
        base_url=toy_server,
        num_rollouts=3,
        max_failing_rollouts=1,
        temperature=0.7,
        splits={"train": SplitConfig(shuffle=True, num_samples=5), "test": SplitConfig(shuffle=False, num_samples=3)},
    )
    ctx = EnvContext(
        key="adder",
        entry=entry,
        renderer=renderer,
        model_name="tinkrl/tiny-llama",
        group_size=3,
        groups_per_batch=2,
        max_tokens=32,
        run_dir=tmp_path,
        seed=1,
    )
    ds = build_datasets(OpenRewardEnvConfig(), ctx)
    assert len(ds.train) == 3  # 5 tasks / 2 groups per batch, rounded up
    seen = [(b.split, b.index) for i in range(3) for b in ds.train.get_batch(i)]
    assert {s for s, _ in seen} == {"train"} and len({i for _, i in seen[:5]}) == 5
    first = ds.train.get_batch(0)[0]
    assert first.group_size == 3
    assert first.logging_tags() == ["adder"]
    assert len(run(first.make_envs())) == 3
    assert len(ds.test) == 1  # every eval task in one batch, one rollout each
    assert [(b.split, b.index) for b in ds.test.get_batch(0)] == [("test", 0), ("test", 1), ("test", 2)]
    assert all(b.group_size == 1 for b in ds.test.get_batch(0))


def test_config_errors_are_one_line(toy_server, renderer, tmp_path: Path):
    def ctx(entry):
        return EnvContext(
            key="adder",
            entry=entry,
            renderer=renderer,
            model_name="m",
            group_size=2,
            groups_per_batch=1,
            max_tokens=8,
            run_dir=tmp_path,
            seed=0,
        )

    with pytest.raises(ConfigError, match="validation not offered"):
        build_datasets(OpenRewardEnvConfig(), ctx(EnvEntry(base_url=toy_server, splits={"validation": SplitConfig()})))
    with pytest.raises(ConfigError, match="not served"):
        build_datasets(OpenRewardEnvConfig(variant="nope"), ctx(EnvEntry(base_url=toy_server)))
    with pytest.raises(ConfigError, match="cannot reach the ORS server"):
        build_datasets(OpenRewardEnvConfig(), ctx(EnvEntry(base_url="http://127.0.0.1:9")))


def test_hosted_environment_needs_a_key(monkeypatch, renderer, tmp_path: Path):
    monkeypatch.delenv("OPENREWARD_API_KEY", raising=False)
    ctx = EnvContext(
        key="GeneralReasoning/WhoDunIt",
        entry=EnvEntry(),
        renderer=renderer,
        model_name="m",
        group_size=2,
        groups_per_batch=1,
        max_tokens=8,
        run_dir=tmp_path,
        seed=0,
    )
    with pytest.raises(ConfigError, match="OPENREWARD_API_KEY is not set"):
        build_datasets(OpenRewardEnvConfig(), ctx)


def test_key_is_never_sent_to_a_self_hosted_server(monkeypatch):
    monkeypatch.setenv("OPENREWARD_API_KEY", "secret")
    from tinkrl.envs.ors.client import ORSClient

    assert ORSClient("adder", "http://127.0.0.1:1", None, "secret").api_key is None
    assert ORSClient("Owner/Env", None, None, "secret").api_key == "secret"
    # a self-hosted server's own key (env.server_key_env), and only that, goes to it
    assert ORSClient("adder", "http://127.0.0.1:1", None, "secret", "tml-server").api_key == "tml-server"
    from tinkrl.envs.ors.config import OpenRewardEnvConfig
    from tinkrl.envs.ors.env import resolve_client

    monkeypatch.delenv("MY_ORS_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"server_key_env: \$MY_ORS_KEY is not set"):
        resolve_client("adder", "adder", "http://127.0.0.1:1", OpenRewardEnvConfig(server_key_env="MY_ORS_KEY"))


def test_server_killed_mid_episode_is_an_infra_failure(renderer):
    proc, url = start_toy_server()
    try:

        async def episode():
            env = OpenRewardEnv(make_spec(url, renderer, "sum", call_timeout_s=5.0), "train", 1)
            await env.initial_observation()
            stop(proc)
            with pytest.raises(InfraFailure) as info:
                await env.step(action(renderer, call("submit", answer="4")))
            assert info.value.failure_mode in ("env_unreachable", "env_timeout", "env_session_lost")
            await env.close()
            assert open_session_count() == 0

        run(episode())
    finally:
        stop(proc)


def test_upload_sends_each_finished_episode_to_the_rollout_api(toy_server, renderer, monkeypatch):
    """Uploads go to OpenReward's rollout API (here a local stand-in recording POST /v1/rollouts)."""
    import threading

    from aiohttp import web

    from tinkrl.envs.ors.upload import RolloutUploader
    from tinkrl.rl.types import Trajectory, TrajectoryGroup, Transition

    received: list[dict] = []

    async def rollouts(request):
        received.extend((await request.json())["events"])
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/rollouts", rollouts)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("OPENREWARD_API_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OPENREWARD_API_KEY", "test-key")

    async def episode():
        env = OpenRewardEnv(make_spec(toy_server, renderer), "train", 2)
        ob, _ = await env.initial_observation()
        a = action(renderer, "Let me submit. " + call("submit", answer="7"))
        r = await env.step(a)
        return Trajectory([Transition(ob, a, [0.0] * len(a), r.reward, True, "stop", None, r.metrics, r.logs)])

    try:
        traj = run(episode())
        group = TrajectoryGroup([traj], [0.0], [{}], ["adder"])
        uploader = RolloutUploader("ors-test", "tinkrl/tiny-llama")
        uploader.submit([group], step=4)
        uploader.close()
        final = uploader.metrics()
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
    assert final == {"openreward/uploaded": 1.0, "openreward/upload_errors": 0.0}
    started = [e for e in received if e.get("rolloutName")] or [e for e in received if "runName" in e]
    assert started and started[0].get("runName") == "ors-test"
    assert "adder-train-2-step4-r0" in json.dumps(started[0])
    kinds = [e.get("type") for e in received if e.get("type")]
    assert kinds[:4] == ["user_message", "assistant_message", "tool_call", "tool_result"], kinds
    last = [e for e in received if e.get("type") == "tool_result"][-1]
    assert last["content"] == "Correct!" and last["reward"] == 1.0 and last["isFinished"] is True


def test_sessions_left_open_by_an_interrupted_run_are_deleted_at_exit(toy_server):
    """Ctrl-C can stop a run before Env.close(): the exit hook still deletes the server's sessions."""
    import urllib.error
    import urllib.request

    from tinkrl.envs.ors.client import ORSSession, _delete_leftover_sessions

    client = resolve_client("adder", "adder", toy_server, OpenRewardEnvConfig())

    async def open_and_abandon():
        s = ORSSession(client, "train", 0, {}, 0, 30)
        await s.open()
        await s._api.aclose()
        return s._session.sid

    sid = run(open_and_abandon())
    assert open_session_count() == 1

    def ping() -> int:
        req = urllib.request.Request(
            toy_server + "/ping",
            data=b"{}",
            method="POST",
            headers={"X-Session-ID": sid, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    assert ping() == 200  # the server still holds it
    _delete_leftover_sessions()  # what atexit runs
    assert open_session_count() == 0 and ping() == 404
