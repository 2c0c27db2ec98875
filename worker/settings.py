"""Worker settings: one environment variable (and flag) per setting, prefix WORKER_."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.config import CacheConfig, EngineConfig, SchedulerConfig


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WORKER_", cli_parse_args=False, extra="ignore")

    model: str = "models/SmolLM2-135M-Instruct"
    served_model_name: str = "SmolLM2-135M-Instruct"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bf16 where native, else fp32
    device: str = "auto"  # cuda when there is one, else cpu
    num_threads: int | None = None
    linear_backend: Literal["auto", "onednn", "torch"] = "auto"  # onednn: weights prepacked on CPU
    attention_backend: Literal["auto", "native", "torch"] = "auto"  # native: compiled CPU decode kernel
    quantization: Literal["none", "int8", "int4"] = "none"  # weight-only linear layers (int4: GGUF blocks)
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int = 9101
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_gb: float = 1.0
    enable_prefix_caching: bool = True
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int = 2048
    max_waiting: int = 1024
    stream_interval: int = Field(4, ge=1)  # tokens per gRPC message after the first (vLLM's stream interval)
    num_speculative_tokens: int = 0  # n-gram draft tokens per greedy decode of a small batch; 0: off
    price_per_hour_usd: float = 0.0  # machine cost, for the cost-per-1k-tokens gauge
    drain_timeout_s: float = Field(30.0, ge=0)  # on SIGTERM: how long requests in flight may finish
    stall_timeout_s: float = Field(30.0, gt=0)  # no engine progress this long with work waiting: not ready
    debug_stall_file: str | None = None  # tests only: engine steps wait while this file exists

    @classmethod
    def from_cli(cls, argv: list[str]) -> WorkerSettings:
        """Flags (`--model PATH --dtype bfloat16 ...`) override the WORKER_* environment."""
        return cls(_cli_parse_args=argv, _cli_prog_name="python -m worker")

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            model=self.model,
            served_model_name=self.served_model_name,
            dtype=self.dtype,
            device=self.device,
            num_threads=self.num_threads,
            linear_backend=self.linear_backend,
            attention_backend=self.attention_backend,
            quantization=self.quantization,
            scheduler=SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens,
                max_model_len=self.max_model_len,
                max_waiting=self.max_waiting,
                num_speculative_tokens=self.num_speculative_tokens,
            ),
            cache=CacheConfig(
                block_size=self.block_size,
                num_blocks=self.num_kv_blocks,
                kv_cache_memory_gb=self.kv_cache_gb,
                enable_prefix_caching=self.enable_prefix_caching,
            ),
        )
