"""A math problem, and the seeded RNG every draw of problems uses.

`seeded_rng(*parts)` hashes its parts into a seed, so a draw depends only on what it names
(the run seed, the batch index, an epoch): a resumed run gets the same problems.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

TEST_SHUFFLE_SEED = 0x7E57  # fixed: the eval set does not change with the run seed


@dataclass(frozen=True)
class Problem:
    """One question and its reference answer."""

    question: str
    answer: str  # the reference answer (a number for arithmetic, LaTeX/text for datasets)
    id: str = ""


def seeded_rng(*parts: int | str) -> random.Random:
    """A `random.Random` seeded by a hash of `parts`."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))
