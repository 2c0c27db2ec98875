"""Fading counts behind hot keys and workers' recent tokens, and a replica's tokens from its reports."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from common.gen import worker_pb2
from gateway.routing import metrics
from gateway.routing.decay import Decayed, DecayedShares
from gateway.routing.replica import WorkerReplica


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_count_halves_every_half_life() -> None:
    clock = Clock()
    count = Decayed(10.0, clock)
    count.add(8)
    assert count.value() == pytest.approx(8)
    clock.now += 10
    assert count.value() == pytest.approx(4)
    count.add(4)
    clock.now += 20
    assert count.value() == pytest.approx(2)
    with pytest.raises(ValueError):
        Decayed(0)


def test_shares_follow_the_recent_requests_and_old_names_are_forgotten() -> None:
    clock = Clock()
    shares = DecayedShares(10.0, clock)
    for _ in range(3):
        shares.add("a")
    shares.add("b")
    assert shares.share("a") == pytest.approx(0.75) and shares.share("c") == 0.0
    assert shares.share("a", at_least=16) == pytest.approx(3 / 16), "a short history is no trend"
    clock.now += 30  # a's three now weigh 3/8
    for _ in range(3):
        shares.add("b")
    assert shares.share("b") == pytest.approx((1 / 8 + 3) / (4 / 8 + 3))
    assert shares.recent() == {"a": shares.share("a"), "b": shares.share("b")}
    clock.now += 200
    assert shares.recent() == {}, "faded below forget_below: not recent"
    for _ in range(256):  # a forgetting pass runs every 256 adds
        shares.add("c")
    assert len(shares) == 1 and shares.share("c") == pytest.approx(1.0)


async def test_a_replica_counts_the_tokens_its_reports_add_and_skips_a_restart() -> None:
    replica = WorkerReplica("127.0.0.1:1", None, half_life_s=1e9)
    try:

        def report(queries: int) -> None:
            message = worker_pb2.LoadReport(prefix_cache_queries=queries)
            replica._count_tokens(message)
            replica.report = message

        report(5000)  # the first report of a stream: its counter covers the worker's whole life
        assert replica.state().recent_tokens == 0.0
        report(5300)
        report(5800)
        assert replica.state().recent_tokens == pytest.approx(800)
        report(120)  # the worker restarted: its counter began again
        report(420)
        assert replica.state().recent_tokens == pytest.approx(1100)
        metrics.observe_load(replica)
        labels = {"model": "", "worker": replica.addr}
        assert REGISTRY.get_sample_value(
            "llmserve_gateway_worker_recent_prompt_tokens", labels
        ) == pytest.approx(1100)
    finally:
        await replica.close()
