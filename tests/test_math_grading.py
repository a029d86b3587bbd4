"""Answer extraction, the fast path, math-verify equivalences and the grader pool's timeout recovery."""

from __future__ import annotations

import asyncio

import pytest

from tinkrl.envs.math import grading as g


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so the answer is \boxed{42}.", "42"),
        (r"first \boxed{1} then \boxed{2}", "2"),  # the last one
        (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{1}{\sqrt{2}}"),  # nested braces
        (r"$\boxed{x^{2}+\{1\}}$ done", r"x^{2}+\{1\}"),
        (r"\fbox{7}", "7"),
        (r"the answer: \boxed 5$", "5"),
        (r"\boxed{3} and a broken \boxed{4", "3"),  # an unbalanced last box falls back to the earlier one
        ("no box here, just 12", None),
    ],
)
def test_extract_boxed(text, expected):
    assert g.extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("47 + 38 = 85.", "85"),
        ("It costs $1,234.50 in total", "1234.50"),
        ("down to -7", "-7"),
        ("no digits", None),
        ("first 3 then 10", "10"),
    ],
)
def test_extract_last_number(text, expected):
    assert g.extract_last_number(text) == expected


def test_extract_gsm8k_and_final_answer():
    sol = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 1,072"
    assert g.extract_gsm8k_answer(sol) == "1072"
    assert g.extract_gsm8k_answer("no marker 5") is None
    assert g.extract_gsm8k_answer("so #### 2.\nThe answer is: 2 apples") == "2"  # only the marked line
    # boxed first, then ####, then the last number; text before </think> is ignored
    assert g.extract_final_answer(r"maybe 3 \boxed{4} or 5") == "4"
    assert g.extract_final_answer("work 3\n#### 9") == "9"
    assert g.extract_final_answer("I get 11 apples") == "11"
    assert g.extract_final_answer(r"<think>\boxed{1}</think> final: 2") == "2"


@pytest.mark.parametrize(
    "given, gold, expected",
    [
        ("0.5", r"\frac{1}{2}", True),
        ("1/2", r"\dfrac{1}{2}", True),
        ("-3/4", r"-\frac{3}{4}", True),
        ("1,000", "1000", True),
        ("1,234.5", "1234.50", True),
        ("12.0", "12", True),
        (r"\text{(B)}", r"\text{(B)}", True),
        ("$5$.", "5", True),
        ("13", "12", False),
        ("0.25", "0.5", False),
    ],
)
def test_fast_match_decides(given, gold, expected):
    assert g.fast_match(given, gold) is expected


def test_fast_match_leaves_symbolic_answers_to_math_verify():
    assert g.fast_match(r"\frac{\sqrt{3}}{2}", r"\frac{\sqrt3}{2}") is None
    assert g.fast_match("0.333333", r"\frac13") is None  # decimal vs fraction: math-verify's rounding
    assert g.fast_match("3, 2", "2, 3") is None  # a list, not the number 32 (commas are not thousands here)
    assert g.grade("", "5") == g.Grade(False, "empty")
    assert g.grade(None, "5").correct is False


@pytest.fixture(scope="module")
def pool():
    p = g.GraderPool(max_workers=1, timeout_s=5)
    yield p
    p.close()


@pytest.mark.parametrize(
    "given, gold, expected",
    [
        (r"\frac{\sqrt3}{2}", r"\frac{\sqrt{3}}{2}", True),
        ("(x+1)^2", "x^2+2x+1", True),
        (r"\pi/2", r"\frac{\pi}{2}", True),
        ("3", r"\sqrt{9}", True),
        ("4", r"\sqrt{9}", False),
        (r"\{2,1\}", r"\{1,2\}", True),
        ("x=3", "3", True),
        (r"\frac{1}{3}", "0.5", False),
    ],
)
def test_math_verify_equivalences(pool, given, gold, expected):
    grade = g.grade(given, gold, pool)
    assert grade.method == "math_verify"
    assert grade.correct is expected


def test_grade_async_runs_math_verify_off_the_loop(pool):
    async def both():
        return await asyncio.gather(
            g.grade_async("0.5", r"\frac{1}{2}", pool), g.grade_async(r"2\sqrt{2}", r"\sqrt{8}", pool)
        )

    fast, slow = asyncio.run(both())
    assert fast == g.Grade(True, "fast")
    assert slow.correct and slow.method == "math_verify"


def test_hung_worker_is_killed_and_pool_recovers(pool):
    restarts = pool.restarts
    finished, value = pool.run(g._sleep_then, 60, "late", timeout_s=1.0)
    assert (finished, value) == (False, None)
    assert pool.restarts == restarts + 1 and pool.timeouts >= 1
    # the next call gets a fresh worker and a real verdict
    grade = g.grade(r"2\cdot 3", "6", pool)
    assert grade.correct and grade.method == "math_verify"


def test_math_verify_own_timeout_is_reported_incorrect():
    p = g.GraderPool(max_workers=1, timeout_s=1)
    try:
        grade = g.grade("2^{2^{2^{2^{2^{100}}}}}", "7", p)  # sympy tries to evaluate a power tower
        assert grade.correct is False and grade.timed_out and grade.method == "timeout"
        assert g.grade("x^2-1", "(x-1)(x+1)", p).correct  # the same pool still grades
    finally:
        p.close()


def test_crashed_worker_is_retried_once_then_reported_and_pool_recovers(pool):
    import os
    from concurrent.futures.process import BrokenProcessPool

    with pytest.raises(BrokenProcessPool, match="died twice"):
        pool.run(os._exit, 3)  # the worker process dies on every try
    assert g.grade("2+2", "4", pool).correct  # fast path: "2+2" is no number -> math-verify on a fresh pool
