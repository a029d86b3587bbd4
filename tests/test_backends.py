"""`make_service_client`: backend=tinker fails at start, in one line, when it cannot work, and leaving its
`with` block finishes the session with the outcome, in bounded time even when the service is gone."""

from __future__ import annotations

import asyncio
import time

import pytest
from helpers.ors import free_port
from helpers.tinker_sessions import finish_reasons, sdk_heartbeats, wait_until_no_heartbeat

from tinkrl import backends
from tinkrl.backends import BackendUnavailable, make_service_client
from tinkrl.config import BackendConfig, load_config
from tinkrl.errors import ConfigError
from tinkrl.local import ServiceClient as LocalServiceClient
from tinkrl.local.models import TINY_MODEL
from tinkrl.tinker_server.app import TinkerServer, serve_in_thread


@pytest.fixture(scope="module")
def engine() -> LocalServiceClient:
    """The embedded engine behind the test servers (sessions open when the SDK makes a sampling client)."""
    return LocalServiceClient()


def test_missing_or_malformed_key_is_a_config_error(monkeypatch):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="TINKER_API_KEY"):
        make_service_client(BackendConfig(backend="tinker", base_url="http://127.0.0.1:1"))
    with pytest.raises(ConfigError, match="tml-"):
        make_service_client(BackendConfig(backend="tinker", base_url="http://127.0.0.1:1"), api_key="sk-abc")
    with pytest.raises(ConfigError, match="'local' or 'tinker'"):
        load_config(None, ["env=arithmetic", "backend=hosted"])
    with pytest.raises(ConfigError, match="backend=local only"):
        make_service_client(BackendConfig(backend="tinker", device="cpu"), api_key="tml-local")


def test_unreachable_service_fails_before_any_work(monkeypatch):
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BackendUnavailable, match=f"cannot reach the Tinker service at {url}") as info:
        make_service_client(BackendConfig(backend="tinker", base_url=url), api_key="tml-local")
    assert "\n" not in str(info.value)


def test_refused_key_and_env_resolution(monkeypatch):
    # The key check answers before the engine is touched, so no engine is needed here.
    with serve_in_thread(None, api_key="tml-right") as url:
        monkeypatch.setenv("TINKER_BASE_URL", url)
        monkeypatch.setenv("TINKER_API_KEY", "tml-wrong")
        with pytest.raises(BackendUnavailable, match="refused the API key"):
            make_service_client(BackendConfig(backend="tinker"))
        monkeypatch.setenv("TINKER_API_KEY", "tml-right")
        import tinker

        with make_service_client(BackendConfig(backend="tinker")) as client:
            assert isinstance(client.sdk, tinker.ServiceClient)


def test_leaving_the_block_finishes_the_session_with_the_outcome(engine):
    """As the SDK's own `with ServiceClient()`: success, errored for an Exception, interrupted for a
    KeyboardInterrupt; the exception goes on unchanged, and the SDK stops the session's heartbeats."""
    server = TinkerServer(engine)
    with serve_in_thread(server=server) as url:
        config = BackendConfig(backend="tinker", base_url=url)
        with make_service_client(config, api_key="tml-local") as service:
            service.create_sampling_client(base_model=TINY_MODEL)
            assert finish_reasons(server) == [None]
        for exc in (RuntimeError("the run failed"), KeyboardInterrupt()):
            with pytest.raises(type(exc)) as info:
                with make_service_client(config, api_key="tml-local") as service:
                    service.create_sampling_client(base_model=TINY_MODEL)
                    raise exc
            assert info.value is exc
        assert not sdk_heartbeats() & set(server.registry.sessions)
    assert finish_reasons(server) == ["success", "errored", "interrupted"]


def test_close_takes_the_sdks_arguments_on_both_backends(engine):
    """`close(status, detail)` returns a future on either backend, so code written for the SDK runs on both."""
    server = TinkerServer(engine)
    with serve_in_thread(server=server) as url:
        service = make_service_client(BackendConfig(backend="tinker", base_url=url), api_key="tml-local")
        service.create_sampling_client(base_model=TINY_MODEL)
        assert service.close("errored", detail="stopped by hand").result(timeout=30) is None
        service.close("success").result(timeout=30)  # the first reason stays
    assert finish_reasons(server) == ["errored"]
    local = make_service_client(BackendConfig(backend="local"))
    assert local.close("interrupted", detail="stopped by hand").result(timeout=0) is None
    with local as same:
        assert same is local


def test_a_service_gone_before_the_end_costs_one_bounded_wait_and_one_line(engine, monkeypatch, capsys):
    """The SDK retries an unreachable service for minutes; leaving the block waits FINISH_TIMEOUT_S, says
    so in one line, stops the SDK's retries and heartbeats, and lets the run's own exception through."""
    monkeypatch.setattr(backends, "FINISH_TIMEOUT_S", 1.0)
    server = TinkerServer(engine)
    with serve_in_thread(server=server) as url:
        service = make_service_client(BackendConfig(backend="tinker", base_url=url), api_key="tml-local")
        service.create_sampling_client(base_model=TINY_MODEL)
    capsys.readouterr()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="the run failed"):
        with service:
            raise RuntimeError("the run failed")
    waited = time.monotonic() - t0
    assert 1.0 <= waited < 10.0
    assert capsys.readouterr().err.splitlines() == [
        "tinkrl: could not finish the Tinker session (errored): no answer within 1s; the service will expire it "
        "once its heartbeats stop"
    ]
    assert finish_reasons(server) == [None]  # the server was gone: nothing recorded
    assert wait_until_no_heartbeat(set(server.registry.sessions)) == set()


def test_a_restarted_service_that_lost_the_session_costs_no_wait_and_no_line(engine, capsys):
    """A service restarted on the same address answers 404 for the session: nothing to record there, and
    the run's own error already says the service lost its state, so no line of ours, and no wait."""
    server = TinkerServer(engine)
    port = free_port()
    with serve_in_thread(server=server, port=port) as url:
        service = make_service_client(BackendConfig(backend="tinker", base_url=url), api_key="tml-local")
        service.create_sampling_client(base_model=TINY_MODEL)
    restarted = TinkerServer(engine)
    with serve_in_thread(server=restarted, port=port):
        capsys.readouterr()
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="the run failed"):
            with service:
                raise RuntimeError("the run failed")
        assert time.monotonic() - t0 < 5.0
    assert capsys.readouterr().err == ""
    assert finish_reasons(server) == [None] and finish_reasons(restarted) == []
    assert wait_until_no_heartbeat(set(server.registry.sessions)) == set()


def test_a_checkpoint_policy_ends_its_session_with_the_episode(engine):
    """The harness adapters' policy (the SDK directly): each `async with` episode is one session, ended
    with the episode's outcome."""
    from tinkrl.harness.policy import CheckpointPolicy

    server = TinkerServer(engine)

    async def episode(policy: CheckpointPolicy, fail: bool) -> None:
        async with policy:
            tokens, _, _ = await policy.sample([1, 2, 3], 2)
            assert tokens
            if fail:
                raise RuntimeError("the agent failed")

    with serve_in_thread(server=server) as url:
        policy = CheckpointPolicy(TINY_MODEL, base_url=url, api_key="tml-local")
        asyncio.run(episode(policy, fail=False))
        with pytest.raises(RuntimeError, match="the agent failed"):
            asyncio.run(episode(policy, fail=True))
        with policy:  # no sample, no session
            pass
    assert finish_reasons(server) == ["success", "errored"]


def test_sdk_clients_are_wrapped_not_patched(engine):
    """backend=tinker hands out adapters holding the SDK's own clients: the tokenizer comes from the local
    copy, `save_weights_and_get_sampling_client` gives a finished sampling client, everything else is the
    SDK's, and no attribute of an SDK object is replaced."""
    import tinker

    replaced = {"get_tokenizer", "save_weights_and_get_sampling_client", "create_sampling_client", "close"}
    with serve_in_thread(engine) as url:
        with make_service_client(BackendConfig(backend="tinker", base_url=url), api_key="tml-local") as service:
            tc = service.create_lora_training_client(base_model=TINY_MODEL, rank=4, seed=0)
            sc = tc.save_weights_and_get_sampling_client()
            base = service.create_sampling_client(base_model=TINY_MODEL)
            assert isinstance(service.sdk, tinker.ServiceClient)
            assert isinstance(tc, backends.TinkerTrainingClient) and isinstance(tc.sdk, tinker.TrainingClient)
            for client in (sc, base):
                assert isinstance(client, backends.TinkerSamplingClient)
                assert isinstance(client.sdk, tinker.SamplingClient)
            for sdk in (service.sdk, tc.sdk, sc.sdk, base.sdk):
                assert not replaced & set(vars(sdk)), type(sdk)
            local = backends._cached_local_tokenizer(TINY_MODEL)
            assert tc.get_tokenizer() is sc.get_tokenizer() is base.get_tokenizer() is local
            # the rest is the SDK's: its info, its futures, its samples
            assert tc.get_info().model_data.model_name == TINY_MODEL == sc.get_base_model()
            prompt = tinker.ModelInput.from_ints(local.encode("hello"))
            out = sc.sample(prompt, 1, tinker.SamplingParams(max_tokens=2, temperature=1.0)).result()
            assert len(out.sequences) == 1 and out.sequences[0].tokens
            assert tc.save_weights_for_sampler("adapted").result().path.startswith("tinker://")
