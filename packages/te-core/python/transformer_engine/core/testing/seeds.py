"""The tests' random seed, the same rule in every package: a fresh seed per
test, printed (pytest shows a failed test's output), and TE_TEST_SEED=<seed>
replays it."""

from __future__ import annotations

import os
import random

SEED_ENV = "TE_TEST_SEED"


def draw_seed() -> int:
    """TE_TEST_SEED when set, else a fresh seed; printed either way."""
    value = os.environ.get(SEED_ENV)
    seed = int(value) if value else random.randrange(2**31)
    print(f"{SEED_ENV}={seed}")
    return seed
