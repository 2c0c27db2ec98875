"""Clients that stop reading without going away, on real processes over real sockets.

Such a client holds its TCP connection open with a full receive window, so the gateway's writes to it wait
forever. GATEWAY_REQUEST_TIMEOUT_S bounds them: at the deadline the response is ended, its worker call
cancelled and its place in the gateway (open streams, the worker's in-flight count) given back.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.gen import worker_pb2_grpc
from scripts.launch import MODEL_NAME, Service, start_gateway
from tests.e2e.conftest import wait_for_idle

DEADLINE_S = 10
LONGEST_TOKEN = 46778  # a newline and 80 spaces: SmolLM2's longest token text
# 128 choices echoing a prompt of 750 such tokens: about 8 MB of SSE within a few seconds (the prompt is
# computed once, every other choice hits the prefix cache), more than the kernel buffers between the gateway
# and a client that reads nothing. The prompt is kept short: its prefill must end well inside the deadline on
# a slow CPU under the other tests' load (1,500 tokens on an AVX2 EPYC did not, and the stream never opened).
FLOOD = {
    "model": MODEL_NAME,
    "prompt": [LONGEST_TOKEN] * 750,
    "max_tokens": 1,
    "n": 128,
    "echo": True,
    "stream": True,
}


@pytest.fixture(scope="module")
def gateway_with_deadline(worker: Service, log_dir: Path) -> Iterator[Service]:
    service = start_gateway(
        "gateway-stuck-clients", log_dir, worker.addr, ready=True, GATEWAY_REQUEST_TIMEOUT_S=str(DEADLINE_S)
    )
    yield service
    service.stop()


def open_streams(gateway: Service) -> float:
    for line in httpx.get(f"{gateway.addr}/metrics", timeout=10).text.splitlines():
        if line.startswith("llmserve_gateway_open_streams "):
            return float(line.split()[1])
    raise AssertionError("no llmserve_gateway_open_streams gauge")


def post_and_never_read(gateway: Service, body: dict) -> socket.socket:
    host, port = gateway.addr.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, never drained
    sock.connect((host, int(port)))
    data = json.dumps(body).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    sock.sendall(head.encode() + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def test_a_stream_nobody_reads_ends_at_the_request_deadline(
    gateway_with_deadline: Service, worker_stub: worker_pb2_grpc.WorkerStub
) -> None:
    with post_and_never_read(gateway_with_deadline, FLOOD):
        deadline = time.monotonic() + 30
        while open_streams(gateway_with_deadline) == 0:
            assert time.monotonic() < deadline, "the stream never opened"
            time.sleep(0.1)
        opened = time.monotonic()
        while open_streams(gateway_with_deadline) > 0:
            assert time.monotonic() - opened < DEADLINE_S + 20, "the stream is still held past its deadline"
            time.sleep(0.2)
        stats = wait_for_idle(worker_stub)
        assert (stats.num_running, stats.num_waiting, stats.num_kv_blocks_used) == (0, 0, 0)
