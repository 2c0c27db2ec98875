"""Gateway settings: one environment variable per setting (names shared with `make run` and the README)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.routing.config import RoutingConfig


class GatewaySettings(BaseSettings):
    """Read from GATEWAY_HOST, GATEWAY_PORT, WORKER_ADDR, API_KEY, GATEWAY_MAX_BODY_BYTES, CACHE_*."""

    model_config = SettingsConfigDict(env_prefix="", extra="ignore", populate_by_name=True)

    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8000
    # Comma-separated `[model=]target` entries; a DNS name stands for every address it resolves to
    # (gateway/routing/addresses.py).
    worker_addr: str = "127.0.0.1:50051"
    # Routing over the workers (gateway/routing/, docs/ARCHITECTURE.md): by the request's leading content
    # with bounded load, or round-robin.
    gateway_routing: Literal["round_robin", "cache_aware"] = "cache_aware"
    gateway_routing_balance: float = Field(default=1.25, ge=1.0)  # a worker's load bound over the mean
    gateway_routing_slack: int = Field(default=4, ge=0)  # or the least-loaded worker plus this, if more
    gateway_routing_hot_key_requests: int = Field(default=3, ge=0)  # a key this busy: no slack (0: never)
    # a key with this part of a worker's fair share of recent requests is hot: spread over more workers
    gateway_routing_hot_share: float = Field(default=0.75, ge=0.0, le=1.0)
    gateway_routing_key_balance: float = Field(default=1.25, ge=0.0)  # keys per worker over the mean (0: off)
    gateway_routing_half_life_s: float = Field(default=30.0, gt=0)  # of key shares and workers' tokens
    gateway_routing_prefix_chars: int = Field(default=1024, ge=1)  # leading characters in the routing key
    gateway_routing_session_affinity: bool = False  # route by `user` when the request names one
    gateway_worker_stale_s: float = Field(default=3.0, gt=0)  # no load report for this long: not routed
    gateway_resolve_interval_s: float = Field(default=5.0, gt=0)  # WORKER_ADDR re-resolved this often
    # a stream with no token this long ends, once its worker stopped reporting or its engine stalled
    gateway_stream_stall_s: float = Field(default=10.0, gt=0)
    api_key: str | None = None  # unset or empty: no authentication
    gateway_max_body_bytes: int = Field(default=1 << 20, ge=1024)
    cors_allow_origins: str = ""  # comma-separated origins ("*" for any); empty: no CORS headers
    cache_addr: str = "127.0.0.1:50052"
    cache_enabled: bool = True
    cache_timeout_ms: float = Field(default=100.0, gt=0)  # above a loaded hit's p99 (docs/BENCHMARKS.md)
    # The one owner of the temperature rule (gateway/semantic.py): only requests at or below it ask the cache.
    cache_max_temperature: float = Field(default=0.0, ge=0.0)
    # Time and shutdown (docs/OPERATIONS.md): the whole request, first byte to last, as a gRPC deadline.
    gateway_request_timeout_s: float = Field(default=600.0, gt=0)
    gateway_drain_timeout_s: float = Field(default=30.0, ge=0)  # on SIGTERM, for requests in flight
    # Input limits (gateway/limits.py); each refusal is a 400 naming the parameter.
    gateway_max_stop: int = Field(default=4, ge=0)  # stop strings per request (OpenAI allows 4)
    gateway_max_stop_chars: int = Field(default=256, ge=1)  # characters per stop string
    gateway_max_messages: int = Field(default=2048, ge=1)
    gateway_max_prompts: int = Field(default=128, ge=1)  # prompts in one /v1/completions list
    gateway_max_prompt_chars: int = Field(default=1_000_000, ge=1)  # all messages' text, or all prompts
    gateway_max_total_tokens: int = Field(default=65536, ge=1)  # n x max_tokens, over all prompts
    # Stored responses of /v1/responses (gateway/responses_api/store.py); "": none stored
    gateway_redis_url: str = "redis://127.0.0.1:6379/0"
    gateway_responses_ttl_s: int = Field(default=30 * 86400, ge=1)  # OpenAI keeps them 30 days
    # vLLM's run-time LoRA routes (POST /v1/load_lora_adapter, /v1/unload_lora_adapter): off by default, since
    # a load reads a path from the request body on the workers' disks.
    gateway_allow_runtime_lora_updating: bool = False
    gateway_admin_key: str | None = None  # those routes' bearer key; unset: API_KEY

    @field_validator("gateway_routing_key_balance")
    @classmethod
    def _key_balance_off_or_a_bound(cls, value: float) -> float:
        if 0.0 < value < 1.0:
            raise ValueError("GATEWAY_ROUTING_KEY_BALANCE must be 0 (off) or at least 1.0")
        return value

    @classmethod
    def from_cli(cls, argv: list[str]) -> GatewaySettings:
        """Flags (`--gateway_port 8001 --worker_addr host:port ...`) override the environment."""
        return cls(_cli_parse_args=argv, _cli_prog_name="python -m gateway")

    @property
    def worker_addrs(self) -> list[str]:
        return [addr.strip() for addr in self.worker_addr.split(",") if addr.strip()]

    def routing_config(self) -> RoutingConfig:
        return RoutingConfig(
            policy=self.gateway_routing,
            balance=self.gateway_routing_balance,
            slack=self.gateway_routing_slack,
            hot_key_requests=self.gateway_routing_hot_key_requests,
            hot_share=self.gateway_routing_hot_share,
            key_balance=self.gateway_routing_key_balance,
            half_life_s=self.gateway_routing_half_life_s,
            prefix_chars=self.gateway_routing_prefix_chars,
            session_affinity=self.gateway_routing_session_affinity,
            stale_after_s=self.gateway_worker_stale_s,
            resolve_interval_s=self.gateway_resolve_interval_s,
            stream_stall_s=self.gateway_stream_stall_s,
        )
