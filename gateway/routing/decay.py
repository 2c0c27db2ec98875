"""Counts that fade: what was counted `half_life_s` ago weighs half. Routing uses them for the prompt tokens
a worker looked up lately (its load in tokens, from the counter it reports) and for each key's share of
the requests lately (how hot a key is), so a burst long past stops steering requests."""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class Decayed:
    """One fading count: `add` and `value` at times from `clock` (seconds, never going back)."""

    def __init__(self, half_life_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if half_life_s <= 0:
            raise ValueError("half_life_s must be positive")
        self.rate = math.log(2) / half_life_s
        self.clock = clock
        self._value = 0.0
        self._at = clock()

    def _fade(self, now: float) -> None:
        if now > self._at:
            self._value *= math.exp(-self.rate * (now - self._at))
            self._at = now

    def add(self, amount: float) -> None:
        self._fade(self.clock())
        self._value += amount

    def value(self) -> float:
        self._fade(self.clock())
        return self._value


class DecayedShares:
    """A fading count per name and over all names: each name's share of what was counted lately.
    Names whose count faded below `forget_below` are dropped, so the table holds only recent keys."""

    def __init__(
        self, half_life_s: float, clock: Callable[[], float] = time.monotonic, forget_below: float = 0.05
    ) -> None:
        self.half_life_s = half_life_s
        self.clock = clock
        self.forget_below = forget_below
        self.total = Decayed(half_life_s, clock)
        self._counts: dict[str, Decayed] = {}
        self._adds = 0

    def add(self, name: str, amount: float = 1.0) -> None:
        count = self._counts.get(name)
        if count is None:
            count = self._counts[name] = Decayed(self.half_life_s, self.clock)
        count.add(amount)
        self.total.add(amount)
        self._adds += 1
        if self._adds % 256 == 0:
            self._forget()

    def share(self, name: str, at_least: float = 0.0) -> float:
        """`name`'s part of the total, the total counted as at least `at_least` (so the first few counts,
        each a large part of a small total, do not look like a trend)."""
        count = self._counts.get(name)
        total = max(self.total.value(), at_least)
        return count.value() / total if count is not None and total > 0 else 0.0

    def recent(self, at_least: float = 0.0) -> dict[str, float]:
        """Every name counted lately (its count not faded below `forget_below`), with its share."""
        total = max(self.total.value(), at_least)
        counts = {name: count.value() for name, count in self._counts.items()}
        return {name: value / total for name, value in counts.items() if value >= self.forget_below}

    def __len__(self) -> int:
        return len(self._counts)

    def _forget(self) -> None:
        for name in [n for n, c in self._counts.items() if c.value() < self.forget_below]:
            del self._counts[name]
