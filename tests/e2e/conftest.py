"""Real processes on free loopback ports, started once per session: a worker, gateways in front of it.

Every process logs to a file; when one fails to come up, its log tail is in the error. Starting and
waiting is scripts/launch.py's, shared with the benchmarks and `make run`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from common.gen import worker_pb2, worker_pb2_grpc
from scripts.launch import Service, free_port, start_gateway, start_worker


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-logs")


@pytest.fixture(scope="session")
def worker(log_dir: Path) -> Iterator[Service]:
    service = start_worker("worker", log_dir)
    yield service
    service.stop()


@pytest.fixture(scope="session")
def worker_stub(worker: Service) -> Iterator[worker_pb2_grpc.WorkerStub]:
    with grpc.insecure_channel(worker.addr) as channel:
        yield worker_pb2_grpc.WorkerStub(channel)


@pytest.fixture(scope="session")
def gateway(worker: Service, log_dir: Path) -> Iterator[Service]:
    service = start_gateway("gateway", log_dir, worker.addr, ready=True)
    yield service
    service.stop()


@pytest.fixture(scope="module")
def http(gateway: Service) -> Iterator[httpx.Client]:
    """A client of the shared gateway."""
    with httpx.Client(base_url=gateway.addr, timeout=60) as client:
        yield client


@pytest.fixture(scope="session")
def dead_addr() -> str:
    """A loopback port nothing listens on."""
    return f"127.0.0.1:{free_port()}"


def wait_for_idle(stub: worker_pb2_grpc.WorkerStub, timeout_s: float = 10.0) -> worker_pb2.Stats:
    """Poll GetStats until no request runs or waits and no KV block is held."""
    deadline = time.monotonic() + timeout_s
    stats = stub.GetStats(worker_pb2.StatsRequest())
    while time.monotonic() < deadline:
        stats = stub.GetStats(worker_pb2.StatsRequest())
        if stats.num_running == 0 and stats.num_waiting == 0 and stats.num_kv_blocks_used == 0:
            return stats
        time.sleep(0.05)
    return stats
