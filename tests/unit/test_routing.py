"""The pure router and routing keys: stickiness, movement on joins and leaves, bounded load, tiers."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from common.gen import worker_pb2
from gateway.routing.decay import Decayed, DecayedShares
from gateway.routing.key import routing_key
from gateway.routing.router import Router, WorkerState, capped_owner, key_cap, load_bound, ranking

WORKERS = [f"127.0.0.{i}:50051" for i in range(1, 5)]
KEYS = [f"model\x1etenant-{i}" for i in range(4000)]


def idle(addrs: list[str]) -> list[WorkerState]:
    return [WorkerState(addr) for addr in addrs]


def owners(router: Router, addrs: list[str]) -> dict[str, str]:
    return {key: router.order(key, idle(addrs))[0] for key in KEYS}


def chat(model: str, *messages: tuple[str, str]) -> worker_pb2.GenerateRequest:
    chat = worker_pb2.ChatPrompt(messages=[worker_pb2.ChatMessage(role=r, content=c) for r, c in messages])
    return worker_pb2.GenerateRequest(model=model, chat=chat)


def test_the_same_key_goes_to_the_same_worker_and_keys_spread() -> None:
    router = Router("cache_aware")
    first = owners(router, WORKERS)
    assert owners(router, WORKERS) == first
    assert owners(router, list(reversed(WORKERS))) == first, "the order of the list does not matter"
    shares = Counter(first.values())
    assert set(shares) == set(WORKERS)
    assert all(0.2 < n / len(KEYS) < 0.3 for n in shares.values()), shares


def test_a_join_moves_about_one_in_n_keys_all_to_the_newcomer() -> None:
    router = Router("cache_aware")
    before = owners(router, WORKERS)
    after = owners(router, [*WORKERS, "127.0.0.9:50051"])
    moved = [key for key in KEYS if before[key] != after[key]]
    assert all(after[key] == "127.0.0.9:50051" for key in moved)
    assert 0.15 < len(moved) / len(KEYS) < 0.25, len(moved) / len(KEYS)  # 1/5 expected


def test_a_leave_moves_only_the_leavers_keys() -> None:
    router = Router("cache_aware")
    before = owners(router, WORKERS)
    after = owners(router, WORKERS[1:])
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved == {key for key in KEYS if before[key] == WORKERS[0]}
    assert 0.2 < len(moved) / len(KEYS) < 0.3


def test_an_owner_at_its_bound_passes_the_key_to_its_next_ranked_worker() -> None:
    router = Router("cache_aware", balance=1.25)
    key = KEYS[0]
    owner, second, *_ = ranking(key, WORKERS)
    loads = {addr: 1 for addr in WORKERS} | {owner: 3}  # bound: ceil(1.25 x 7 / 4) = 3, owner is full
    workers = [WorkerState(addr, loads[addr]) for addr in WORKERS]
    assert load_bound(list(loads.values()), 1.25) == 3
    order = router.order(key, workers)
    assert order[0] == second and order[-1] == owner
    loads[owner] = 1  # bound ceil(1.25 x 5 / 4) = 2: room again, the owner takes it back
    assert router.order(key, [WorkerState(a, loads[a]) for a in WORKERS])[0] == owner


def test_slack_keeps_a_key_on_its_owner_until_it_is_that_far_above_the_least_loaded() -> None:
    """Four idle workers but the owner: the relative bound (ceil(1.25 x 3 / 4) = 1) alone sends the key's
    second request away; with slack 3 the owner holds up to 3 (counting the new one) while the others hold
    none, and the key spills once it would be past that too."""
    key = KEYS[3]
    owner, second, *_ = ranking(key, WORKERS)
    assert load_bound([2, 0, 0, 0], 1.25) == 1 and load_bound([2, 0, 0, 0], 1.25, slack=3) == 3
    assert load_bound([8, 8, 8, 8], 1.25, slack=3) == 11, "the relative bound when it is the larger"

    def loads(owner_load: int) -> list[WorkerState]:
        return [WorkerState(a, owner_load if a == owner else 0) for a in WORKERS]

    plain, slack = Router("cache_aware", 1.25), Router("cache_aware", 1.25, slack=3)
    assert plain.order(key, loads(1))[0] == second
    assert slack.order(key, loads(1))[0] == owner
    assert slack.order(key, loads(2))[0] == owner
    assert slack.order(key, loads(3))[0] == second, "past the slack too: the key spills to its next worker"
    with pytest.raises(ValueError, match="slack"):
        Router("cache_aware", 1.25, slack=-1)


def test_a_hot_key_gets_the_relative_bound_alone() -> None:
    """Two calls of the key already open: the owner holding them spills the third, though the slack would
    have let it hold more; a key without open calls stays on the same owner. A hot key takes whichever of
    its two top-ranked workers looked up fewer prompt tokens lately (the owner on a tie), whatever the
    request counts within the bound."""
    key = KEYS[5]
    owner, second, *_ = ranking(key, WORKERS)
    workers = [WorkerState(a, 2 if a == owner else 0) for a in WORKERS]
    router = Router("cache_aware", 1.25, slack=4, hot_key_requests=2)
    assert router.order(key, workers, key_in_flight=0)[0] == owner
    assert router.order(key, workers, key_in_flight=1)[0] == owner
    assert router.order(key, workers, key_in_flight=2)[0] == second
    never_hot = Router("cache_aware", 1.25, slack=4, hot_key_requests=0)
    assert never_hot.order(key, workers, key_in_flight=9)[0] == owner

    def hot(owner_tokens: float, second_tokens: float) -> str:  # loads all 5, within the relative bound
        tokens = {owner: owner_tokens, second: second_tokens}
        states = [WorkerState(a, 5, 0, tokens.get(a, 0.0)) for a in WORKERS]
        return router.order(key, states, key_in_flight=2)[0]

    assert hot(500, 500) == owner and hot(400, 500) == owner and hot(500, 400) == second
    assert hot(500, 499) == second, "the other two workers (0 tokens) are not the hot key's"


def test_a_key_with_a_large_share_is_spread_over_as_many_workers_as_its_share_needs() -> None:
    """hot_share 0.75 over 4 workers: a key is hot from 0.75 / 4 = 18.75% of the requests; it then gets
    ceil(share x 4 / 0.75) of its top-ranked workers (at least 2), and each request goes to the one of
    those with the fewest recent tokens. Below the threshold the key keeps its owner."""
    router = Router("cache_aware", 1.25, slack=4, hot_key_requests=0, hot_share=0.75)
    shares = (0.0, 0.18, 0.19, 0.375, 0.38, 0.5, 0.6, 1.0)
    assert [router.replicas(4, key_share=s) for s in shares] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert router.replicas(2, key_share=0.5) == 2 and router.replicas(1, key_share=1.0) == 1
    assert router.replicas(4, key_in_flight=9, key_share=0.0) == 1, "hot_key_requests 0: calls never count"
    assert Router("cache_aware", hot_key_requests=2).replicas(4, key_in_flight=2) == 2
    assert Router("cache_aware").replicas(4, key_share=1.0) == 1, "hot_share 0: off"
    key = KEYS[7]
    ranked = ranking(key, WORKERS)
    fewest_last = {addr: 100.0 * (4 - i) for i, addr in enumerate(ranked)}  # the owner has the most
    states = [WorkerState(a, 0, 0, fewest_last[a]) for a in WORKERS]
    assert router.order(key, states, key_share=0.1)[0] == ranked[0], "not hot: its owner"
    assert router.order(key, states, key_share=0.3)[0] == ranked[1], "2 workers: the second has fewer"
    assert router.order(key, states, key_share=0.5)[0] == ranked[2], "3 workers"
    assert router.order(key, states, key_share=0.9)[0] == ranked[3], "4 workers"
    with pytest.raises(ValueError, match="hot_share"):
        Router("cache_aware", hot_share=1.5)


def test_a_hot_tenant_fills_the_workers_the_others_leave_short() -> None:
    """One tenant sends half the requests, eleven others the rest, keyed onto 4 workers: with the share
    rule every worker's tokens stay within 1.5x of the mean and each cold tenant keeps one worker; without
    it the hot tenant's owner takes more than 1.5x. (Counts stand in for the workers' token reports.)"""
    rng = random.Random(11)

    def run(router: Router) -> tuple[float, dict[str, set[str]]]:
        now = [0.0]
        shares = DecayedShares(30.0, clock=lambda: now[0])
        tokens = {a: Decayed(30.0, clock=lambda: now[0]) for a in WORKERS}
        total: Counter[str] = Counter()
        placed: dict[str, set[str]] = {}
        for i in range(400):
            now[0] = i * 0.5
            key = "hot" if rng.random() < 0.5 else f"cold-{rng.randrange(11)}"
            shares.add(key)
            states = [WorkerState(a, 0, 0, tokens[a].value()) for a in WORKERS]
            addr = router.order(key, states, 0, shares.share(key, at_least=16))[0]
            tokens[addr].add(300)
            total[addr] += 300
            placed.setdefault(key, set()).add(addr)
        return max(total.values()) / (sum(total.values()) / len(WORKERS)), placed

    spread, placed = run(Router("cache_aware", 1.25, slack=4, hot_share=0.75))
    assert spread <= 1.5, spread
    assert len(placed["hot"]) >= 3 and all(len(v) == 1 for k, v in placed.items() if k != "hot"), placed
    assert run(Router("cache_aware", 1.25, slack=4))[0] > 1.5


def test_the_slack_settings_reach_the_router(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.settings import GatewaySettings

    monkeypatch.setenv("GATEWAY_ROUTING_SLACK", "5")
    monkeypatch.setenv("GATEWAY_ROUTING_HOT_KEY_REQUESTS", "3")
    monkeypatch.setenv("GATEWAY_ROUTING_HOT_SHARE", "0.5")
    monkeypatch.setenv("GATEWAY_ROUTING_HALF_LIFE_S", "12")
    monkeypatch.setenv("GATEWAY_ROUTING_KEY_BALANCE", "0")
    config = GatewaySettings().routing_config()
    assert (config.slack, config.hot_key_requests, config.hot_share, config.half_life_s) == (5, 3, 0.5, 12.0)
    assert config.key_balance == 0.0
    monkeypatch.setenv("GATEWAY_ROUTING_KEY_BALANCE", "0.5")
    with pytest.raises(ValueError, match="GATEWAY_ROUTING_KEY_BALANCE"):
        GatewaySettings()  # refused at start, not when the router is built
    monkeypatch.setenv("GATEWAY_ROUTING_KEY_BALANCE", "1")
    monkeypatch.setenv("GATEWAY_ROUTING_SLACK", "-1")
    with pytest.raises(ValueError):
        GatewaySettings()


def test_bounded_load_under_a_skewed_mix() -> None:
    """Half the requests from one tenant, each held for a while: no worker goes past the bound, and the
    hot tenant spills only onto some workers (its ranking), not onto all at once."""
    router = Router("cache_aware", balance=1.25)
    rng = random.Random(0)
    load = dict.fromkeys(WORKERS, 0)
    ends: list[tuple[int, str]] = []  # (step it finishes, worker)
    hot_workers: Counter[str] = Counter()
    for step in range(2000):
        for end, addr in [e for e in ends if e[0] <= step]:
            ends.remove((end, addr))
            load[addr] -= 1
        key = KEYS[0] if rng.random() < 0.5 else rng.choice(KEYS[1:64])
        bound = load_bound(list(load.values()), router.balance)
        chosen = router.order(key, [WorkerState(addr, load[addr]) for addr in WORKERS])[0]
        assert load[chosen] + 1 <= bound, (load, chosen, bound)
        load[chosen] += 1
        ends.append((step + rng.randint(4, 12), chosen))
        if key == KEYS[0]:
            hot_workers[chosen] += 1
    assert hot_workers.most_common(1)[0][0] == ranking(KEYS[0], WORKERS)[0]
    assert len(hot_workers) > 1, "the hot tenant spilled past its owner"


def test_tiers_draining_and_stale_workers_come_last_in_that_order() -> None:
    router = Router("cache_aware")
    key = KEYS[7]
    owner = ranking(key, WORKERS)[0]
    others = [a for a in WORKERS if a != owner]
    workers = [WorkerState(owner, tier=1), WorkerState(others[0], tier=2)]
    workers += [WorkerState(a) for a in others[1:]]
    order = router.order(key, workers)
    assert set(order[:2]) == set(others[1:]) and order[2:] == [owner, others[0]]


def test_two_routers_with_the_same_membership_and_load_choose_alike() -> None:
    a, b = Router("cache_aware"), Router("cache_aware")
    rng = random.Random(1)
    for key in KEYS[:500]:
        workers = [WorkerState(addr, rng.randint(0, 6), rng.choice((0, 0, 0, 1))) for addr in WORKERS]
        assert a.order(key, workers) == b.order(key, list(reversed(workers)))


def test_round_robin_rotates_over_the_tier_zero_workers() -> None:
    router = Router("round_robin")
    firsts = [router.order("same key", idle(WORKERS))[0] for _ in range(8)]
    assert Counter(firsts) == Counter({addr: 2 for addr in WORKERS})


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="round_robin, cache_aware"):
        Router("random")  # type: ignore[arg-type]


def test_the_key_follows_the_leading_content_not_the_last_turn() -> None:
    system = ("system", "You are the billing assistant of tenant 7. " * 40)
    one = chat("m", system, ("user", "How do I pay?"))
    two = chat("m", system, ("user", "Where is my invoice?"), ("assistant", "Here."), ("user", "Thanks"))
    assert routing_key(one) == routing_key(two)
    other_tenant = chat("m", ("system", "You are the support assistant of tenant 8. " * 40), ("user", "Hi"))
    assert routing_key(one) != routing_key(other_tenant)
    assert routing_key(chat("other-model", system, ("user", "x"))) != routing_key(one)


def test_short_prefixes_are_keyed_per_conversation_and_user_affinity_overrides() -> None:
    a = chat("m", ("system", "Be brief."), ("user", "What is 2+2?"))
    b = chat("m", ("system", "Be brief."), ("user", "Name a color."))
    assert routing_key(a) != routing_key(b)
    assert routing_key(a, user="alice") == routing_key(b, user="alice") != routing_key(a, user="bob")
    text = worker_pb2.GenerateRequest(model="m", text="x" * 5000 + "tail one")
    assert routing_key(text) == routing_key(worker_pb2.GenerateRequest(model="m", text="x" * 5000 + "two"))
    ids = worker_pb2.GenerateRequest(model="m", token_ids=worker_pb2.TokenIds(ids=list(range(300))))
    assert routing_key(ids) == routing_key(
        worker_pb2.GenerateRequest(model="m", token_ids=worker_pb2.TokenIds(ids=[*range(256), 9]))
    )


def crowded_keys(addrs: list[str], count: int = 12, crowd: int = 6) -> list[str]:
    """`count` keys of which `crowd` or more rank the same worker first (as a fifth of 12-key sets do)."""
    for start in range(0, 100_000, count):
        keys = [f"model\x1etenant-{start + i}" for i in range(count)]
        if max(Counter(ranking(k, addrs)[0] for k in keys).values()) >= crowd:
            return keys
    raise AssertionError("no crowded key set found")


def test_a_worker_owns_at_most_its_cap_of_the_recent_keys_and_only_the_excess_moves() -> None:
    assert key_cap(12, 4, 1.25) == 4, "one over the mean of 3 (1.25 x 3 is less)"
    assert key_cap(100, 4, 1.25) == 32 and key_cap(2, 4, 1.25) == 2
    assert key_cap(12, 2, 1.0) == 6 and key_cap(13, 2, 1.0) == 7, "1.0: an even split, nothing over"
    keys = crowded_keys(WORKERS)
    plain = {k: ranking(k, WORKERS)[0] for k in keys}
    capped = {k: capped_owner(k, WORKERS, keys, 1.25) for k in keys}
    assert max(Counter(plain.values()).values()) >= 6
    assert max(Counter(capped.values()).values()) <= 4
    crowded = {a for a, n in Counter(plain.values()).items() if n > 4}
    assert all(capped[k] == plain[k] for k in keys if plain[k] not in crowded), "others keep their owner"
    moved = [k for k in keys if capped[k] != plain[k]]
    assert len(moved) == sum(n - 4 for n in Counter(plain.values()).values() if n > 4)
    shuffled = list(reversed(keys))
    assert {k: capped_owner(k, list(reversed(WORKERS)), shuffled, 1.25) for k in keys} == capped, (
        "the same owners whatever order the keys and workers come in (two gateways agree)"
    )
    one_more = [*keys, "model\x1ea newcomer"]
    again = {k: capped_owner(k, WORKERS, one_more, 1.25) for k in keys}
    assert sum(again[k] != capped[k] for k in keys) <= 2, "a new key moves few others"


def test_the_router_sends_a_key_to_its_capped_owner_and_keeps_hot_keys_out_of_the_count() -> None:
    keys = crowded_keys(WORKERS)
    plain = {k: ranking(k, WORKERS)[0] for k in keys}
    capped = {k: capped_owner(k, WORKERS, keys, 1.25) for k in keys}
    moved = next(k for k in keys if capped[k] != plain[k])
    recent = dict.fromkeys(keys, 1 / len(keys))
    router = Router("cache_aware", 1.25, slack=4, hot_share=0.75, key_balance=1.25)
    assert router.order(moved, idle(WORKERS), recent=recent)[0] == capped[moved]
    unbounded = Router("cache_aware", 1.25, slack=4, hot_share=0.75, key_balance=0)
    assert unbounded.order(moved, idle(WORKERS), recent=recent)[0] == plain[moved]
    assert router.order(moved, idle(WORKERS))[0] == plain[moved], "no recent keys known: the ring alone"
    # the same keys but one tenant sends most requests: it is hot, spread by shares, and not counted, so
    # the cap is over 11 keys
    hot = next(k for k in keys if k != moved)
    skewed = dict.fromkeys(keys, 0.5 / (len(keys) - 1)) | {hot: 0.5}
    cold = [k for k in keys if k != hot]
    assert router.order(moved, idle(WORKERS), recent=skewed)[0] == capped_owner(moved, WORKERS, cold, 1.25)
    with pytest.raises(ValueError, match="key_balance"):
        Router("cache_aware", key_balance=0.5)


def test_a_key_newer_than_the_recent_keys_goes_to_its_best_worker_below_the_cap() -> None:
    """The recent keys come as a mapping refreshed now and then; between refreshes a new key is not in it,
    and takes its highest-ranked worker that owns fewer keys than the cap over the recent keys and itself
    (a full owner passes it on); the recent keys keep their assigned owners."""
    pair = WORKERS[:2]
    mine = [k for k in KEYS if ranking(k, pair)[0] == pair[0]]
    recent = dict.fromkeys(mine[:3], 0.1)  # cap over 3 keys: 3, all three on pair[0]
    router = Router("cache_aware", 1.25, slack=4, key_balance=1.25)
    assert key_cap(4, 2, 1.25) == 3, "a fourth key: still 3, so pair[0] is full"
    assert router.order(mine[3], idle(pair), recent=recent)[0] == pair[1]
    theirs = next(k for k in KEYS if ranking(k, pair)[0] == pair[1])
    assert router.order(theirs, idle(pair), recent=recent)[0] == pair[1]
    assert all(router.order(k, idle(pair), recent=recent)[0] == pair[0] for k in mine[:3])
    keys = crowded_keys(WORKERS)
    crowded = dict.fromkeys(keys, 1 / len(keys))
    owners = {k: capped_owner(k, WORKERS, keys, 1.25) for k in keys}
    four = Router("cache_aware", 1.25, slack=4, hot_share=0.75, key_balance=1.25)
    assert all(four.order(k, idle(WORKERS), recent=crowded)[0] == owners[k] for k in keys)


def test_keys_placed_since_the_refresh_count_toward_the_cap() -> None:
    """The recent keys were taken while only pair[0]'s three tenants had come (it owns all of them); three
    tenants of pair[1] arrive before the next refresh, then a fourth of pair[0]'s: seven keys, cap 5, so it
    goes to pair[0]. Judged on the mapping alone (four keys, cap 3), pair[0] would look full and lose it:
    a flake of the two-worker scale-out test, where one tenant's first request went to the other worker."""
    pair = WORKERS[:2]
    mine = [k for k in KEYS if ranking(k, pair)[0] == pair[0]][:4]
    theirs = [k for k in KEYS if ranking(k, pair)[0] == pair[1]][:3]
    router = Router("cache_aware", 1.25, slack=4, key_balance=1.25)
    recent = dict.fromkeys(mine[:3], 0.1)
    assert [router.order(k, idle(pair), recent=recent)[0] for k in theirs] == [pair[1]] * 3
    assert key_cap(7, 2, 1.25) == 5
    assert router.order(mine[3], idle(pair), recent=recent)[0] == pair[0]
    assert router.order(theirs[0], idle(pair), recent=recent)[0] == pair[1], "a placed key keeps its owner"
    refreshed = dict.fromkeys([*mine, *theirs], 0.1)
    assert all(router.order(k, idle(pair), recent=refreshed)[0] == ranking(k, pair)[0] for k in mine + theirs)


def test_a_new_key_counts_itself_in_the_cap() -> None:
    """Two workers, two recent keys both owned by the same worker (the cap over two keys is 2): a third key
    of that worker arriving before the next refresh makes three keys, cap 3, so it stays there too."""
    pair = WORKERS[:2]
    keys = [k for k in KEYS if ranking(k, pair)[0] == pair[0]][:3]
    router = Router("cache_aware", 1.25, slack=4, key_balance=1.25)
    recent = dict.fromkeys(keys[:2], 0.1)
    assert key_cap(2, 2, 1.25) == 2 and key_cap(3, 2, 1.25) == 3
    assert router.order(keys[2], idle(pair), recent=recent)[0] == pair[0]
