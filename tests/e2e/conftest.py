"""Real processes on free loopback ports, started once per session: a worker, gateways in front of it.

Every process logs to a file; when one fails to come up, its log tail is in the error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from services.gen import worker_pb2, worker_pb2_grpc
from tests.support.net import OWN_ENV_PREFIXES, ROOT, free_port, grpc_serving

MODEL_NAME = "SmolLM2-135M-Instruct"
START_TIMEOUT_S = 240.0

# Modest settings keep the suite fast on two cores.
WORKER_ENV = {"WORKER_KV_CACHE_GB": "0.25", "WORKER_MAX_NUM_SEQS": "16"}


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log_path: Path
    addr: str

    def log_tail(self, num_bytes: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-num_bytes:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_service(name: str, module: str, env: dict[str, str], addr: str, log_dir: Path) -> Service:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(OWN_ENV_PREFIXES)}
    clean.update(env, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    log_path = log_dir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module], cwd=ROOT, env=clean, stdout=log, stderr=subprocess.STDOUT
        )
    return Service(name, proc, log_path, addr)


def wait_until(service: Service, ready: Callable[[], bool], timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if service.proc.poll() is not None:
            raise RuntimeError(f"{service.name} exited ({service.proc.returncode}):\n{service.log_tail()}")
        try:
            if ready():
                return
        except Exception:  # not up yet
            pass
        time.sleep(0.25)
    service.stop()
    raise RuntimeError(f"{service.name} not ready after {timeout_s}s:\n{service.log_tail()}")


def http_ok(url: str) -> bool:
    return httpx.get(url, timeout=1.0).status_code == 200


def start_worker(name: str, log_dir: Path, **env: str) -> Service:
    port = int(env.get("WORKER_PORT") or free_port())
    worker_env = WORKER_ENV | {"WORKER_PORT": str(port), "WORKER_METRICS_PORT": str(free_port())} | env
    service = start_service(name, "worker", worker_env, f"127.0.0.1:{port}", log_dir)
    wait_until(service, lambda: grpc_serving(service.addr))
    return service


def start_gateway(name: str, log_dir: Path, worker_addr: str, **env: str) -> Service:
    port = free_port()
    gateway_env = {"GATEWAY_PORT": str(port), "WORKER_ADDR": worker_addr, "CACHE_ENABLED": "false"} | env
    service = start_service(name, "gateway", gateway_env, f"http://127.0.0.1:{port}", log_dir)
    wait_until(service, lambda: http_ok(f"{service.addr}/health"))
    return service


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
    service = start_gateway("gateway", log_dir, worker.addr)
    wait_until(service, lambda: http_ok(f"{service.addr}/ready"))
    yield service
    service.stop()


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
