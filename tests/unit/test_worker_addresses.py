"""WORKER_ADDR parsing and resolution (real getaddrinfo on this host), and make run's worker models."""

from __future__ import annotations

import pytest

from gateway.routing.addresses import WorkerTarget, parse_worker_addr, resolve, resolve_all
from scripts.run_stack import StackSettings, worker_models


def test_entries_with_models_schemes_and_lists() -> None:
    targets = parse_worker_addr(
        "SmolLM2=dns:///worker.ns.svc:50051, gemma=ipv4:10.0.0.2:50051,10.0.0.3:50052,[::1]:7"
    )
    assert targets == [
        WorkerTarget("SmolLM2", "worker.ns.svc", 50051),
        WorkerTarget("gemma", "10.0.0.2", 50051),
        WorkerTarget(None, "10.0.0.3", 50052),
        WorkerTarget(None, "::1", 7),
    ]
    assert [t.literal for t in targets] == [None, "10.0.0.2:50051", "10.0.0.3:50052", "[::1]:7"]
    assert parse_worker_addr(["a:1", "b:2,c:3"]) == [
        WorkerTarget(None, h, p) for h, p in (("a", 1), ("b", 2), ("c", 3))
    ]


@pytest.mark.parametrize("bad", ["", "worker", "worker:port", "m=:50051", " , "])
def test_malformed_entries_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="WORKER_ADDR"):
        parse_worker_addr(bad)


async def test_a_name_resolves_to_its_addresses_and_a_failed_lookup_keeps_the_last_ones() -> None:
    local = WorkerTarget(None, "localhost", 50051)
    assert await resolve(local) == ["127.0.0.1:50051"]
    gone = WorkerTarget("m", "no-such-worker.invalid", 50051)
    found = await resolve_all([local, gone], {gone: ["10.1.1.1:50051"]})
    assert found == {local: ["127.0.0.1:50051"], gone: ["10.1.1.1:50051"]}
    assert (await resolve_all([gone], {}))[gone] == []


def test_make_run_starts_workers_per_model() -> None:
    assert worker_models(StackSettings(workers=2)) == [None, None]
    settings = StackSettings(workers=2, worker_models="models/A, models/B")
    assert worker_models(settings) == ["models/A", "models/A", "models/B", "models/B"]
