"""Logging set-up shared by the services: plain text, or JSON lines with LOG_FORMAT=json.

Each record carries the request id of the HTTP request (gateway) or gRPC call (worker) it was logged in,
so one request can be followed across both processes.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import time

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, and the exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", "")
        if request_id:
            entry["request_id"] = request_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: int = logging.INFO, log_format: str | None = None) -> None:
    """LOG_FORMAT: `text` (default) or `json`."""
    log_format = (log_format or os.environ.get("LOG_FORMAT") or "text").lower()
    if log_format not in ("text", "json"):
        raise ValueError(f"LOG_FORMAT must be text or json, not {log_format!r}")
    handler = logging.StreamHandler()
    handler.addFilter(_RequestIdFilter())
    handler.setFormatter(JsonLinesFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
