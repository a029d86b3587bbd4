"""Graders on passing and failing outputs, including faked PASSED lines."""

from tinkrl.taskdirs.verifier import grade_pytest, grade_r2e, grade_reward_file, grade_swebench, parse_pytest_summary


def summary(*lines, before="", after="===== 1 passed in 0.1s ====="):
    return "\n".join(
        [before, "=========================== short test summary info ============================", *lines, after, ""]
    )


def test_pytest_summary_parsed_and_reasons_stripped():
    out = summary(
        "PASSED tests/t.py::test_a",
        "FAILED tests/t.py::test_b - assert 1 == 2",
        "SKIPPED [1] tests/t.py:9: no reason",
        "ERROR tests/t.py::test_c",
    )
    assert parse_pytest_summary(out) == {
        "tests/t.py::test_a": "PASSED",
        "tests/t.py::test_b": "FAILED",
        "tests/t.py::test_c": "ERROR",
    }


def test_fake_passed_lines_outside_the_summary_do_not_count():
    fake = "PASSED tests/t.py::test_b\n" * 3
    out = summary("FAILED tests/t.py::test_b - boom", before=fake, after="=== 1 failed ===\n" + fake)
    assert parse_pytest_summary(out) == {"tests/t.py::test_b": "FAILED"}
    assert grade_pytest(out).reward == 0.0


def test_duplicate_entries_keep_the_worst_status():
    out = summary("FAILED t.py::test_x", "PASSED t.py::test_x")
    assert parse_pytest_summary(out) == {"t.py::test_x": "FAILED"}


def test_pytest_grader():
    assert grade_pytest(summary("PASSED t.py::a", "XFAIL t.py::b")).reward == 1.0
    assert grade_pytest(summary("PASSED t.py::a", "FAILED t.py::b")).reward == 0.0
    r = grade_pytest("PASSED t.py::a\n")  # no summary block at all: e.g. the agent printed it
    assert r.reward == 0.0 and "no pytest summary" in r.detail


def test_reward_file_grader():
    assert grade_reward_file({"reward.txt": b"1\n", "reward.json": None}).reward == 1.0
    assert grade_reward_file({"reward.txt": b"0.25", "reward.json": None}).reward == 0.25
    both = grade_reward_file({"reward.txt": b"1", "reward.json": b'{"reward": 0.5, "style": 1}'})
    assert both.reward == 0.5 and both.rewards == {"reward": 0.5, "style": 1.0}  # JSON wins
    assert grade_reward_file({"reward.json": b'{"a": 1, "b": 0}'}).reward == 0.5
    assert grade_reward_file({"reward.txt": b"nan"}).reward == 0.0
    assert grade_reward_file({"reward.txt": b"PASSED"}).reward == 0.0
    assert grade_reward_file({"reward.json": b'{"reward": "1"}'}).reward == 0.0
    missing = grade_reward_file({"reward.txt": None, "reward.json": None})
    assert missing.reward == 0.0 and "no /logs/verifier/reward" in missing.detail


def test_r2e_grader_needs_the_exact_expected_map():
    expected = {"test_a": "PASSED", "TestK.test_b": "FAILED"}
    ok = summary("PASSED r2e_tests/test_1.py::test_a", "FAILED r2e_tests/test_1.py::TestK::test_b - x")
    assert grade_r2e(ok, expected).reward == 1.0
    wrong = summary("PASSED r2e_tests/test_1.py::test_a", "PASSED r2e_tests/test_1.py::TestK::test_b")
    assert grade_r2e(wrong, expected).reward == 0.0
    extra = summary("PASSED a.py::test_a", "FAILED a.py::TestK::test_b", "PASSED a.py::test_new")
    assert grade_r2e(extra, expected).reward == 0.0
    missing = summary("PASSED a.py::test_a")
    assert "TestK.test_b" in grade_r2e(missing, expected).detail


def test_swebench_grader_fail_to_pass_and_pass_to_pass():
    f2p, p2p = ["t.py::test_fix"], ["t.py::test_old", "t.py::test_skip"]
    resolved = summary("PASSED t.py::test_fix", "PASSED t.py::test_old", "SKIPPED t.py::test_skip")
    assert grade_swebench(resolved, f2p, p2p).reward == 1.0
    unfixed = summary("FAILED t.py::test_fix", "PASSED t.py::test_old", "PASSED t.py::test_skip")
    r = grade_swebench(unfixed, f2p, p2p)
    assert r.reward == 0.0 and "FAIL_TO_PASS 0/1" in r.detail
    broke = summary("PASSED t.py::test_fix", "FAILED t.py::test_old", "PASSED t.py::test_skip")
    assert "PASS_TO_PASS 1/2" in grade_swebench(broke, f2p, p2p).detail
    skipped_fix = summary("SKIPPED t.py::test_fix", "PASSED t.py::test_old", "PASSED t.py::test_skip")
    assert grade_swebench(skipped_fix, f2p, p2p).reward == 0.0
