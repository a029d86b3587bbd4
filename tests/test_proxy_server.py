"""The OpenAI-compatible server, driven by the official openai client, over the embedded engine."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from test_proxy_helpers import LIST_FILES, RUN_TOOL, tool_policy

from tinkrl.local import ServiceClient
from tinkrl.local.models import TINY_MODEL
from tinkrl.proxy.server import ProxyServer, serve_in_thread

KEY = "sk-proxy-test"


@pytest.fixture(scope="module")
def env():
    service = ServiceClient()
    tc, policy = tool_policy(service)
    server = ProxyServer(policy, model_name=TINY_MODEL, api_key=KEY, service_client=service)
    with serve_in_thread(server) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=300)
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=300)
        yield {
            "server": server,
            "url": url,
            "client": client,
            "http": http,
            "tc": tc,
            "policy": policy,
            "service": service,
        }
        http.close()


def chat(env, **kwargs):
    kwargs.setdefault("model", TINY_MODEL)
    kwargs.setdefault("messages", [{"role": "user", "content": "Say hello."}])
    return env["client"].chat.completions.create(**kwargs)


def test_plain_chat_and_models(env):
    r = chat(env, max_tokens=8, seed=1)
    assert r.object == "chat.completion" and len(r.choices) == 1
    c = r.choices[0]
    assert c.message.role == "assistant" and isinstance(c.message.content, str)
    assert c.finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 5
    assert TINY_MODEL in [m.id for m in env["client"].models.list()]
    assert env["http"].get("/health").json()["status"] == "ok"

    long = chat(env, max_tokens=24, seed=1)
    text = long.choices[0].message.content
    cut = chat(env, max_tokens=24, seed=1, stop=[text[3:5]]).choices[0]
    assert cut.finish_reason == "stop" and cut.message.content == text[: text.find(text[3:5])]


def test_streaming_matches_the_same_seeded_request(env):
    args = dict(max_tokens=12, seed=7, temperature=1.0)
    whole = chat(env, **args)
    parts, usage, finish = [], None, None
    for chunk in chat(env, stream=True, stream_options={"include_usage": True}, **args):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            parts.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    assert "".join(parts) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_n_choices(env):
    r = chat(env, n=4, max_tokens=6, seed=3, temperature=1.0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert len({c.message.content for c in r.choices}) > 1  # independent samples
    assert r.usage.completion_tokens <= 4 * 6


def test_logprobs_match_the_captured_tokens(env):
    r = chat(env, max_tokens=6, seed=5, logprobs=True, top_logprobs=3, extra_headers={"X-Rollout-Id": "lp"})
    content = r.choices[0].logprobs.content
    assert len(content) >= 1
    for entry in content:
        assert entry.logprob <= 0.0 and len(entry.top_logprobs) == 3
        alts = [a.logprob for a in entry.top_logprobs]
        assert alts == sorted(alts, reverse=True)
        assert alts[0] >= entry.logprob - 1e-3  # the best alternative is at least as likely as the draw
    captured = env["http"].delete("/v1/rollouts/lp").json()["calls"]
    assert len(captured) == 1
    sample = captured[0]["samples"][0]
    assert [round(e.logprob, 4) for e in content] == [round(x, 4) for x in sample["logprobs"][: len(content)]]


def test_tool_call_round_trip_merges_into_one_sequence(env):
    client = openai.OpenAI(base_url=env["url"] + "/rollouts/tools/v1", api_key=KEY, max_retries=0, timeout=300)
    first = client.chat.completions.create(
        model=TINY_MODEL, messages=LIST_FILES, tools=[RUN_TOOL], temperature=0, max_tokens=64
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name == "run" and json.loads(call.function.arguments) == {"cmd": "ls"}

    back = choice.message.model_dump(exclude_none=True)
    back["tool_calls"][0]["function"]["arguments"] = '{"cmd":"ls"}'  # the client re-serialises the JSON
    history = LIST_FILES + [back, {"role": "tool", "tool_call_id": call.id, "content": "a.txt\nb.txt"}]
    client.chat.completions.create(model=TINY_MODEL, messages=history, tools=[RUN_TOOL], max_tokens=4, seed=0)

    got = env["http"].delete("/v1/rollouts/tools").json()
    c1, c2 = got["calls"]
    assert (
        c2["prompt_tokens"][: len(c1["prompt_tokens"]) + len(c1["samples"][0]["tokens"])]
        == c1["prompt_tokens"] + c1["samples"][0]["tokens"]
    )
    assert got["merge"]["merge_rate"] == 1.0 and got["merge"]["datums"] == 1 and got["merge"]["splice_rate"] == 1.0

    # The same call streamed: the tool call arrives as a delta.
    calls = {}
    for chunk in client.chat.completions.create(
        model=TINY_MODEL, messages=LIST_FILES, tools=[RUN_TOOL], temperature=0, max_tokens=64, stream=True
    ):
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or []:
                calls.setdefault(d.index, [d.function.name, ""])[1] += d.function.arguments or ""
    assert calls == {0: ["run", call.function.arguments]}


def test_tool_choice_none_and_forced(env):
    r = chat(env, messages=LIST_FILES, tools=[RUN_TOOL], tool_choice="none", temperature=0, max_tokens=64)
    assert r.choices[0].message.tool_calls is None and "<tool_call>" in r.choices[0].message.content
    chat(
        env,
        messages=[{"role": "user", "content": "hello"}],
        tools=[RUN_TOOL],
        max_tokens=8,
        seed=0,
        tool_choice={"type": "function", "function": {"name": "run"}},
        metadata={"rollout_id": "forced"},
    )
    prompt = env["http"].delete("/v1/rollouts/forced").json()["calls"][0]["prompt_tokens"]
    forced = env["server"].tokenizer.encode('<tool_call>\n{"name": "run", "arguments": ', add_special_tokens=False)
    assert prompt[-len(forced) :] == forced


def test_completions_endpoint(env):
    r = env["client"].completions.create(model=TINY_MODEL, prompt="Once upon a time", max_tokens=5, logprobs=2, seed=0)
    c = r.choices[0]
    assert isinstance(c.text, str) and c.finish_reason in ("stop", "length")
    assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) == r.usage.completion_tokens
    assert all(lp <= 0 for lp in c.logprobs.token_logprobs)
    assert all(1 <= len(alts) <= 2 for alts in c.logprobs.top_logprobs)
    ids = env["server"].tokenizer.encode("Once upon a time", add_special_tokens=False)
    r2 = env["client"].completions.create(model=TINY_MODEL, prompt=ids, max_tokens=5, seed=0)
    assert r2.choices[0].text == c.text  # token ids and text give the same prompt


def test_errors_follow_openai_shape(env):
    bad_key = openai.OpenAI(base_url=env["url"] + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad_key.chat.completions.create(model=TINY_MODEL, messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"

    with pytest.raises(openai.NotFoundError) as e:
        chat(env, model="gpt-4o")
    assert e.value.code == "model_not_found" and "gpt-4o" in e.value.message

    with pytest.raises(openai.BadRequestError) as e:
        chat(env, temperature=5)
    assert e.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        chat(env, messages=[{"role": "wizard", "content": "x"}])
    assert "role" in e.value.message

    ctx = env["server"].max_context
    with pytest.raises(openai.BadRequestError) as e:
        chat(env, messages=[{"role": "user", "content": "hello " * (ctx + 10)}], max_tokens=4)
    assert e.value.code == "context_length_exceeded" and f"maximum context length is {ctx} tokens" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        chat(env, max_tokens=ctx)
    assert e.value.code == "context_length_exceeded"

    raw = env["http"].post("/v1/chat/completions", content=b"{not json")
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"
    missing = env["http"].get("/v1/nothing-here")
    assert missing.status_code == 404 and "error" in missing.json()


def test_weight_swap_keeps_the_url(env):
    server, http = env["server"], env["http"]
    req = dict(messages=LIST_FILES, tools=[RUN_TOOL], temperature=0, max_tokens=64)
    before = server.policy.version
    base = env["service"].create_sampling_client(base_model=TINY_MODEL)
    try:
        assert server.set_sampling_client(base, "base") == before + 1
        r = chat(env, extra_headers={"X-Rollout-Id": "swap"}, **req)
        assert r.choices[0].finish_reason != "tool_calls"  # the untrained weights make no tool call
        assert http.get("/health").json()["policy_version"] == before + 1
        assert http.delete("/v1/rollouts/swap").json()["calls"][0]["policy_version"] == before + 1

        path = env["tc"].save_weights_for_sampler("swap-test").result().path
        swapped = http.post("/v1/admin/weights", json={"model_path": path}).json()
        assert swapped["policy_version"] == before + 2
        assert chat(env, **req).choices[0].finish_reason == "tool_calls"
        assert http.post("/v1/admin/weights", json={"model_path": "/no/such/ckpt"}).status_code == 400
    finally:
        server.set_sampling_client(env["policy"])


def test_cli_refuses_a_missing_checkpoint(capsys):
    from tinkrl.commands.serve_openai import cli_main

    assert cli_main(["--checkpoint", "/no/such/checkpoint"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_tinker_backend_serves_the_same_api():
    """`--backend tinker`: the proxy over the official SDK, talking to `tinkrl serve tinker`."""
    from tinkrl.backends import make_service_client
    from tinkrl.config import BackendConfig
    from tinkrl.tinker_server.app import serve_in_thread as serve_tinker

    with serve_tinker(ServiceClient()) as tinker_url:
        config = BackendConfig(backend="tinker", base_url=tinker_url)
        with make_service_client(config, api_key="tml-local") as service:
            sampler = service.create_sampling_client(base_model=TINY_MODEL)
            server = ProxyServer(sampler, model_name=TINY_MODEL, service_client=service)
            with serve_in_thread(server) as url:
                client = openai.OpenAI(base_url=url + "/rollouts/sdk/v1", api_key="EMPTY", max_retries=0, timeout=300)
                r = client.chat.completions.create(
                    model=TINY_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, logprobs=True, seed=2
                )
                calls = server.capture.pop("sdk")
    assert len(calls) == 1 and len(calls[0].samples[0].tokens) == r.usage.completion_tokens
    assert [round(e.logprob, 4) for e in r.choices[0].logprobs.content] == [
        round(x, 4) for x in calls[0].samples[0].logprobs[: len(r.choices[0].logprobs.content)]
    ]


def test_cli_ends_the_tinker_session_when_no_server_comes_of_it(monkeypatch, capsys):
    """A checkpoint the Tinker service does not have: exit 2 with one line, the session already ended (errored)."""
    from helpers.tinker_sessions import finish_reasons

    from tinkrl.commands.serve_openai import cli_main
    from tinkrl.tinker_server.app import TinkerServer
    from tinkrl.tinker_server.app import serve_in_thread as serve_tinker

    tinker_server = TinkerServer(ServiceClient())
    with serve_tinker(server=tinker_server) as tinker_url:
        monkeypatch.setenv("TINKER_API_KEY", "tml-local")
        missing = "tinker://no-such-run/sampler_weights/final"
        assert cli_main(["--backend", "tinker", "--base-url", tinker_url, "--checkpoint", missing]) == 2
    assert capsys.readouterr().err.startswith("tinkrl serve openai: ")
    assert finish_reasons(tinker_server) == ["errored"]


def test_64_concurrent_requests_all_succeed_and_capture_apart(env):
    import asyncio

    async def run():
        client = openai.AsyncOpenAI(base_url=env["url"] + "/v1", api_key=KEY, max_retries=0, timeout=600)
        try:
            return await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model=TINY_MODEL,
                        messages=[{"role": "user", "content": f"request {i}"}],
                        max_tokens=4,
                        seed=i,
                        extra_headers={"X-Rollout-Id": f"load-{i % 8}"},
                    )
                    for i in range(64)
                )
            )
        finally:
            await client.close()

    replies = asyncio.run(run())
    assert len(replies) == 64 and all(r.choices[0].message.content is not None for r in replies)
    per_rollout = [env["server"].capture.pop(f"load-{k}") for k in range(8)]
    assert [len(calls) for calls in per_rollout] == [8] * 8
    ids = {c.call_id for calls in per_rollout for c in calls}
    assert ids == {r.id for r in replies}
