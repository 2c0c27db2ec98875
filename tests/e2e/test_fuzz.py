"""schemathesis against the gateway's own /openapi.json: whatever a client sends, no 5xx but a 503 for
a missing worker, always the OpenAI error shape, never a crashed process.

Bounded in count (hypothesis max_examples) and in time (examples past the budget return at once).
What the fuzzers found is pinned as regression tests: tests/unit/test_worker_params_fuzz.py (token ids
past the vocabulary crashed the engine loop) and tests/e2e/test_limits.py (inputs still accepted).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from scripts.launch import MODEL_NAME, Service, start_gateway

TIME_BUDGET_S = 5.0  # per fuzzed operation
FUZZ = settings(
    deadline=None,
    database=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
ROUTES = [("POST", "/v1/chat/completions"), ("POST", "/v1/completions")]


@pytest.fixture(scope="module")
def gateway_without_worker(log_dir, dead_addr: str) -> Iterator[Service]:
    service = start_gateway("gateway-fuzz-no-worker", log_dir, dead_addr)
    yield service
    service.stop()


def assert_well_formed(response, allowed_5xx: tuple[int, ...]) -> None:
    status = response.status_code
    assert status < 500 or status in allowed_5xx, f"{status}: {response.text[:500]}"
    if status >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error


def fuzz(
    base_url: str,
    method: str,
    path: str,
    mode: GenerationMode,
    max_examples: int,
    prepare=None,
    allowed_5xx: tuple[int, ...] = (),
) -> int:
    """Run up to `max_examples` generated requests against one operation; returns how many were sent."""
    operation = schemathesis.openapi.from_url(f"{base_url}/openapi.json")[path][method]
    # The budget starts at the first example: drawing it from a large schema can take seconds on a slow or
    # busy machine, and a budget spent before anything was sent tests nothing.
    stop_at: list[float] = []
    sent = []

    @settings(FUZZ, max_examples=max_examples)
    @given(operation.as_strategy(generation_mode=mode))
    def run(case) -> None:
        if not stop_at:
            stop_at.append(time.monotonic() + TIME_BUDGET_S)
        elif time.monotonic() > stop_at[0]:
            return
        if prepare is not None:
            prepare(case)
        response = case.call(base_url=base_url, timeout=60)
        sent.append(response.status_code)
        assert_well_formed(response, allowed_5xx)
        content_type = "".join(response.headers.get("content-type") or [])  # schemathesis: lists of values
        if response.status_code == 200 and content_type.startswith("text/event-stream"):
            assert response.text.rstrip().endswith("data: [DONE]"), response.text[-300:]

    run()
    return len(sent)


# Without a worker (nor a cache service) these validate, then answer 503.
OTHER_ROUTES = [("POST", "/v1/responses"), ("POST", "/v1/embeddings")]
FUZZED_WITHOUT_WORKER = [
    (m, p, GenerationMode.POSITIVE)
    for m, p in ROUTES + OTHER_ROUTES + [("GET", "/v1/models"), ("GET", "/ready")]
]
FUZZED_WITHOUT_WORKER += [(m, p, GenerationMode.NEGATIVE) for m, p in ROUTES + OTHER_ROUTES]


@pytest.mark.parametrize(("method", "path", "mode"), FUZZED_WITHOUT_WORKER)
def test_no_server_error_without_a_worker(
    gateway_without_worker: Service, method: str, path: str, mode: GenerationMode
) -> None:
    sent = fuzz(gateway_without_worker.addr, method, path, mode, max_examples=20, allowed_5xx=(503,))
    assert sent > 0
    assert gateway_without_worker.proc.poll() is None, gateway_without_worker.log_tail()


def cheap(case) -> None:
    """Point a generated body at the served model and cap its generation, so each example costs at most
    a few tokens on the worker; everything else is left as generated."""
    if not isinstance(case.body, dict):
        return
    case.body["model"] = MODEL_NAME
    for field in ("max_tokens", "max_completion_tokens"):
        if isinstance(case.body.get(field), int) and not isinstance(case.body.get(field), bool):
            case.body[field] = max(1, min(case.body[field], 4))
    if "max_tokens" not in case.body:
        case.body["max_tokens"] = 4
    case.body.pop("max_completion_tokens", None)
    if isinstance(case.body.get("n"), int) and not isinstance(case.body.get("n"), bool):
        case.body["n"] = max(1, min(case.body["n"], 2))


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_no_server_error_with_the_worker(gateway: Service, worker: Service, method: str, path: str) -> None:
    sent = fuzz(gateway.addr, method, path, GenerationMode.POSITIVE, max_examples=15, prepare=cheap)
    assert sent > 0
    assert worker.proc.poll() is None, worker.log_tail()
    ready = httpx.get(f"{gateway.addr}/ready", timeout=5)
    assert ready.status_code == 200, json.dumps(ready.json())
