"""Pure routing: an order of workers to try for one request, from its key and the workers' load.

cache_aware: rendezvous (highest random weight) hashing ranks the workers for a key, so the same leading
content lands on the same worker, whose prefix cache already holds it; a join takes ~1/N of the keys and
a leave moves only the leaver's. Bounded load: a worker is passed over while its load is at its bound,
ceil(balance x (total load + 1) / workers), and the key goes to the next worker in its ranking, so a hot
key spills onto a stable second worker instead of swamping its owner. Nothing here holds state across
calls but the round-robin turn, so two gateways with the same membership and load choose alike.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Policy = Literal["round_robin", "cache_aware"]
POLICIES: tuple[Policy, ...] = ("round_robin", "cache_aware")


@dataclass(frozen=True)
class WorkerState:
    """What routing knows of one worker: `tier` 0 takes new requests, 1 is tried only after every tier-0
    worker refused (no load report yet, draining, or refused a call just now), 2 only as a last resort
    (its load reports stopped: it may hang rather than refuse)."""

    addr: str
    load: int = 0  # requests running and waiting there
    tier: int = 0


def score(key: str, addr: str) -> int:
    """The rendezvous weight of `addr` for `key`: stable across processes and Python versions."""
    digest = hashlib.blake2b(f"{key}\x00{addr}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ranking(key: str, addrs: Sequence[str]) -> list[str]:
    """Every address, the key's owner first (ties, practically impossible, broken by address)."""
    return sorted(addrs, key=lambda addr: (-score(key, addr), addr))


def load_bound(loads: Sequence[int], balance: float) -> int:
    """The most requests one worker may hold before new keys pass it over (counting the new one)."""
    if not loads:
        return 0
    return max(1, math.ceil(balance * (sum(loads) + 1) / len(loads)))


class Router:
    def __init__(self, policy: Policy = "cache_aware", balance: float = 1.25) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; one of {', '.join(POLICIES)}")
        if balance < 1.0:
            raise ValueError("balance must be at least 1.0")
        self.policy = policy
        self.balance = balance
        self._turn = itertools.count()

    def order(self, key: str, workers: Sequence[WorkerState]) -> list[str]:
        """The addresses to try in turn: tier 0 by policy, then tier 1, then tier 2 (each by ranking)."""
        tiers = [[w for w in workers if w.tier == tier] for tier in (0, 1, 2)]
        first = self._round_robin(tiers[0]) if self.policy == "round_robin" else self._bounded(key, tiers[0])
        rest = [ranking(key, [w.addr for w in tier]) for tier in tiers[1:]]
        return first + rest[0] + rest[1]

    def _round_robin(self, workers: Sequence[WorkerState]) -> list[str]:
        addrs = sorted(w.addr for w in workers)
        if not addrs:
            return []
        start = next(self._turn) % len(addrs)
        return addrs[start:] + addrs[:start]

    def _bounded(self, key: str, workers: Sequence[WorkerState]) -> list[str]:
        """The key's ranking, workers at their bound moved behind the rest (least loaded first)."""
        load = {w.addr: w.load for w in workers}
        bound = load_bound(list(load.values()), self.balance)
        ranked = ranking(key, list(load))
        fits = [addr for addr in ranked if load[addr] + 1 <= bound]
        full = sorted((addr for addr in ranked if load[addr] + 1 > bound), key=lambda addr: load[addr])
        return fits + full
