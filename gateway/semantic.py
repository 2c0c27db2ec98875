"""The gateway's side of the semantic cache: which requests may use it (this module is the one owner of that
rule: the bypass header, n, logprobs, tools, CACHE_MAX_TEMPERATURE), when to ask, when to store, and which
identical requests in flight share one generation (gateway/single_flight.py).

What is worth storing (the finish reasons) is the cache service's rule (cache_service/core.py): the gateway
hands it every complete answer of a miss.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from common import sampling
from gateway import observability
from gateway.cache_client import CacheHit, SemanticCacheClient, build_cache_key
from gateway.protocol import ChatCompletionRequest, CompletionRequest
from gateway.responses import UsageTotals
from gateway.settings import GatewaySettings
from gateway.single_flight import SHAREABLE_FINISH_REASONS, SingleFlight
from gateway.worker_request import contract_values

BYPASS_HEADER = "x-semantic-cache"
# X-Semantic-Cache on a request: bypass, or the widest tier it accepts (never wider than the operator's
# CACHE_MAX_FALSE_HIT_RATE allows). Other values are ignored (every tier the service allows).
LEVELS = ("exact", "canonical", "semantic")


def requested_level(headers: Any) -> str | None:
    """The request's X-Semantic-Cache: None for bypass, else the level passed to the cache ("" = all the
    operator allows)."""
    asked = headers.get(BYPASS_HEADER, "").strip().lower()
    if asked == "bypass":
        return None
    return asked if asked in LEVELS else ""


@dataclass
class CacheDecision:
    """`status` goes to the X-Semantic-Cache header; `key` is set when the answer may be stored."""

    status: str  # hit | miss | bypass
    key: Any = None
    hit: CacheHit | None = None
    flight: bytes | None = None  # set on a miss whose answer identical requests in flight wait for

    def headers(self) -> dict[str, str]:
        headers = {"X-Semantic-Cache": self.status}
        if self.hit is not None:
            headers["X-Semantic-Cache-Similarity"] = f"{self.hit.similarity:.4f}"
            headers["X-Semantic-Cache-Tier"] = self.hit.tier
        return headers


def scope_of(authorization: str | None, user: str | None) -> str:
    """The tenant: answers are never shared across API keys or across `user`s (with one key for every
    client, the `user` a client sends keeps its users apart). The forms never meet: a key's hash (64 hex
    digits), that hash + "/user:" + the user, "user:" + the user, or "anonymous"."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    key = hashlib.sha256(token.encode()).hexdigest() if token else ""
    if key and user:
        return f"{key}/user:{user}"
    if user:
        return f"user:{user}"
    return key or "anonymous"


def output_params(req: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    """Every parameter that shapes the answer (the sampling contract's fields, as sent to the worker, and the
    output's format); two requests may share an answer only if these match."""
    params = contract_values(req)
    # the output's format: a cached free-text answer is never served to a JSON request
    params.update(
        response_format=req.response_format.model_dump(by_alias=True) if req.response_format else None,
        guided_json=req.guided_json,
        guided_regex=req.guided_regex,
        guided_choice=req.guided_choice,
        guided_grammar=req.guided_grammar,
    )
    return params


def _count_error(kind: str) -> None:
    observability.SEMANTIC_CACHE_ERRORS.labels(kind).inc()


class SemanticCacheGate:
    """Wraps the cache client; with CACHE_ENABLED=false every request is a bypass."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.client: SemanticCacheClient | None = None
        self.max_temperature = settings.cache_max_temperature
        self.flights = SingleFlight()
        if settings.cache_enabled:
            timeout_s = settings.cache_timeout_ms / 1000.0
            self.client = SemanticCacheClient(settings.cache_addr, timeout_s, on_error=_count_error)

    @property
    def enabled(self) -> bool:
        return self.client is not None

    async def decide(
        self,
        headers: Any,
        req: ChatCompletionRequest | CompletionRequest,
        model: str | None,
        messages: list[dict[str, str]] | None = None,
        prompt: str | None = None,
    ) -> CacheDecision:
        """Ask the cache unless the client opted out or the answer can't be reused. `model` is the model's
        cache identity (gateway/lora.py: an adapter's name with its digest); None: unknown, so bypass."""
        level = requested_level(headers)
        if self.client is None or level is None or model is None:
            return self._bypass()
        if not self.may_reuse(req):
            return self._bypass()
        scope = scope_of(headers.get("authorization"), req.user)
        key = build_cache_key(model, scope, messages=messages, prompt=prompt, params=output_params(req))
        if key is None:
            return self._bypass()
        errors_before = self.client.errors
        hit = await self.client.lookup(key, level=level)
        if hit is not None:
            observability.SEMANTIC_CACHE.labels("hit").inc()
            return CacheDecision("hit", key, hit)
        if (
            self.client.errors > errors_before
        ):  # the cache is away or slow: answer from the model, store nothing
            observability.SEMANTIC_CACHE.labels("error").inc()
            return CacheDecision("miss")
        shared = await self.flights.wait(key)  # the same request being generated right now?
        if shared is not None:
            observability.SEMANTIC_CACHE.labels("hit").inc()
            observability.SHARED_GENERATIONS.inc()
            return CacheDecision("hit", key, shared)
        observability.SEMANTIC_CACHE.labels("miss").inc()
        return CacheDecision("miss", key, flight=self.flights.lead(key))

    def may_reuse(self, req: ChatCompletionRequest | CompletionRequest) -> bool:
        """One answer, no logprobs of the output or the prompt (a stored text has none), no tools (calls are
        parsed from the text), the chat template at its defaults and the prompt whole (vLLM's options change
        what the same messages prompt), and sampling no hotter than CACHE_MAX_TEMPERATURE (unset: the
        engine's default temperature)."""
        if req.num_choices != 1 or req.num_logprobs() is not None or req.num_prompt_logprobs() is not None:
            return False
        if getattr(req, "tools", None):
            return False
        if not getattr(req, "add_generation_prompt", True) or getattr(req, "continue_final_message", False):
            return False  # another rendering of the same messages
        if getattr(req, "chat_template_kwargs", None) or getattr(req, "documents", None):
            return False
        if req.truncate_prompt_tokens is not None:
            return False  # a part of the prompt
        temperature = sampling.DEFAULTS["temperature"] if req.temperature is None else req.temperature
        return temperature <= self.max_temperature + 1e-6

    @staticmethod
    def _bypass() -> CacheDecision:
        observability.SEMANTIC_CACHE.labels("bypass").inc()
        return CacheDecision("bypass")

    def store(self, decision: CacheDecision, text: str, finish: str | None, usage: UsageTotals) -> None:
        """After a miss, hand the answer to the cache in the background; the cache decides whether the
        finish reason makes it worth keeping."""
        if self.client is None or decision.key is None or decision.status != "miss":
            return
        if decision.flight is not None and text and finish in SHAREABLE_FINISH_REASONS:
            shared = CacheHit(text, 1.0, True, finish, usage.prompt_tokens, usage.completion_tokens)
            self.flights.finish(decision.flight, shared)
        self.client.store_later(decision.key, text, finish, usage.prompt_tokens, usage.completion_tokens)

    def release(self, decision: CacheDecision) -> None:
        """However the request ended: waiters still waiting on it generate for themselves."""
        if decision.flight is not None:
            self.flights.finish(decision.flight, None)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
