"""What a Store may hand over (cache_service/servicer.py `answer_of`): pure, no model and no Redis. The same
refusals over gRPC: tests/cache/test_service.py."""

from __future__ import annotations

import pytest

from cache_service.keys import NotCacheableError
from cache_service.servicer import answer_of
from cache_service.settings import CacheSettings
from common.gen import cache_pb2


def request(response: str, finish_reason: str = "stop") -> cache_pb2.StoreRequest:
    return cache_pb2.StoreRequest(response=response, finish_reason=finish_reason, prompt_tokens=3)


def test_the_response_cap_counts_utf8_bytes() -> None:
    assert answer_of(request("ééé"), max_response_bytes=6).response == "ééé"
    with pytest.raises(NotCacheableError, match="7 bytes; at most 6"):
        answer_of(request("ééé!"), max_response_bytes=6)


def test_a_known_finish_reason_is_no_mistake() -> None:
    """Not worth storing is SemanticCache.put's to decide (stored=false), not a refusal."""
    for reason in ("stop", "length", "tool_calls", "abort"):
        assert answer_of(request("ok", reason), max_response_bytes=10).finish_reason == reason
    with pytest.raises(NotCacheableError, match="finish_reason"):
        answer_of(request("ok", "STOP"), max_response_bytes=10)


def test_the_response_cap_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CACHE_MAX_RESPONSE_BYTES", raising=False)
    assert CacheSettings().max_response_bytes == 1 << 20
    monkeypatch.setenv("CACHE_MAX_RESPONSE_BYTES", "4096")
    assert CacheSettings().max_response_bytes == 4096
