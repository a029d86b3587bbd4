"""The Erdős env end to end with a scripted policy: prompts, two-phase sampling, the buffer, resume."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import erdos_scripted as es
from pydantic import ValidationError

from tinkrl.envs.erdos import overlap as em
from tinkrl.envs.erdos.config import ErdosConfig, ErdosEnvConfig
from tinkrl.envs.erdos.env import build_datasets, build_erdos_dataset
from tinkrl.errors import ConfigError

SCRIPT = Path(__file__).parent / "helpers" / "erdos_scripted.py"


@pytest.fixture(scope="module")
def renderer():
    return es.make_renderer()


@pytest.fixture(scope="module")
def provider(bwrap_provider):
    return bwrap_provider


def test_config_takes_the_documented_keys_and_rejects_unknown_ones():
    cfg = ErdosConfig(
        n_points=200, buffer_size=16, epsilon=0.125, max_tokens=2048, teacher_forcing=True, context_window_tokens=4096
    )
    assert ErdosConfig is ErdosEnvConfig and cfg.n_points == 200 and cfg.teacher_forcing
    with pytest.raises(ValidationError):
        ErdosEnvConfig(n_point=200)
    with pytest.raises(ValidationError):
        ErdosEnvConfig(epsilon=1.5)


def _dataset(tmp_path, renderer, provider, **overrides):
    cfg = ErdosEnvConfig(**{"n_points": 40, "buffer_size": 4, "timeout_s": 10, "initial_states": 2, **overrides})
    return build_erdos_dataset(
        cfg, renderer=renderer, group_size=2, groups_per_batch=2, run_dir=tmp_path, seed=1, sandbox_provider=provider
    )


def test_two_phase_sampling_forces_the_closing_text_and_scores_the_final_code(tmp_path, renderer, provider):
    ds = _dataset(tmp_path, renderer, provider, max_tokens=64, context_window_tokens=1200)
    tok = renderer.tokenizer

    async def play():
        env = (await ds.get_batch(0)[0].make_envs())[0]
        ob, stop = await env.initial_observation()
        assert "Current construction: C5 = " in tok.decode(ob.to_ints())
        forced = tok.encode(env.cfg.closing_text, add_special_tokens=False)
        budget = env.max_tokens(512)
        assert budget == 64  # min(max_tokens, room left for the closing text and an answer)
        # Phase 1 runs out of tokens mid-thought.
        thinking = tok.encode(" Let me think about the overlap of h with 1 - h at each shift", add_special_tokens=False)
        first = await env.step(thinking[:budget], stop_reason="length")
        assert not first.episode_done and first.reward == 0.0
        ids = first.next_observation.to_ints()
        assert ids == ob.to_ints() + thinking[:budget] + forced  # forced text is observation: not trained on
        assert env.max_tokens(512) == 1200 - len(ids)
        # Phase 2 continues inside the ```python block the closing text opened.
        final = tok.encode("def run():\n    return np.full(n_points, 0.5)\n```", add_special_tokens=False)
        second = await env.step(final + [stop[0]], stop_reason="stop")
        return second

    result = asyncio.run(play())
    assert result.episode_done and result.reward == pytest.approx(2.0)
    assert result.metrics["erdos/valid"] == 1.0 and result.metrics["erdos/forced"] == 1.0
    assert result.metrics["erdos/c5"] == pytest.approx(0.5)
    metrics = ds.batch_metrics(0)
    assert metrics["erdos/valid_frac"] == 1.0 and metrics["erdos/forced_frac"] == 1.0
    assert metrics["erdos/batch_best_c5"] == pytest.approx(0.5)


def test_without_teacher_forcing_a_truncated_response_is_scored_as_it_is(tmp_path, renderer, provider):
    ds = _dataset(tmp_path, renderer, provider, max_tokens=32, teacher_forcing=False)

    async def play():
        env = (await ds.get_batch(0)[0].make_envs())[0]
        await env.initial_observation()
        assert env.max_tokens(512) == 32
        action = renderer.tokenizer.encode("I think the answer is", add_special_tokens=False)
        return await env.step(action, stop_reason="length")

    result = asyncio.run(play())
    assert result.episode_done and result.reward == 0.0
    assert result.logs["erdos/result"] == "invalid: no_code"
    assert ds.batch_metrics(0)["erdos/invalid/no_code"] == 1.0


def test_invalid_answers_are_recorded_by_reason_and_never_enter_the_buffer(tmp_path, renderer, provider):
    ds = _dataset(tmp_path, renderer, provider)
    before = {e.id for e in ds.search.buffer.entries}
    fake = "```python\ndef run():\n    print('C5 = 0.2')\n    return np.full(n_points, 0.1), 0.2, n_points\n```"
    metrics = asyncio.run(es.play_step(ds, 0, renderer, response=fake))
    assert metrics["erdos/valid_frac"] == 0.0 and metrics["erdos/invalid/wrong_integral"] == 1.0
    assert "erdos/batch_best_c5" not in metrics
    assert {e.id for e in ds.search.buffer.entries} == before
    assert ds.search.buffer.total_expansions == 2  # both groups were counted as expansions


def test_scripted_policy_lowers_the_best_c5_and_survives_kill_and_resume(tmp_path):
    run_dir = tmp_path / "run"
    first = subprocess.Popen([sys.executable, str(SCRIPT), str(run_dir), "0", "50"], stdout=subprocess.PIPE, text=True)
    lines = []
    try:
        assert first.stdout is not None
        for line in first.stdout:
            lines.append(json.loads(line))
            if lines[-1].get("step") == 2:
                break
    finally:
        first.kill()  # SIGKILL mid-run: no chance to clean up
        first.wait(timeout=30)
    start, steps = lines[0], lines[1:]
    assert start["resumed"] is False and [s["step"] for s in steps] == [0, 1, 2]
    bests = [start["best_c5"]] + [s["erdos/best_c5"] for s in steps]
    assert all(b2 <= b1 for b1, b2 in zip(bests, bests[1:]))
    assert bests[-1] < bests[0] - 1e-3
    on_disk = json.loads((run_dir / "best.json").read_text())
    assert on_disk["c5"] <= bests[-1]
    h = np.asarray(on_disk["h"])
    assert em.c5(h) == pytest.approx(on_disk["c5"], abs=1e-15) and em.validate(h, 60).valid

    again = subprocess.run(
        [sys.executable, str(SCRIPT), str(run_dir), "3", "5"], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr[-2000:]
    resumed = [json.loads(line) for line in again.stdout.splitlines()]
    assert resumed[0]["resumed"] is True and resumed[0]["best_c5"] <= on_disk["c5"]
    after = [s["erdos/best_c5"] for s in resumed[1:]]
    assert after[-1] < on_disk["c5"] and all(b2 <= b1 for b1, b2 in zip(after, after[1:]))
    best = json.loads((run_dir / "best.json").read_text())
    assert best["c5"] == pytest.approx(after[-1]) and best["step"] in (3, 4)
    assert (run_dir / "best_h.png").stat().st_size > 1000
    assert float(best["c5_exact_upper"]) >= best["c5"] - 1e-15


def test_resume_refuses_a_buffer_of_another_size(tmp_path, renderer, provider):
    _dataset(tmp_path, renderer, provider)
    with pytest.raises(ConfigError, match="n_points"):
        _dataset(tmp_path, renderer, provider, n_points=50)


def test_the_documented_launch_keys_build_the_env_through_the_registry(tmp_path, renderer, provider):
    from tinkrl.config import load_config
    from tinkrl.envs import EnvContext, make_env_config
    from tinkrl.sandbox import LazyProvider

    config = load_config(
        None,
        [
            "env=ErdosConfig",
            "env.n_points=200",
            "env.buffer_size=16",
            "env.epsilon=0.125",
            "env.max_tokens=2048",
            "env.teacher_forcing=True",
            "env.context_window_tokens=4096",
            "adv_estimator=entropic",
            "adv_beta=2.0",
            "batch_size=512",
            "group_size=64",
            "lora_rank=32",
        ],
    )
    key, entry = next(iter(config.environments.items()))
    cfg = make_env_config(key, entry)
    assert isinstance(cfg, ErdosEnvConfig)
    assert (
        cfg.n_points,
        cfg.buffer_size,
        cfg.epsilon,
        cfg.max_tokens,
        cfg.teacher_forcing,
        cfg.context_window_tokens,
    ) == (200, 16, 0.125, 2048, True, 4096)
    ctx = EnvContext(
        key=key,
        entry=entry,
        renderer=renderer,
        model_name=config.model_name,
        group_size=64,
        groups_per_batch=config.groups_per_env()[key],
        max_tokens=config.max_tokens,
        run_dir=tmp_path,
        seed=0,
        sandbox=LazyProvider(provider),
    )
    datasets = build_datasets(cfg, ctx)
    batch = datasets.train.get_batch(0)
    assert len(batch) == 8 and (tmp_path / "best.json").exists() and (tmp_path / "erdos_buffer.json").exists()
    assert datasets.on_step(0, [])["erdos/best_c5"] == pytest.approx(
        json.loads((tmp_path / "best.json").read_text())["c5"]
    )
