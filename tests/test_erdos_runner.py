"""Model-written Erdős programs in the bwrap sandbox: valid ones scored from h, bad ones with their reason."""

from __future__ import annotations

import numpy as np
import pytest

from tinkrl.envs.erdos import overlap as em
from tinkrl.envs.erdos import runner as er

N = 100


@pytest.fixture(scope="module")
def runner():
    from tinkrl.sandbox import get_provider

    provider = get_provider("bwrap")
    yield er.ProgramRunner(provider, n_points=N, timeout_s=4, memory_mb=400)
    provider.close()


@pytest.fixture(scope="module")
def start():
    return em.random_construction(N, np.random.default_rng(0))


def test_extract_code_takes_the_last_block_and_an_unterminated_one():
    text = "plan\n```python\nx = 1\n```\nthen\n```python\ndef run():\n    return 2\n```\nbye"
    assert er.extract_code(text) == "def run():\n    return 2\n"
    assert er.extract_code("```python\ndef run():\n    pass") == "def run():\n    pass"
    assert er.extract_code("```\ny = 3\n```") == "y = 3\n"
    assert er.extract_code("no code here") is None


def test_valid_program_is_scored_from_h_not_from_what_it_prints_or_returns(runner, start):
    # Prints and returns a fake C₅ the way the published prompt asks; tinkrl ignores both.
    code = (
        "def run(seed=0, budget_s=1.0):\n"
        "    print('C5 = 0.30')\n"
        "    h = np.full(n_points, 0.5)\n"
        "    return h, 0.30, n_points\n"
    )
    out = runner.run(code, start)
    assert out.valid and out.c5 == pytest.approx(0.5) and out.reward == pytest.approx(2.0)
    assert "C5 = 0.30" in out.stdout_tail


def test_program_starts_from_initial_h_values(runner, start):
    code = (
        "def run(seed=0):\n"
        "    rng = np.random.default_rng(seed)\n"
        "    h = np.clip(initial_h_values + rng.normal(0, 1e-3, n_points), 0, 1)\n"
        "    return h * (n_points / 2) / h.sum()\n"
    )
    out = runner.run(code, start, seed=3)
    assert out.valid
    assert np.max(np.abs(out.h - start)) < 0.02 and not np.allclose(out.h, start)
    assert out.c5 == pytest.approx(em.c5(out.h))


@pytest.mark.parametrize(
    "code, reason",
    [
        ("def run():\n    h = np.full(n_points, 0.5)\n    h[7] = np.nan\n    return h\n", em.NOT_FINITE),
        ("def run():\n    h = np.full(n_points, 0.5)\n    h[0], h[1] = 1.3, -0.3\n    return h\n", em.OUT_OF_RANGE),
        ("def run():\n    return np.full(n_points, 0.4)\n", em.WRONG_INTEGRAL),
        ("def run():\n    return np.full(n_points + 1, 0.5)\n", em.WRONG_LENGTH),
        ("def run():\n    return np.full((2, n_points), 0.5)\n", em.WRONG_SHAPE),
        ("def run():\n    while True:\n        pass\n", er.TIMEOUT),
        ("import time\ndef run():\n    time.sleep(60)\n", er.TIMEOUT),
        ("def run():\n    return np.ones(10**10)\n", er.MEMORY_LIMIT),
        ("def run():\n    keep = []\n    while True:\n        keep.append(np.ones(10**7))\n", er.MEMORY_LIMIT),
        ("def run():\n    raise ValueError('boom')\n", er.RUNTIME_ERROR),
        ("h = np.full(n_points, 0.5)\nprint('C5 = 0.30')\n", er.NO_RUN_FUNCTION),  # prints a fake C₅ only
        ("def run():\n    print('C5 = 0.30')\n", er.NO_OUTPUT),
        ("import os\ndef run():\n    print('C5 = 0.30', flush=True)\n    os._exit(0)\n", er.NO_OUTPUT),
        ("def run():\n    return 'C5 = 0.30'\n", er.BAD_OUTPUT),
    ],
)
def test_invalid_programs_score_zero_with_their_reason(runner, start, code, reason):
    out = runner.run(code, start)
    assert not out.valid and out.reward == 0.0
    assert out.reason == reason, (out.reason, out.detail)


def test_forged_status_file_cannot_make_a_bad_h_count(runner, start):
    # The program writes the driver's output files itself, claiming success with a tiny h.
    code = (
        "import json, os\n"
        "os.makedirs('/app/out', exist_ok=True)\n"
        "np.save('/app/out/h.npy', np.full(n_points, 0.01))\n"
        "json.dump({'status': 'ok'}, open('/app/out/status.json', 'w'))\n"
        "os._exit(0)\n"
    )
    out = runner.run(code, start)
    assert not out.valid and out.reason == em.WRONG_INTEGRAL
