"""Faults between a run and its Tinker service: `tinkrl train backend=tinker` through a fault-injecting proxy
(tests/helpers/fault_proxy.py) in front of `tinkrl serve tinker`.

The proxy answers as a misbehaving hosted service does, at points drawn from a seed: 429 with Retry-After,
503, a 500 after the work was done, a connection reset mid-body, an answer held past the client's
timeout, a request delivered twice. The SDK's own retry rules handle them (tinkrl adds none). What must
hold: the run finishes with every step once in `metrics.jsonl`, complete checkpoints whose optimizer step
equals their row's step (no optim_step lost or applied twice), and, where the faults never made the engine
run anything twice, the same metrics as the same run without faults (no forward_backward applied twice,
no sample lost). A service that keeps failing past the SDK's retry budget stops the run with one line
saying what failed and that the same command resumes; run again, it does.

The trainer runs in this process (as `tinkrl train` would, through its `cli_main`), the server on a thread
of it, so the sampler's random numbers follow the trainer's seed and two runs can be compared exactly.
"""

from __future__ import annotations

import os

import pytest
from helpers.chaos import RUN_ARGS, assert_consistent, jsonl_rows
from helpers.engine import TINY
from helpers.fault_proxy import Fault, fault_proxy, seeded_faults

from tinkrl.local import ServiceClient as LocalServiceClient
from tinkrl.tinker_server.app import TinkerServer, serve_in_thread

os.environ.setdefault("TINKER_TELEMETRY", "0")

STEPS = 3
ARGS = [
    *RUN_ARGS,
    "env=arithmetic",
    "backend=tinker",
    f"max_steps={STEPS}",
    "max_concurrent_rollouts=1",  # one sample at a time: the sampler draws in the same order every run
    # The tiny random model never answers: its format penalty, as the advantage itself, gives a real loss
    # and updates big enough that a forward_backward or optim_step applied twice shows in the next step.
    "env.format_coef=0.5",
    "adv_estimator=direct",
    "learning_rate=5e-3",
]
# The requests a training step makes whose faults leave the engine's work unchanged: each is re-sent by the
# SDK with the same seq_id (the server runs it once) or re-polled by request id (the server keeps results).
TRAINING_ROUTES = (
    "forward_backward",
    "optim_step",
    "save_weights",
    "save_weights_for_sampler",
    "retrieve_future:ForwardBackward",
    "retrieve_future:OptimStep",
    "retrieve_future:SaveWeights",
    "retrieve_future:SaveWeightsForSampler",
)
QUICK_KINDS = ("429", "503", "500", "reset", "duplicate")


@pytest.fixture(scope="module")
def engine():
    """One engine for every run, its model loaded before any run (loading re-seeds torch)."""
    client = LocalServiceClient()
    client.create_sampling_client(base_model=TINY)
    return client


@pytest.fixture
def service(engine, isolated_home, monkeypatch):
    """`tinkrl serve tinker` on a thread: its URL."""
    monkeypatch.setenv("TINKER_API_KEY", "tml-local")
    with serve_in_thread(server=TinkerServer(engine)) as url:
        yield url


def train(base_url: str, run, capsys, *extra: str) -> tuple[int, str]:
    """`tinkrl train ARGS` against `base_url` into `run`: (exit code, what it printed)."""
    from tinkrl.commands.train import cli_main

    code = cli_main([*ARGS, f"base_url={base_url}", f"log_path={run}", *extra])
    out = capsys.readouterr()
    return code, out.out + out.err


def measured(run) -> list[dict]:
    """Each step's metrics but the timings."""
    return [
        {k: v for k, v in row.items() if not k.startswith("time/") and isinstance(v, (int, float))}
        for row in jsonl_rows(run / "metrics.jsonl")
    ]


def assert_same_training(faulted: list[dict], clean: list[dict]) -> None:
    assert len(faulted) == len(clean) == STEPS
    assert all(abs(row["optim/loss"]) > 0.1 for row in clean)  # a real loss, not 0 == 0
    assert clean[1]["optim/entropy"] != pytest.approx(clean[0]["optim/entropy"], abs=1e-4)  # it trained
    for step, (a, b) in enumerate(zip(faulted, clean)):
        for key, value in b.items():
            assert a[key] == pytest.approx(value, abs=1e-4), f"step {step}: {key}"


def test_training_survives_each_fault_at_seeded_points(service, isolated_home, tmp_path, capsys):
    """The fast slice: one run with a 429, a 503, a 500, a reset and a duplicate on training requests."""
    with fault_proxy(service, []) as (url, proxy):
        code, out = train(url, tmp_path / "clean", capsys)
    assert code == 0, out[-3000:]
    seen = set(proxy.injected.routes)
    assert set(TRAINING_ROUTES) <= seen, f"the run never made {set(TRAINING_ROUTES) - seen}"

    faults = seeded_faults(7, QUICK_KINDS, TRAINING_ROUTES, max_nth=STEPS)
    with fault_proxy(service, faults) as (url, proxy):
        code, out = train(url, tmp_path / "faulted", capsys)
    assert code == 0, out[-3000:]
    assert sorted(proxy.injected.faults, key=str) == sorted(faults, key=str), "a fault point was never reached"
    assert "Traceback" not in out, out[-3000:]
    assert assert_consistent(tmp_path / "faulted", isolated_home) == (STEPS, STEPS)
    assert_same_training(measured(tmp_path / "faulted"), measured(tmp_path / "clean"))


@pytest.mark.slow  # ~2 min: six seeds of every quick fault, on training and on sampling requests
@pytest.mark.parametrize("seed", range(6))
def test_every_fault_kind_anywhere(service, isolated_home, tmp_path, capsys, seed):
    routes = (*TRAINING_ROUTES, "asample", "retrieve_future:Sample", "create_model", "create_sampling_session")
    faults = seeded_faults(seed, QUICK_KINDS, routes, max_nth=STEPS)
    with fault_proxy(service, faults) as (url, proxy):
        code, out = train(url, tmp_path / "run", capsys)
    assert code == 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert assert_consistent(tmp_path / "run", isolated_home) == (STEPS, STEPS)
    reached = {(f.route, f.nth) for f in proxy.injected.faults}
    # create_model and create_sampling_session happen once or a few times a run: a later occurrence may not exist.
    assert reached == {(f.route, f.nth) for f in faults if proxy.seen[f.route] >= f.nth}


@pytest.mark.slow  # ~2 min: two answers held past the SDK's 45 s long-poll timeout
def test_answers_held_past_the_client_timeout(service, isolated_home, tmp_path, capsys):
    clean_run, run = tmp_path / "clean", tmp_path / "run"
    with fault_proxy(service, []) as (url, _):
        assert train(url, clean_run, capsys)[0] == 0
    faults = [Fault("retrieve_future:ForwardBackward", 2, "delay"), Fault("retrieve_future:OptimStep", 3, "delay")]
    with fault_proxy(service, faults) as (url, proxy):
        code, out = train(url, run, capsys)
    assert code == 0, out[-3000:]
    assert proxy.injected.faults == faults
    assert assert_consistent(run, isolated_home) == (STEPS, STEPS)
    assert_same_training(measured(run), measured(clean_run))


@pytest.mark.slow  # ~6 min: the SDK retries for 5 minutes before it gives up
def test_a_service_that_keeps_failing_stops_the_run_in_one_line_and_the_rerun_resumes(
    service, isolated_home, tmp_path, capsys
):
    run = tmp_path / "run"
    # Every forward_backward from the second step's on answers 503.
    faults = [Fault("forward_backward", n, "503") for n in range(2, 400)]
    with fault_proxy(service, faults) as (url, _):
        code, out = train(url, run, capsys)
    assert code == 1, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("tinkrl train: the Tinker service kept answering HTTP 503"), out[-3000:]
    assert "run the same command again" in last
    assert "Traceback" not in out, out[-3000:]
    assert assert_consistent(run, isolated_home) == (1, 1)

    with fault_proxy(service, []) as (url, _):
        code, out = train(url, run, capsys)
    assert code == 0, out[-3000:]
    assert "(step 1)" in out
    assert assert_consistent(run, isolated_home) == (STEPS, STEPS)
    assert jsonl_rows(run / "checkpoints.jsonl")[-1]["final"]
