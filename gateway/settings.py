"""Gateway settings: one environment variable per setting (names shared with `make run` and the README)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    """Read from GATEWAY_HOST, GATEWAY_PORT, WORKER_ADDR, API_KEY, GATEWAY_MAX_BODY_BYTES, CACHE_*."""

    model_config = SettingsConfigDict(env_prefix="", extra="ignore", populate_by_name=True)

    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8000
    worker_addr: str = "127.0.0.1:50051"  # comma-separated for several workers
    api_key: str | None = None  # unset or empty: no authentication
    gateway_max_body_bytes: int = Field(default=1 << 20, ge=1024)
    cors_allow_origins: str = ""  # comma-separated origins ("*" for any); empty: no CORS headers
    cache_addr: str = "127.0.0.1:50052"
    cache_enabled: bool = True
    cache_timeout_ms: float = Field(default=100.0, gt=0)  # a semantic hit: 10-20 ms, p99 ~100 loaded
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
    # vLLM's run-time LoRA routes (POST /v1/load_lora_adapter, /v1/unload_lora_adapter): off by default, since
    # a load reads a path from the request body on the workers' disks.
    gateway_allow_runtime_lora_updating: bool = False
    gateway_admin_key: str | None = None  # those routes' bearer key; unset: API_KEY

    @classmethod
    def from_cli(cls, argv: list[str]) -> GatewaySettings:
        """Flags (`--gateway_port 8001 --worker_addr host:port ...`) override the environment."""
        return cls(_cli_parse_args=argv, _cli_prog_name="python -m gateway")

    @property
    def worker_addrs(self) -> list[str]:
        return [addr.strip() for addr in self.worker_addr.split(",") if addr.strip()]
