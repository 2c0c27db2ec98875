"""common/healthcheck.py against real gRPC and HTTP servers on loopback ports."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from common.healthcheck import main
from tests.deploy.files import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def grpc_health() -> Iterator[tuple[str, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(grace=None)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # http.server's naming
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture()
def http_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_grpc_serving_is_healthy(grpc_health: tuple[str, health.HealthServicer]) -> None:
    target, servicer = grpc_health
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert main(["grpc", target]) == 0


def test_grpc_not_serving_is_unhealthy(grpc_health: tuple[str, health.HealthServicer]) -> None:
    target, servicer = grpc_health
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert main(["grpc", target]) == 1
    servicer.set("llmserve.worker.v1.Worker", health_pb2.HealthCheckResponse.SERVING)
    assert main(["grpc", target, "--service", "llmserve.worker.v1.Worker"]) == 0
    assert main(["grpc", target, "--service", "unknown.Service"]) == 1


def test_grpc_nothing_listening_is_unhealthy() -> None:
    assert main(["--timeout", "1", "grpc", f"127.0.0.1:{free_port()}"]) == 1


def test_http_status_decides(http_url: str) -> None:
    assert main(["http", f"{http_url}/health"]) == 0
    assert main(["http", f"{http_url}/ready"]) == 1
    assert main(["--timeout", "1", "http", f"http://127.0.0.1:{free_port()}/health"]) == 1


def test_runs_as_the_module_compose_calls(grpc_health: tuple[str, health.HealthServicer]) -> None:
    target, servicer = grpc_health
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    cmd = [sys.executable, "-m", "common.healthcheck", "grpc", target]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "healthy: SERVING", result.stderr
