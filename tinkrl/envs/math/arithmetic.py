"""Synthetic arithmetic problems (`a op b`) with a train/test split by a hash of the problem.

Problems are drawn from a seeded RNG per (seed, batch index), so a resumed run gets the
same batches. Each (a, op, b) is assigned to train or test by a hash of the problem itself
(`test_fraction` of the problem space is held out), so train and eval never share a problem.
"""

from __future__ import annotations

import hashlib
import random

from tinkrl.envs.math.problems import TEST_SHUFFLE_SEED, Problem, seeded_rng
from tinkrl.errors import ConfigError


class ArithmeticProblems:
    """Synthetic `a op b` problems; each problem's split is a hash of the problem itself."""

    def __init__(self, min_value: int, max_value: int, operations: list[str], test_fraction: float = 0.1):
        self.lo, self.hi, self.ops, self.test_fraction = min_value, max_value, operations, test_fraction

    def is_test(self, a: int, op: str, b: int) -> bool:
        h = hashlib.blake2b(f"{a}{op}{b}".encode(), digest_size=8).digest()
        return int.from_bytes(h, "little") / 2**64 < self.test_fraction

    def _draw(self, rng: random.Random) -> tuple[int, str, int, int]:
        op = rng.choice(self.ops)
        if op == "/":
            b = 0
            while b == 0:
                b = rng.randint(self.lo, self.hi)
            q = rng.randint(self.lo, self.hi)
            return b * q, op, b, q
        a, b = rng.randint(self.lo, self.hi), rng.randint(self.lo, self.hi)
        return a, op, b, (a + b if op == "+" else a - b if op == "-" else a * b)

    @staticmethod
    def problem(a: int, op: str, b: int, answer: int) -> Problem:
        sym = {"*": "*", "/": "/"}.get(op, op)
        return Problem(f"What is {a} {sym} {b}?", str(answer), id=f"{a}{op}{b}")

    def sample(self, rng: random.Random, test: bool) -> Problem:
        for _ in range(100_000):
            a, op, b, ans = self._draw(rng)
            if self.is_test(a, op, b) == test:
                return self.problem(a, op, b, ans)
        raise ConfigError(
            f"arithmetic: no {'test' if test else 'train'} problems in [{self.lo}, {self.hi}] "
            f"with operations {self.ops}; widen the range or change test_fraction"
        )

    def test_problems(self, n: int) -> list[Problem]:
        """n distinct held-out problems (fewer if the space has fewer); fixed for a given config."""
        rng = seeded_rng("arithmetic-test", TEST_SHUFFLE_SEED)
        seen: dict[str, Problem] = {}
        tries = 0
        while len(seen) < n and tries < 200 * max(n, 1):
            tries += 1
            a, op, b, ans = self._draw(rng)
            if self.is_test(a, op, b):
                p = self.problem(a, op, b, ans)
                seen.setdefault(p.id, p)
        return list(seen.values())
