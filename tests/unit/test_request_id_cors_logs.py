"""X-Request-Id on every response, CORS when configured, JSON-lines logs carrying the request id."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

from fastapi.testclient import TestClient

from common.logs import REQUEST_ID, configure_logging
from gateway.app import create_app
from gateway.settings import GatewaySettings
from scripts.launch import free_port, start_gateway


def client(**settings: str) -> TestClient:
    dead = f"127.0.0.1:{free_port()}"
    return TestClient(create_app(GatewaySettings(worker_addr=dead, cache_enabled=False, **settings)))


def test_request_id_is_echoed_or_made() -> None:
    with client() as c:
        assert c.get("/health", headers={"X-Request-Id": "abc-123"}).headers["x-request-id"] == "abc-123"
        made = c.get("/health").headers["x-request-id"]
        assert len(made) == 32
        assert (
            c.get("/health", headers={"X-Request-Id": "bad id\x7f"}).headers["x-request-id"] != "bad id\x7f"
        )
        assert "x-request-id" in c.get("/no-such-route").headers  # errors carry it too


def test_cors_only_when_configured() -> None:
    with client() as c:
        assert (
            "access-control-allow-origin" not in c.get("/health", headers={"Origin": "http://a.test"}).headers
        )
    with client(cors_allow_origins="http://a.test") as c:
        preflight = c.options(
            "/v1/chat/completions",
            headers={"Origin": "http://a.test", "Access-Control-Request-Method": "POST"},
        )
        assert preflight.headers["access-control-allow-origin"] == "http://a.test"
        other = c.get("/health", headers={"Origin": "http://b.test"})
        assert "access-control-allow-origin" not in other.headers


def test_json_lines_carry_the_request_id() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging(log_format="json")
        stream = io.StringIO()
        root.handlers[0].setStream(stream)
        token = REQUEST_ID.set("req-7")
        logging.getLogger("t").info("hello %s", "there")
        REQUEST_ID.reset(token)
        line = json.loads(stream.getvalue().strip())
        assert (line["message"], line["request_id"], line["level"], line["logger"]) == (
            "hello there",
            "req-7",
            "INFO",
            "t",
        )
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])


def test_every_line_a_json_gateway_process_logs_is_json(tmp_path: Path) -> None:
    """uvicorn's own lines too (server start, shutdown): they were its plain `INFO:     ...` text, so a
    collector reading LOG_FORMAT=json lines from the container got a mixed stream."""
    gateway = start_gateway("gateway-json-logs", tmp_path, f"127.0.0.1:{free_port()}", LOG_FORMAT="json")
    gateway.stop()
    lines = [line for line in gateway.log_path.read_text().splitlines() if line.strip()]
    not_json = [line for line in lines if not is_json_object(line)]
    assert not not_json, not_json
    loggers = {json.loads(line)["logger"] for line in lines}
    assert "uvicorn.error" in loggers, loggers


def is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
