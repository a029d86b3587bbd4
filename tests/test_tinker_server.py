"""`tinkrl serve tinker` driven by the unmodified official SDK (tinker 0.38.0).

Every result that comes back over HTTP is compared with the same call made on the
embedded engine in-process, so the server is checked to add transport and nothing else.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tinker
from aiohttp import web
from tinker import types

from tinkrl.local import ServiceClient as LocalServiceClient
from tinkrl.local.models import TINY_MODEL
from tinkrl.tinker_server.app import TinkerServer, serve_in_thread

os.environ.setdefault("TINKER_TELEMETRY", "0")

KEY = "tml-local"
TOL = 1e-4


@pytest.fixture(scope="module")
def engine():
    return LocalServiceClient()


def _rl_datum(tokens: list[int], n_prompt: int, seed: int) -> types.Datum:
    rng = np.random.default_rng(seed)
    n = len(tokens) - 1
    sampled = n - (n_prompt - 1)
    logprobs = [0.0] * (n_prompt - 1) + list(rng.uniform(-3.0, -0.5, sampled))
    advantages = [0.0] * (n_prompt - 1) + [float(rng.choice([-1.0, 1.0]))] * sampled
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "weights": [0.0] * (n_prompt - 1) + [1.0] * sampled,
            "logprobs": logprobs,
            "advantages": advantages,
            "sequence_ratio_mask": [0.0] * (n_prompt - 1) + [1.0] * sampled,
        },
    )


DATA = [_rl_datum([1] + [100 + (7 * i + 3 * k) % 500 for k in range(11)], 5, i) for i in range(3)]
LOSSES: list[tuple[str, dict | None]] = [
    ("cross_entropy", None),
    ("importance_sampling", None),
    ("ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    ("cispo", None),
    ("dro", {"beta": 0.1}),
    ("gspo", None),
]


def _inputs_for(loss: str) -> list[types.Datum]:
    keep = {"target_tokens", "weights"} if loss == "cross_entropy" else {"target_tokens", "logprobs", "advantages"}
    if loss == "gspo":
        keep.add("sequence_ratio_mask")
    return [
        types.Datum(model_input=d.model_input, loss_fn_inputs={k: v for k, v in d.loss_fn_inputs.items() if k in keep})
        for d in DATA
    ]


def _assert_same_output(a: types.ForwardBackwardOutput, b: types.ForwardBackwardOutput) -> None:
    assert a.metrics["loss:sum"] == pytest.approx(b.metrics["loss:sum"], abs=TOL)
    for out_a, out_b in zip(a.loss_fn_outputs, b.loss_fn_outputs, strict=True):
        np.testing.assert_allclose(out_a["logprobs"].to_numpy(), out_b["logprobs"].to_numpy(), atol=TOL)


def test_official_sdk_full_flow_matches_the_engine_in_process(engine):
    server = TinkerServer(engine)
    with serve_in_thread(server=server) as url:
        local_tc = engine.create_lora_training_client(TINY_MODEL, rank=8, seed=0).result()
        with tinker.ServiceClient(base_url=url, api_key=KEY) as sc:
            tc = sc.create_lora_training_client(TINY_MODEL, rank=8, seed=0).result()
            info = tc.get_info()
            assert info.model_data.model_name == TINY_MODEL and info.lora_rank == 8
            # the SDK's own get_tokenizer() loads offline from the path the server names
            assert tc.get_tokenizer().encode("hello world") == local_tc.get_tokenizer().encode("hello world")

            # forward_backward with each loss, accumulating as on the engine itself
            for loss, config in LOSSES:
                remote = tc.forward_backward(_inputs_for(loss), loss, config)
                local = local_tc.forward_backward(_inputs_for(loss), loss, config)
                _assert_same_output(remote.result(), local.result())
            adam = types.AdamParams(learning_rate=1e-2)
            tc.optim_step(adam).result()
            local_tc.optim_step(adam).result()
            probe = _inputs_for("cross_entropy")
            _assert_same_output(
                tc.forward(probe, "cross_entropy").result(), local_tc.forward(probe, "cross_entropy").result()
            )

            # save_state, then a new client from it with the optimizer: one more step agrees
            state_path = tc.save_state("step1").result().path
            assert state_path.startswith("tinker://")
            resumed = sc.create_training_client_from_state_with_optimizer(state_path).result()
            _assert_same_output(
                resumed.forward(probe, "cross_entropy").result(), tc.forward(probe, "cross_entropy").result()
            )
            for client in (resumed, tc):
                client.forward_backward(probe, "cross_entropy")
                client.optim_step(adam)
            _assert_same_output(
                resumed.forward(probe, "cross_entropy").result(), tc.forward(probe, "cross_entropy").result()
            )

            # sampler weights: a path another client can sample from, and compute_logprobs
            sampler_path = tc.save_weights_for_sampler("sampler1").result().path
            assert "sampler_weights" in sampler_path
            sampler = sc.create_sampling_client(model_path=sampler_path).result()
            local_sampler = engine.create_sampling_client(model_path=sampler_path).result()
            prompt = types.ModelInput.from_ints([1, 101, 202, 303, 404])
            params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=123, stop=[])
            got = sampler.sample(prompt, 3, params).result()
            want = local_sampler.sample(prompt, 3, params).result()
            assert [s.tokens for s in got.sequences] == [s.tokens for s in want.sequences]
            assert len({s.sequence_id for s in got.sequences}) == 3
            for s_got, s_want in zip(got.sequences, want.sequences):
                np.testing.assert_allclose(s_got.logprobs, s_want.logprobs, atol=TOL)
            full = types.ModelInput.from_ints(prompt.to_ints() + list(got.sequences[0].tokens))
            lp_remote = sampler.compute_logprobs(full).result()
            lp_local = local_sampler.compute_logprobs(full).result()
            assert lp_remote[0] is None and len(lp_remote) == full.length
            np.testing.assert_allclose(lp_remote[1:], lp_local[1:], atol=TOL)

            # ephemeral sampler from the training client
            fresh = tc.save_weights_and_get_sampling_client().result()
            assert len(fresh.sample(prompt, 2, params).result().sequences) == 2
            session_id = sc.holder.get_session_id()
        # leaving the `with` finishes the session and releases its models
        session = server.registry.sessions[session_id]
        assert session.finished == "success"
        assert not any(m.session_id == session_id for m in server.registry.models.values())


def test_unsupported_calls_fail_with_a_clear_error(engine):
    with serve_in_thread(engine) as url:
        with tinker.ServiceClient(base_url=url, api_key=KEY) as sc:
            with pytest.raises(Exception, match="adamw only"):
                sc.create_lora_training_client(TINY_MODEL, rank=4, optimizer=types.DimuonOptimizerConfig()).result()
            tc = sc.create_lora_training_client(TINY_MODEL, rank=4, seed=0).result()
            sampler = tc.save_weights_and_get_sampling_client().result()
            with pytest.raises(Exception, match="prompt_alt_tokens_k"):
                sampler.sample(
                    types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=1), prompt_alt_tokens_k=2
                ).result()
        import httpx

        r = httpx.post(f"{url}/api/v1/no_such_call", headers={"X-API-Key": KEY}, json={})
        assert r.status_code == 404 and "supported:" in r.json()["detail"]
        r = httpx.post(f"{url}/api/v1/save_weights_external", headers={"X-API-Key": KEY}, json={})
        assert r.status_code == 400 and "tinkrl export" in r.json()["detail"]


def test_api_key_is_enforced_when_given(engine):
    with serve_in_thread(engine, api_key="tml-secret") as url:
        with pytest.raises(tinker.AuthenticationError):
            tinker.ServiceClient(base_url=url, api_key="tml-other").create_lora_training_client(
                TINY_MODEL, rank=4
            ).result()
        with tinker.ServiceClient(base_url=url, api_key="tml-secret") as sc:
            assert sc.create_lora_training_client(TINY_MODEL, rank=4).result().get_info().lora_rank == 4


def test_a_resent_forward_backward_accumulates_once(engine):
    """The first forward_backward's response is lost after the server ran it; the SDK
    re-sends it (same seq_id) and the server answers with the original promise."""
    server = TinkerServer(engine)
    dropped: list[str] = []

    @web.middleware
    async def drop_first_forward_backward(request: web.Request, handler):
        response = await handler(request)
        if request.path == "/api/v1/forward_backward" and not dropped:
            dropped.append(request.path)
            request.transport.close()  # the client sees the connection die, no response
        return response

    server.app.middlewares.append(drop_first_forward_backward)
    probe = _inputs_for("cross_entropy")
    adam = types.AdamParams(learning_rate=1e-2)
    local_tc = engine.create_lora_training_client(TINY_MODEL, rank=8, seed=1).result()
    local_tc.forward_backward(probe, "cross_entropy")
    local_tc.optim_step(adam)
    want = local_tc.forward(probe, "cross_entropy").result()
    with serve_in_thread(server=server) as url:
        with tinker.ServiceClient(base_url=url, api_key=KEY) as sc:
            tc = sc.create_lora_training_client(TINY_MODEL, rank=8, seed=1).result()
            tc.forward_backward(probe, "cross_entropy")
            tc.optim_step(adam)
            got = tc.forward(probe, "cross_entropy").result()
    assert dropped
    _assert_same_output(got, want)


def test_the_cli_entry_point_serves_the_sdk(tmp_path):
    """`tinkrl serve tinker` as a user starts it: a process, a port, --model preloaded."""
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tinkrl.cli",
            "serve",
            "tinker",
            "--port",
            str(port),
            "--model",
            TINY_MODEL,
            "--api-key",
            "tml-cli",
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                if httpx.get(f"{url}/api/v1/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.25)
        else:
            pytest.fail("server did not come up")
        with tinker.ServiceClient(base_url=url, api_key="tml-cli") as sc:
            sampler = sc.create_sampling_client(base_model=TINY_MODEL).result()
            out = sampler.sample(
                types.ModelInput.from_ints([1, 5, 9]), 2, types.SamplingParams(max_tokens=3, stop=[])
            ).result()
            assert [len(s.tokens) for s in out.sequences] == [3, 3]
            caps = tinker.RestClient(base_url=url, api_key="tml-cli").get_server_capabilities().result()
            assert TINY_MODEL in [m.model_name for m in caps.supported_models]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    bad = subprocess.run(
        [sys.executable, "-m", "tinkrl.cli", "serve", "tinker", "--api-key", "secret"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "tml-" in bad.stderr


def test_concurrent_sample_requests_from_several_clients_are_all_served(engine):
    """Many rollouts sample at once (the cookbook keeps hundreds in flight); the server
    hands them to the engine concurrently, where the sampler merges them into batches."""
    import asyncio

    with serve_in_thread(engine) as url:
        with (
            tinker.ServiceClient(base_url=url, api_key=KEY) as sc_a,
            tinker.ServiceClient(base_url=url, api_key=KEY) as sc_b,
        ):
            samplers = [sc.create_sampling_client(base_model=TINY_MODEL).result() for sc in (sc_a, sc_b)]
            params = types.SamplingParams(max_tokens=5, temperature=1.0, stop=[])

            async def rollouts():
                calls = [
                    samplers[i % 2].sample(types.ModelInput.from_ints([1, 10 + i, 20 + i]), 2, params)
                    for i in range(16)
                ]
                return await asyncio.gather(*calls)

            results = asyncio.run(rollouts())
    assert len(results) == 16
    for result in results:
        assert [len(s.tokens) for s in result.sequences] == [5, 5]
        assert all(np.isfinite(s.logprobs).all() and max(s.logprobs) <= 0 for s in result.sequences)


def test_a_training_runs_record_carries_what_its_readers_need(engine, isolated_home, monkeypatch):
    """The SDK's get_training_run answers with the run's base model, rank and user_metadata, and a harness
    agent on one of its checkpoints takes the action format and turn cap it trained with unless given."""
    from tinkrl.backends import TinkerService, checkpoint_metadata
    from tinkrl.harness.policy import policy_from_kwargs

    monkeypatch.setenv("TINKER_API_KEY", KEY)
    trained = {"action_format": "shell", "tool_format": "hermes", "max_turns": "3"}
    with serve_in_thread(server=TinkerServer(engine)) as url, tinker.ServiceClient(base_url=url, api_key=KEY) as sc:
        tc = sc.create_lora_training_client(TINY_MODEL, rank=8, seed=0, user_metadata=trained).result()
        path = tc.save_weights_for_sampler("final").result().path
        rest = sc.create_rest_client()
        run = rest.get_training_run_by_tinker_path(path).result()
        assert (run.training_run_id, run.base_model, run.lora_rank) == (path.split("/")[2], TINY_MODEL, 8)
        assert run.user_metadata == trained and run.is_lora
        with pytest.raises(tinker.APIStatusError, match="unknown training run"):
            rest.get_training_run("no-such-run").result()
        # what `tinkrl eval --checkpoint` reads from a Tinker service: the same record, {} for an unknown run
        assert checkpoint_metadata(TinkerService(sc), path) == trained
        assert checkpoint_metadata(TinkerService(sc), "tinker://no-such-run/sampler_weights/final") == {}

        policy, limits = policy_from_kwargs(TINY_MODEL, checkpoint_path=path, tinker_url=url)
        assert limits.max_turns == 3 and policy.action_format == limits.action_format == "shell"
        policy.close()
        policy, limits = policy_from_kwargs(
            TINY_MODEL, checkpoint_path=path, tinker_url=url, max_turns="7", action_format="tools"
        )
        assert limits.max_turns == 7 and policy.action_format == "tools"  # given: kept
        policy.close()
        policy, limits = policy_from_kwargs(TINY_MODEL, tinker_url=url)  # the base model: the defaults
        assert limits.max_turns == 10 and policy.action_format == "shell"
