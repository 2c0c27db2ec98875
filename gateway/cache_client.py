"""Gateway-side client of the semantic cache service.

The cache must never make the gateway slower or less available than it is without one: every call has a short
deadline, and any error or timeout is a miss (lookup) or a dropped store, counted through `on_error`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from common.gen import cache_pb2, cache_pb2_grpc
from common.sampling import DEFAULTS

log = logging.getLogger(__name__)

STORE_TIMEOUT_S = 2.0  # a store embeds the text: slower than a lookup, and nobody waits for it
# Reconnect within a second or two of the cache service's return: gRPC's default backoff grows to two
# minutes, and every lookup meanwhile fails fast as a miss.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]

# The sampling contract's defaults (common/sampling.py): a parameter left unset and one set to its default
# shape the answer alike, so they fingerprint alike.
_ENGINE_DEFAULTS: dict[str, Any] = DEFAULTS
# Not part of the fingerprint: the temperature (only requests at or below CACHE_MAX_TEMPERATURE reach the
# cache, and their answers count as interchangeable), n and logprobs (never reach it: gateway/semantic.py).
_NOT_FINGERPRINTED = ("temperature", "n", "logprobs", "top_logprobs")


@dataclass(frozen=True)
class CacheHit:
    text: str
    similarity: float
    exact: bool
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    tier: str = "exact"  # exact | canonical | semantic (a shared generation: exact)


def _canonical(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def params_fingerprint(params: dict[str, Any]) -> str:
    """Canonical hash of the parameters that shape the answer (stop strings are a set: order is moot)."""
    canon: dict[str, Any] = {}
    for name, value in params.items():
        if name == "stop":
            value = sorted({value} if isinstance(value, str) else set(value or []))
        if name in _NOT_FINGERPRINTED or value in (None, [], {}) or value == _ENGINE_DEFAULTS.get(name):
            continue
        canon[name] = _canonical(value)
    return hashlib.sha256(json.dumps(canon, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def build_cache_key(
    model: str,
    scope: str,
    messages: list[dict] | None = None,
    prompt: str | None = None,
    *,
    params: dict[str, Any],
) -> cache_pb2.CacheKey | None:
    """The key of a request the gateway allowed to use the cache (gateway/semantic.py decides that), or None
    when the conversation cannot be keyed (content that is not plain text, an assistant's tool calls, which
    the prompt renders but a key of text turns would drop, no user message, no prompt)."""
    key = cache_pb2.CacheKey(model=model, scope=scope, params_fingerprint=params_fingerprint(params))
    if messages is not None and prompt is None:
        for m in messages:
            content = m.get("content")
            if not isinstance(content, str) or not isinstance(m.get("role"), str) or m.get("tool_calls"):
                return None  # multimodal parts, tool calls: not handled by the cache
            key.messages.append(cache_pb2.Message(role=m["role"], content=content))
        if not any(m.role == "user" for m in key.messages):
            return None
    elif prompt is not None and messages is None and prompt.strip():
        key.prompt = prompt
    else:
        return None
    return key


class SemanticCacheClient:
    def __init__(self, addr: str, timeout_s: float, on_error: Callable[[str], None] | None = None) -> None:
        self._addr = addr
        self._timeout_s = timeout_s
        self._on_error = on_error
        self._channel: grpc.aio.Channel | None = None
        self._stub: cache_pb2_grpc.SemanticCacheStub | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self.errors = 0  # lookups and stores that failed or timed out

    def _get_stub(self) -> cache_pb2_grpc.SemanticCacheStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self._addr, options=CHANNEL_OPTIONS)
            self._stub = cache_pb2_grpc.SemanticCacheStub(self._channel)
        return self._stub

    def _error(self, kind: str, exc: BaseException) -> None:
        self.errors += 1
        log.debug("semantic cache %s failed: %r", kind, exc)
        if self._on_error is not None:
            try:
                self._on_error(kind)
            except Exception:  # a metrics callback must not break serving
                log.exception("semantic cache on_error callback failed")

    async def lookup(
        self, key: cache_pb2.CacheKey, threshold: float | None = None, level: str = ""
    ) -> CacheHit | None:
        """The cached answer, or None on a miss and on any error or timeout. `level` narrows the tiers
        (exact, canonical, semantic; "" = all the service allows)."""
        try:
            request = cache_pb2.LookupRequest(key=key, level=level)
            if threshold is not None:
                request.threshold = threshold
            resp = await self._get_stub().Lookup(request, timeout=self._timeout_s)
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as exc:
            kind = "timeout" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else "lookup"
            self._error(kind, exc)
            return None
        except Exception as exc:  # the cache is optional: any failure is a miss
            self._error("lookup", exc)
            return None
        if not resp.hit:
            return None
        return CacheHit(
            text=resp.response,
            similarity=resp.similarity,
            exact=resp.exact,
            finish_reason=resp.finish_reason,
            prompt_tokens=resp.prompt_tokens,
            completion_tokens=resp.completion_tokens,
            tier=resp.tier or ("exact" if resp.exact else "semantic"),
        )

    def store_later(
        self,
        key: cache_pb2.CacheKey | None,
        text: str,
        finish_reason: str | None,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> None:
        """Store in the background; never raises, never delays the response. Whether the finish reason is
        worth storing is the cache service's rule (cache_service/core.py); an answer without one never
        finished (the service refuses an empty finish reason as a client's mistake)."""
        if key is None or not text or not finish_reason:
            return
        try:
            request = cache_pb2.StoreRequest(
                key=key,
                response=text,
                finish_reason=finish_reason or "",
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
            )
            task = asyncio.get_running_loop().create_task(self._store(request))
        except Exception as exc:  # e.g. no running loop
            self._error("store", exc)
            return
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _store(self, request: cache_pb2.StoreRequest) -> None:
        try:
            await self._get_stub().Store(request, timeout=max(self._timeout_s, STORE_TIMEOUT_S))
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # a lost store is only a lost future hit
            self._error("store", exc)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait for background stores (tests, shutdown)."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)

    async def close(self) -> None:
        await self.drain(timeout_s=1.0)
        for task in list(self._pending):
            task.cancel()
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None
