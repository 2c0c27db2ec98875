"""Stored responses in Redis, per tenant: GET / DELETE /v1/responses/{id} and previous_response_id.

One key per response, `llmserve:responses:<tenant>:<id>`, holding the response object and the conversation
that led to it (input items, without instructions), so a follow-up replays the whole conversation; each
expires after GATEWAY_RESPONSES_TTL_S. The tenant is part of the key, so another tenant's id is simply not
found (404), with no way to tell it exists.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from redis import asyncio as aioredis
from redis.exceptions import RedisError

from gateway.errors import APIError, unavailable

log = logging.getLogger(__name__)

PREFIX = "llmserve:responses:"
TIMEOUT_S = 2.0
Json = dict[str, Any]


def not_found(response_id: str, param: str = "response_id") -> APIError:
    """`param`: the field that named the id (`previous_response_id` when a request continued it)."""
    return APIError(
        404, f"Response with id '{response_id}' not found.", "invalid_request_error", param, "not_found"
    )


class ResponseStore:
    """`url` "": no storage (every request behaves as store: false; GET finds nothing)."""

    def __init__(self, url: str, ttl_s: int) -> None:
        self.ttl_s = ttl_s
        self._redis = (
            aioredis.Redis.from_url(url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
            if url
            else None
        )

    @property
    def enabled(self) -> bool:
        return self._redis is not None

    @staticmethod
    def _key(tenant: str, response_id: str) -> str:
        return f"{PREFIX}{tenant}:{response_id}"

    async def put(self, tenant: str, response: Json, conversation: list[Json]) -> None:
        if self._redis is None:
            return
        record = json.dumps({"response": response, "conversation": conversation}, ensure_ascii=False)
        await self._call(self._redis.set(self._key(tenant, response["id"]), record, ex=self.ttl_s))

    async def get(self, tenant: str, response_id: str, param: str = "response_id") -> Json:
        """The stored record ({"response", "conversation"}); 404 naming `param` when absent (or another
        tenant's)."""
        raw = (
            None if self._redis is None else await self._call(self._redis.get(self._key(tenant, response_id)))
        )
        if raw is None:
            raise not_found(response_id, param)
        return json.loads(raw)

    async def delete(self, tenant: str, response_id: str) -> None:
        removed = (
            0 if self._redis is None else await self._call(self._redis.delete(self._key(tenant, response_id)))
        )
        if not removed:
            raise not_found(response_id)

    async def _call(self, pending: Any) -> Any:
        try:
            return await pending
        except (RedisError, OSError) as exc:
            log.warning("response store unavailable: %r", exc)
            raise unavailable("The response store (Redis) is unavailable") from None

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
