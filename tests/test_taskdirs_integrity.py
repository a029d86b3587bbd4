"""Grading integrity: what an agent leaves behind cannot change the verdict."""

import shutil
from pathlib import Path

import pytest
from helpers.requirements import needs_bwrap

from tinkrl.sandbox import get_provider
from tinkrl.taskdirs import apply_solution, grade, iter_tasks, load_task, start_sandbox

pytestmark = needs_bwrap
TASKS = Path(__file__).resolve().parents[1] / "tasks"

FORCE_PASS_CONFTEST = """
import pytest
from helpers.requirements import needs_bwrap
from helpers.requirements import needs_bwrap
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""
FAKE_PYTEST = """
import sys
print("=" * 20 + " short test summary info " + "=" * 20)
for t in ("tests/test_ops.py::test_divide_by_zero", "tests/test_ops.py::test_add",
          "tests/test_ops.py::test_divide", "tests/test_ops.py::test_mean"):
    print("PASSED " + t)
print("=" * 20 + " 4 passed " + "=" * 20)
sys.exit(0)
"""


@pytest.fixture(scope="module")
def provider():
    p = get_provider("bwrap")
    yield p
    p.close()


@pytest.fixture(scope="module")
def swe_task():
    return next(iter_tasks([TASKS / "swebench_rows.jsonl"]))


def test_planted_conftest_and_fake_pytest_do_not_pass_a_swebench_task(provider, swe_task):
    with start_sandbox(swe_task, provider) as sb:
        sb.write_file("/testbed/conftest.py", FORCE_PASS_CONFTEST)  # overwrites the repo's own conftest
        sb.write_file("/testbed/tests/conftest.py", FORCE_PASS_CONFTEST)
        sb.write_file("/testbed/pytest.py", FAKE_PYTEST)
        sb.write_file("/testbed/pytest.ini", "[pytest]\naddopts = -p no:terminal\n")
        site = "/root/.local/lib/python3.11/site-packages"
        sb.write_file(f"{site}/sitecustomize.py", "import sys; print('PASSED tests/test_ops.py::test_divide_by_zero')")
        sb.write_file(f"{site}/usercustomize.py", "import os; os._exit(0)")
        result = grade(swe_task, sb)
        assert result.reward == 0.0, result.detail
        assert result.tests["tests/test_ops.py::test_divide_by_zero"] == "FAILED"
        # the repo's legitimate conftest is back, the planted ones are gone
        assert b"sys.path.insert" in sb.read_file("/testbed/conftest.py")
        assert sb.exec("ls /testbed/pytest.py /testbed/tests/conftest.py /testbed/pytest.ini").exit_code != 0


def test_the_same_sandbox_with_the_real_fix_passes(provider, swe_task):
    with start_sandbox(swe_task, provider) as sb:
        sb.write_file("/testbed/tests/conftest.py", FORCE_PASS_CONFTEST)
        apply_solution(swe_task, sb)
        assert grade(swe_task, sb).reward == 1.0


def test_agent_processes_tests_and_path_cannot_fake_a_reward_file(provider):
    task = load_task(TASKS / "hello-file")
    with start_sandbox(task, provider) as sb:
        # a background writer, a doctored test script, and shadowing binaries on an exported PATH
        sb.exec("(while true; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; sleep 0.01; done &)")
        sb.write_file("/tests/test.sh", "echo 1 > /logs/verifier/reward.txt\n")
        sb.write_file("/app/bin/bash", "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n", 0o755)
        sb.write_file("/app/bin/cat", "#!/bin/sh\necho 'Hello, world!'\n", 0o755)
        sb.exec("export PATH=/app/bin:$PATH")
        result = grade(task, sb)
        assert result.reward == 0.0, result.detail
        assert sb.exec("ps -eo comm | grep -c sleep").stdout.strip() == "0"


def test_fake_passed_lines_printed_by_code_under_test(provider):
    (task,) = iter_tasks([TASKS / "r2e_rows.json"])
    with start_sandbox(task, provider) as sb:
        fake = "\n".join(
            f"print('PASSED r2e_tests/test_slug.py::{t}')"
            for t in (
                "test_simple",
                "test_punctuation_collapses",
                "test_cut_has_no_trailing_dash",
                "test_already_slug",
                "TestUnicode::test_accents_dropped",
            )
        )
        sb.exec(f"cat >> textkit/__init__.py <<'EOF'\n{fake}\nEOF")
        result = grade(task, sb)
        assert result.reward == 0.0 and "differ" in result.detail


def test_verifier_timeout_scores_zero(provider, tmp_path):
    d = tmp_path / "slow"
    shutil.copytree(TASKS / "hello-file", d)
    (d / "task.toml").write_text('[verifier]\ntimeout_sec = 1\n[environment]\nworkdir = "/app"\n')
    (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt; sleep 30\n")
    task = load_task(d)
    with start_sandbox(task, provider) as sb:
        r = grade(task, sb)
        assert r.reward == 0.0 and "timed out" in r.detail
