"""What every process-level test needs: the repo root, free loopback ports, polling, health checks."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
REDIS_SERVER = Path(sys.executable).parent / "redis-server"
# Environment variables of ours: a test's child processes get only the ones the test sets.
OWN_ENV_PREFIXES = ("WORKER_", "CACHE_", "GATEWAY_", "REDIS_URL", "API_KEY")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], bool], timeout_s: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def grpc_serving(addr: str) -> bool:
    with grpc.insecure_channel(addr) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        return reply.status == health_pb2.HealthCheckResponse.SERVING
