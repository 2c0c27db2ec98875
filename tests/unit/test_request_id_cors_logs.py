"""X-Request-Id on every response, CORS when configured, JSON-lines logs carrying the request id."""

from __future__ import annotations

import io
import json
import logging

from fastapi.testclient import TestClient

from common.logs import REQUEST_ID, configure_logging
from gateway.app import create_app
from gateway.settings import GatewaySettings
from scripts.launch import free_port


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
