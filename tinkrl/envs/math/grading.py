"""Math answer grading: extract the final answer from a response and decide if it equals the reference.

Extraction:
- `extract_boxed(text)`: the content of the LAST `\\boxed{...}` (or `\\fbox{...}`), nested braces
  balanced; also the brace-less form `\\boxed 5`.
- `extract_last_number(text)`: the last number (thousands commas removed, e.g. "1,234" -> "1234").
- `extract_gsm8k_answer(text)`: the line after the last `####` (GSM8K's reference-answer format).
- `extract_final_answer(text)`: boxed content, else the `####` answer, else the last number.

Equivalence (`grade` / `grade_async`): a fast path first (normalised string match, then exact
numeric match of integers, decimals, fractions `a/b` and `\\frac{a}{b}`; two different plain
decimals are a definite mismatch); when the fast path cannot decide, math-verify (`parse` +
`verify(gold, target)`, gold first, as documented) runs in a worker process with a per-call
timeout. math-verify's own timeout uses SIGALRM, which only works on a process's main thread,
so it runs in a `ProcessPoolExecutor` worker (where it does run on the main thread, as a first
line of defence) and the caller additionally waits at most `timeout_s` + a margin; a worker
that does not answer in time is killed and the pool recreated, so one pathological answer
cannot hang training. A timed-out grade is incorrect and says so (`Grade.timed_out`).
Workers are spawned (not forked from a threaded trainer), so a script that grades needs the
usual `if __name__ == "__main__":` guard; the pool starts lazily, on the first answer the fast
path cannot decide.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import multiprocessing
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------------
# Extraction
# ------------------------------------------------------------------------------------------------

_THOUSANDS_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")


def strip_think(text: str) -> str:
    """The part after a reasoning block (`<think>...</think>`), where the final answer lives."""
    return text.rsplit("</think>", 1)[1] if "</think>" in text else text


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} / \\fbox{...} (balanced braces), or of `\\boxed X`."""
    best: tuple[int, str] | None = None
    for cmd in ("\\boxed", "\\fbox"):
        start = text.rfind(cmd)
        while start != -1:
            after = start + len(cmd)
            if after < len(text) and text[after] == "{":
                depth = 0
                for j in range(after, len(text)):
                    if text[j] == "{":
                        depth += 1
                    elif text[j] == "}":
                        depth -= 1
                        if depth == 0:
                            content = text[after + 1 : j]
                            if best is None or start > best[0]:
                                best = (start, content)
                            break
                else:  # unbalanced: look at an earlier occurrence
                    start = text.rfind(cmd, 0, start)
                    continue
                break
            if after < len(text) and text[after] == " ":  # "\boxed 5"
                m = re.match(r"\s+([^\s$]+)", text[after:])
                if m and (best is None or start > best[0]):
                    best = (start, m.group(1))
                break
            start = text.rfind(cmd, 0, start)
    return best[1].strip() if best else None


def extract_last_number(text: str) -> str | None:
    """The last number in `text` (integer or decimal, thousands separators removed), as a string."""
    matches = _NUMBER_RE.findall(text)
    return matches[-1].replace(",", "") if matches else None


def extract_gsm8k_answer(text: str) -> str | None:
    """The rest of the line after the last `####`, commas removed (GSM8K solutions end `#### 42`)."""
    if "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].strip().split("\n", 1)[0]
    return tail.replace(",", "").strip().rstrip(".").strip() or None


def extract_final_answer(text: str) -> str | None:
    """The response's final answer: \\boxed{} content, else after `####`, else the last number."""
    text = strip_think(text)
    for extract in (extract_boxed, extract_gsm8k_answer):
        ans = extract(text)
        if ans:
            return ans
    return extract_last_number(text)


# ------------------------------------------------------------------------------------------------
# Fast path
# ------------------------------------------------------------------------------------------------

_TEXT_WRAP_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_FRAC_RE = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}$")
_SIMPLE_FRAC_RE = re.compile(r"^(-?)\\[dt]?frac(\d)(\d)$")


def normalize_answer(s: str) -> str:
    """Light, safe normalisation for string comparison (spacing, $, \\left/\\right, trailing '.')."""
    s = s.strip()
    s = _TEXT_WRAP_RE.sub(r"\1", s)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "$", "^\\circ", "^{\\circ}"):
        s = s.replace(token, "")
    s = s.replace("dfrac", "frac").replace("tfrac", "frac")
    s = re.sub(r"\s+", "", s)
    return s.rstrip(".")


def to_number(s: str) -> Fraction | None:
    """Exact value of an integer / decimal / a/b / \\frac{a}{b} string, else None.

    Commas count only as thousands separators ("1,234"); "2,3" is a list, not a number.
    """
    t = _strip_thousands(normalize_answer(s))
    if not t:
        return None
    try:
        if re.fullmatch(r"-?\d+(?:\.\d+)?|-?\.\d+", t):
            return Fraction(t)
        m = re.fullmatch(r"(-?\d+)/(-?\d+)", t)
        if m and int(m.group(2)) != 0:
            return Fraction(int(m.group(1)), int(m.group(2)))
        m = _FRAC_RE.match(t) or _SIMPLE_FRAC_RE.match(t)
        if m and int(m.group(3)) != 0:
            v = Fraction(int(m.group(2)), int(m.group(3)))
            return -v if m.group(1) else v
    except (ValueError, ZeroDivisionError):
        return None
    return None


def fast_match(given: str, gold: str) -> bool | None:
    """True/False when decidable cheaply (string or exact-number comparison), None otherwise."""
    if normalize_answer(given) == normalize_answer(gold):
        return True
    a, b = to_number(given), to_number(gold)
    if a is not None and b is not None:
        if a == b:
            return True
        if _is_decimal(given) and _is_decimal(gold):
            return False
        # A decimal vs a fraction (0.333333 vs \frac13): math-verify decides, with its rounding.
    return None


def _is_decimal(s: str) -> bool:
    return re.fullmatch(r"-?\d+(?:\.\d+)?|-?\.\d+", _strip_thousands(normalize_answer(s))) is not None


def _strip_thousands(t: str) -> str:
    return t.replace(",", "") if _THOUSANDS_RE.fullmatch(t) else t


# ------------------------------------------------------------------------------------------------
# math-verify in a process pool
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grade:
    """The grade of one answer: correct, which path decided it, whether it timed out, and a detail."""

    correct: bool
    method: str  # "empty" | "fast" | "math_verify" | "timeout" | "error"
    timed_out: bool = False
    detail: str = ""


def _worker_init() -> None:
    import math_verify  # noqa: F401  (pay the sympy/antlr import once per worker)

    logging.getLogger("math_verify").setLevel(logging.ERROR)


def _math_verify_worker(given: str, gold: str, timeout_s: int) -> tuple[str, str]:
    """Runs in a pool worker's main thread: ("true"|"false"|"timeout"|"error", detail)."""
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    def boxed(s: str) -> str:
        return s if "\\boxed" in s else "\\boxed{" + s + "}"

    try:
        gold_p = parse(boxed(gold), parsing_timeout=timeout_s, raise_on_error=True)
        given_p = parse(boxed(given), parsing_timeout=timeout_s, raise_on_error=True)
        if not gold_p or not given_p:
            return "false", "unparseable"
        ok = verify(gold_p, given_p, timeout_seconds=timeout_s, raise_on_error=True)
        return ("true" if ok else "false"), ""
    except TimeoutException:
        return "timeout", "math-verify's own timeout"
    except Exception as e:  # noqa: BLE001  (sympy raises all sorts; a crash is a wrong answer)
        return "error", f"{type(e).__name__}: {str(e)[:200]}"


def _sleep_then(seconds: float, value: Any) -> Any:
    """A deliberately slow task (tests use it to prove a hung worker is killed)."""
    import time

    time.sleep(seconds)
    return value


class GraderPool:
    """A process pool for math-verify calls with a hard per-call timeout and self-healing.

    At most `max_workers` calls are in flight at once (others wait for a slot before their
    timeout starts), so a call's timeout measures its own run time, not queueing.
    """

    def __init__(self, max_workers: int = 2, timeout_s: float = 10.0, kill_margin_s: float = 2.0):
        self.max_workers = max(1, max_workers)
        self.timeout_s = timeout_s
        self.kill_margin_s = kill_margin_s
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.max_workers)
        self._pool: cf.ProcessPoolExecutor | None = None
        self._generation = 0
        self.restarts = 0
        self.timeouts = 0
        # Threads that wait on the processes (so async callers never block their loop).
        self._waiters = cf.ThreadPoolExecutor(
            max_workers=max(4, 4 * self.max_workers), thread_name_prefix="tinkrl-grade"
        )

    def _get_pool(self) -> tuple[cf.ProcessPoolExecutor, int]:
        with self._lock:
            if self._pool is None:
                ctx = multiprocessing.get_context("spawn")  # no fork of a threaded (torch) parent
                pool = cf.ProcessPoolExecutor(self.max_workers, mp_context=ctx, initializer=_worker_init)
                # Start every worker and import math-verify before any timed call.
                warm = [pool.submit(_sleep_then, 0.2, None) for _ in range(self.max_workers)]
                cf.wait(warm, timeout=120)
                self._pool = pool
            return self._pool, self._generation

    def _kill(self, generation: int) -> None:
        with self._lock:
            if self._pool is None or generation != self._generation:
                return  # someone else already recreated it
            pool, self._pool = self._pool, None
            self._generation += 1
            self.restarts += 1
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> tuple[bool, Any]:
        """(finished, result) of fn(*args) in a worker; (False, None) when it ran out of time.

        Raises BrokenProcessPool when the worker died twice (e.g. a crash in native code).
        """
        limit = self.timeout_s + self.kill_margin_s if timeout_s is None else timeout_s
        with self._slots:
            for attempt in range(2):
                pool, gen = self._get_pool()
                try:
                    fut = pool.submit(fn, *args)
                except (BrokenProcessPool, RuntimeError):  # shut down by a concurrent kill
                    self._kill(gen)
                    continue
                try:
                    return True, fut.result(timeout=limit)
                except cf.TimeoutError:
                    self.timeouts += 1
                    log.warning("grader: a call ran over %.1fs; killing the worker pool", limit)
                    self._kill(gen)
                    return False, None
                except (BrokenProcessPool, cf.CancelledError):
                    # The pool died under this call (another call's kill, or this call crashed it).
                    self._kill(gen)
                    if attempt == 1:
                        raise BrokenProcessPool("the grader worker died twice on this call") from None
        raise BrokenProcessPool("could not submit to the grader pool")

    async def run_async(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> tuple[bool, Any]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._waiters, lambda: self.run(fn, *args, timeout_s=timeout_s))

    def math_verify(self, given: str, gold: str) -> Grade:
        try:
            finished, result = self.run(_math_verify_worker, given, gold, max(1, int(round(self.timeout_s))))
        except BrokenProcessPool as e:
            return Grade(False, "error", detail=str(e))
        return _to_grade(finished, result, self.timeout_s)

    async def math_verify_async(self, given: str, gold: str) -> Grade:
        try:
            finished, result = await self.run_async(
                _math_verify_worker, given, gold, max(1, int(round(self.timeout_s)))
            )
        except BrokenProcessPool as e:
            return Grade(False, "error", detail=str(e))
        return _to_grade(finished, result, self.timeout_s)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self._waiters.shutdown(wait=False)


def _to_grade(finished: bool, result: tuple[str, str] | None, timeout_s: float) -> Grade:
    if not finished or result is None:
        return Grade(False, "timeout", timed_out=True, detail=f"no verdict within {timeout_s:g}s (worker killed)")
    status, detail = result
    if status == "timeout":
        return Grade(False, "timeout", timed_out=True, detail=detail)
    if status == "error":
        return Grade(False, "error", detail=detail)
    return Grade(status == "true", "math_verify", detail=detail)


_pools: dict[float, GraderPool] = {}
_pools_lock = threading.Lock()


def pool_for(timeout_s: float = 10.0) -> GraderPool:
    """The process-wide grader pool for a timeout (workers: $TINKRL_GRADER_WORKERS, default 2; lazy)."""
    with _pools_lock:
        if timeout_s not in _pools:
            _pools[timeout_s] = GraderPool(
                max_workers=int(os.environ.get("TINKRL_GRADER_WORKERS", "2")), timeout_s=timeout_s
            )
        return _pools[timeout_s]


def grade(given: str | None, gold: str, pool: GraderPool | None = None) -> Grade:
    """Is the extracted answer `given` equivalent to the reference `gold`? (blocking)"""
    if not given or not given.strip():
        return Grade(False, "empty")
    fast = fast_match(given, gold)
    if fast is not None:
        return Grade(fast, "fast")
    return (pool or pool_for()).math_verify(given, gold)


async def grade_async(given: str | None, gold: str, pool: GraderPool | None = None) -> Grade:
    """`grade` for async callers: the fast path inline, math-verify awaited without blocking the loop."""
    if not given or not given.strip():
        return Grade(False, "empty")
    fast = fast_match(given, gold)
    if fast is not None:
        return Grade(fast, "fast")
    return await (pool or pool_for()).math_verify_async(given, gold)
