"""Pure routing: an order of workers to try for one request, from its key and the workers' load.

cache_aware: rendezvous (highest random weight) hashing ranks the workers for a key, so the same leading
content lands on the same worker, whose prefix cache already holds it; a join takes ~1/N of the keys and
a leave moves only the leaver's. Bounded load: a worker is passed over while its load is at its bound,
and the key goes to the next worker in its ranking, so a hot key spills onto a stable second worker
instead of swamping its owner. The bound is the larger of a relative one, ceil(balance x (total load + 1)
/ workers), and an absolute one, the least-loaded worker's load plus `slack` (as SGLang's router only
balances when both a relative and an absolute imbalance threshold are passed): at a few requests per
worker the relative bound alone spills after one or two, and a spill costs a full prefill on a cold worker
plus another tenant's prompt evicted there, about what queueing behind a few cached requests costs.
A hot key (`hot_key_requests` calls of it open already, or `hot_share` of a worker's fair share of the
recent requests) gets no slack and is spread over as many of its top-ranked workers as its share needs,
each request to the one that looked up the fewest prompt tokens lately: all stay warm for it, and it fills
whichever of them the other keys leave short, while holding it on one worker would let one tenant take
that worker's whole share.
Few keys hash unevenly (12 keys over 4 workers: one worker owns 6 or more about one time in five, more
prompts than its KV cache may hold), so a key's owner is also bounded in keys (`key_balance`): over the
keys seen lately, taken in a fixed order, each goes to its highest-ranked worker owning fewer than
max(key_balance x keys / workers, keys / workers + 1); only the keys past a full worker move.
Nothing here holds state across calls but the round-robin turn and the keys placed since the recent keys
were last taken, so two gateways with the same membership and load that saw the same keys choose alike.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
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
    recent_tokens: float = 0.0  # prompt tokens it looked up lately (fading), as it reports them


def score(key: str, addr: str) -> int:
    """The rendezvous weight of `addr` for `key`: stable across processes and Python versions."""
    digest = hashlib.blake2b(f"{key}\x00{addr}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ranking(key: str, addrs: Sequence[str]) -> list[str]:
    """Every address, the key's owner first (ties, practically impossible, broken by address)."""
    return sorted(addrs, key=lambda addr: (-score(key, addr), addr))


@functools.lru_cache(maxsize=1 << 16)
def _ranking(key: str, addrs: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(ranking(key, addrs))


@functools.lru_cache(maxsize=1 << 16)
def _place(key: str) -> tuple[int, str]:
    """A key's place in the fixed order in which keys take their owners (any order two gateways share)."""
    return score(key, ""), key


def key_cap(keys: int, workers: int, key_balance: float) -> int:
    """The most keys one worker owns: key_balance over the mean, and always at least one over it; at a
    key_balance of exactly 1.0, an even split (rounded up) and nothing over it."""
    if key_balance == 1.0:
        return math.ceil(keys / workers)
    return math.ceil(max(key_balance * keys / workers, keys / workers + 1))


def assign(
    keys: Iterable[str], addrs: Sequence[str], key_balance: float
) -> tuple[dict[str, str], dict[str, int], int]:
    """Every key's owner once each worker owns at most key_cap(...) of them: the keys in a fixed order, each
    to its highest-ranked worker with room. Also how many each worker owns, and the cap."""
    ordered = sorted(set(keys), key=_place)
    ring = tuple(sorted(addrs))
    cap = key_cap(len(ordered), len(ring), key_balance)
    owned = dict.fromkeys(ring, 0)
    owners = {}
    for k in ordered:
        owners[k] = next(addr for addr in _ranking(k, ring) if owned[addr] < cap)
        owned[owners[k]] += 1
    return owners, owned, cap


def capped_owner(key: str, addrs: Sequence[str], recent: Iterable[str], key_balance: float) -> str:
    """The worker owning `key` under the bound on keys, over the `recent` keys and `key`."""
    return assign([*recent, key], addrs, key_balance)[0][key]


def load_bound(loads: Sequence[int], balance: float, slack: int = 0) -> int:
    """The most requests one worker may hold before new keys pass it over (counting the new one): the
    relative bound, or the least-loaded worker's load plus the absolute slack when that is more."""
    if not loads:
        return 0
    relative = math.ceil(balance * (sum(loads) + 1) / len(loads))
    return max(1, relative, min(loads) + slack)


class Router:
    def __init__(
        self,
        policy: Policy = "cache_aware",
        balance: float = 1.25,
        slack: int = 0,
        hot_key_requests: int = 0,
        hot_share: float = 0.0,
        key_balance: float = 0.0,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; one of {', '.join(POLICIES)}")
        if balance < 1.0:
            raise ValueError("balance must be at least 1.0")
        if slack < 0:
            raise ValueError("slack must be at least 0")
        self.policy = policy
        self.balance = balance
        self.slack = slack
        self.hot_key_requests = hot_key_requests
        if not 0.0 <= hot_share <= 1.0:
            raise ValueError("hot_share must be between 0 and 1")
        self.hot_share = hot_share
        if key_balance != 0.0 and key_balance < 1.0:
            raise ValueError("key_balance must be 0 (off) or at least 1.0")
        self.key_balance = key_balance
        # the last assignment under the bound on keys: for the same `recent` mapping and workers, reused
        self._assigned: (
            tuple[Mapping[str, float], tuple[str, ...], dict[str, str], dict[str, int], int] | None
        )
        self._assigned = None
        self._turn = itertools.count()

    def order(
        self,
        key: str,
        workers: Sequence[WorkerState],
        key_in_flight: int = 0,
        key_share: float = 0.0,
        recent: Mapping[str, float] | None = None,
    ) -> list[str]:
        """The addresses to try in turn: tier 0 by policy, then tier 1, then tier 2 (each by ranking).
        `key_in_flight`: calls of this key open now; `key_share`: its share of the recent requests (either
        can make it hot); `recent`: the keys seen lately and their shares, for the bound on keys."""
        tiers = [[w for w in workers if w.tier == tier] for tier in (0, 1, 2)]
        if self.policy == "round_robin":
            first = self._round_robin(tiers[0])
        else:
            replicas = self.replicas(len(tiers[0]), key_in_flight, key_share)
            owner = None
            if replicas == 1 and self.key_balance and recent is not None and len(tiers[0]) > 1:
                owner = self._capped_owner(key, tuple(sorted(w.addr for w in tiers[0])), recent)
            first = self._bounded(key, tiers[0], replicas, owner)
        rest = [ranking(key, [w.addr for w in tier]) for tier in tiers[1:]]
        return first + rest[0] + rest[1]

    def _round_robin(self, workers: Sequence[WorkerState]) -> list[str]:
        addrs = sorted(w.addr for w in workers)
        if not addrs:
            return []
        start = next(self._turn) % len(addrs)
        return addrs[start:] + addrs[:start]

    def replicas(self, workers: int, key_in_flight: int = 0, key_share: float = 0.0) -> int:
        """How many top-ranked workers serve a key: 1, or for a hot key at least 2 and enough that each
        gets at most `hot_share` of a worker's fair share from it (a tenant sending half the requests
        to 4 workers, hot_share 0.75: ceil(0.5 x 4 / 0.75) = 3)."""
        by_share = self.hot_share > 0 and key_share * workers >= self.hot_share
        by_calls = self.hot_key_requests > 0 and key_in_flight >= self.hot_key_requests
        if not (by_share or by_calls):
            return 1
        wanted = math.ceil(key_share * workers / self.hot_share) if by_share else 2
        return min(workers, max(2, wanted))

    def _capped_owner(self, key: str, ring: tuple[str, ...], recent: Mapping[str, float]) -> str:
        """The key's owner under the bound on keys. The assignment of the cold `recent` keys is computed
        once per `recent` mapping (a caller refreshes it now and then, so a request costs a lookup); a key
        it does not hold yet goes to its highest-ranked worker below the cap, counting that key, and is
        counted there until the next refresh: otherwise the keys placed since the refresh are missing from
        the counts, and a mapping that happened to hold one worker's keys only (a burst of new tenants)
        keeps passing that worker's next keys on as if it were full."""
        cached = self._assigned
        if cached is None or cached[0] is not recent or cached[1] != ring:
            cold = [k for k, share in recent.items() if self.replicas(len(ring), 0, share) == 1]
            cached = self._assigned = (recent, ring, *assign(cold, ring, self.key_balance))
        _, _, owners, owned, _ = cached
        if key in owners:
            return owners[key]
        cap = key_cap(len(owners) + 1, len(ring), self.key_balance)  # the new key counted
        ranked = _ranking(key, ring)
        owner = next((addr for addr in ranked if owned[addr] < cap), ranked[0])
        owners[key] = owner
        owned[owner] += 1
        return owner

    def _bounded(
        self, key: str, workers: Sequence[WorkerState], replicas: int = 1, owner: str | None = None
    ) -> list[str]:
        """The key's ranking, workers at their bound moved behind the rest (least loaded first). A hot key
        (`replicas` > 1) gets no slack, and its top-ranked `replicas` workers are taken fewest recent
        tokens first: it fills whichever of them the other keys leave short, and all stay warm for it."""
        load = {w.addr: w.load for w in workers}
        bound = load_bound(list(load.values()), self.balance, 0 if replicas > 1 else self.slack)
        ranked = ranking(key, list(load))
        if owner is not None:  # the key's owner under the bound on keys
            ranked.remove(owner)
            ranked.insert(0, owner)
        if replicas > 1:
            tokens = {w.addr: w.recent_tokens for w in workers}
            ranked = sorted(ranked[:replicas], key=lambda addr: tokens[addr]) + ranked[replicas:]
        fits = [addr for addr in ranked if load[addr] + 1 <= bound]
        full = sorted((addr for addr in ranked if load[addr] + 1 > bound), key=lambda addr: load[addr])
        return fits + full
