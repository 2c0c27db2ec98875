"""Worker settings: one environment variable (and flag) per setting, prefix WORKER_.

Engine defaults and accepted names come from worker/engine/config.py, their one source; only the process's own
settings (addresses, drain, stall, price) have their defaults here.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.cpus import cgroup_cpu_limit, default_threads, parse_cpu_list, usable_cpus
from worker.engine.config import (
    ATTENTION_BACKENDS,
    DTYPES,
    LINEAR_BACKENDS,
    QUANTIZATIONS,
    EngineConfig,
    KVCacheConfig,
    SchedulerConfig,
)
from worker.engine.lora_config import LoraConfig


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WORKER_", cli_parse_args=False, extra="ignore")

    model: str = EngineConfig.model
    served_model_name: str = ""  # the name clients send as `model`; "": the model directory's name, as vLLM's
    dtype: Literal[DTYPES] = EngineConfig.dtype  # type: ignore[valid-type]
    device: str = EngineConfig.device
    # unset: one per physical core of `cpus` (or of the CPUs it may use), within a container's CPU limit
    num_threads: int | None = EngineConfig.num_threads
    cpus: str = ""  # taskset's form ("0-3,8"): the process runs on these CPUs only; empty: wherever allowed
    linear_backend: Literal[LINEAR_BACKENDS] = EngineConfig.linear_backend  # type: ignore[valid-type]
    attention_backend: Literal[ATTENTION_BACKENDS] = EngineConfig.attention_backend  # type: ignore[valid-type]
    quantization: Literal[QUANTIZATIONS] = EngineConfig.quantization  # type: ignore[valid-type]
    enforce_eager: bool = EngineConfig.enforce_eager
    huge_pages: bool = EngineConfig.huge_pages
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int = 9101
    block_size: int = KVCacheConfig.block_size
    num_kv_blocks: int | None = KVCacheConfig.num_blocks
    kv_cache_gb: float = KVCacheConfig.kv_cache_memory_gb
    enable_prefix_caching: bool = KVCacheConfig.enable_prefix_caching
    max_num_seqs: int = SchedulerConfig.max_num_seqs
    max_num_batched_tokens: int = SchedulerConfig.max_num_batched_tokens
    max_model_len: int = SchedulerConfig.max_model_len
    max_waiting: int = SchedulerConfig.max_waiting
    stream_interval: int = Field(4, ge=1)  # tokens per gRPC message after the first (vLLM's stream interval)
    num_speculative_tokens: int = SchedulerConfig.num_speculative_tokens
    # LoRA adapters (worker/model/lora/), vLLM's meaning: --enable-lora, --lora-modules, --max-loras...
    enable_lora: bool = LoraConfig.enabled
    lora_modules: str = LoraConfig.lora_modules  # name=path,name2=path2 (PEFT directories), loaded at start
    max_loras: int = Field(LoraConfig.max_loras, ge=1)  # distinct adapters in one batch
    max_cpu_loras: int | None = Field(LoraConfig.max_cpu_loras, ge=1)  # held in memory (LRU); None: max_loras
    max_lora_rank: int = Field(LoraConfig.max_lora_rank, ge=1)
    price_per_hour_usd: float = 0.0  # machine cost, for the cost-per-1k-tokens gauge
    drain_timeout_s: float = Field(30.0, ge=0)  # on SIGTERM: how long requests in flight may finish
    stall_timeout_s: float = Field(30.0, gt=0)  # no engine progress this long with work waiting: not ready
    debug_stall_file: str | None = None  # tests only: engine steps wait while this file exists

    @classmethod
    def from_cli(cls, argv: list[str]) -> WorkerSettings:
        """Flags (`--model PATH --dtype bfloat16 ...`) override the WORKER_* environment."""
        return cls(_cli_parse_args=argv, _cli_prog_name="python -m worker")

    @model_validator(mode="after")
    def _served_name_of_the_model(self) -> WorkerSettings:
        """Another WORKER_MODEL is served under its own name, never the default model's."""
        self.served_model_name = self.served_model_name or PurePath(self.model).name
        return self

    @field_validator("cpus")
    @classmethod
    def _cpu_list(cls, value: str) -> str:
        if value.strip():
            parse_cpu_list(value)  # a ValueError names the bad part
        return value.strip()

    def cpu_list(self) -> list[int]:
        return parse_cpu_list(self.cpus) if self.cpus else []

    def runs_on(self) -> list[int]:
        """The CPUs the worker runs on: `cpus` where this process may use them (the kernel keeps a mask
        within the container's cpuset), else every CPU it may use."""
        usable = usable_cpus()
        return [cpu for cpu in self.cpu_list() if cpu in usable] if self.cpus else usable

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            model=self.model,
            served_model_name=self.served_model_name,
            dtype=self.dtype,
            device=self.device,
            num_threads=self.num_threads or default_threads(self.runs_on(), cgroup_cpu_limit()),
            linear_backend=self.linear_backend,
            attention_backend=self.attention_backend,
            quantization=self.quantization,
            enforce_eager=self.enforce_eager,
            huge_pages=self.huge_pages,
            scheduler=SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens,
                max_model_len=self.max_model_len,
                max_waiting=self.max_waiting,
                num_speculative_tokens=self.num_speculative_tokens,
                max_loras=self.max_loras,
            ),
            kv_cache=KVCacheConfig(
                block_size=self.block_size,
                num_blocks=self.num_kv_blocks,
                kv_cache_memory_gb=self.kv_cache_gb,
                enable_prefix_caching=self.enable_prefix_caching,
            ),
            lora=LoraConfig(
                enabled=self.enable_lora,
                lora_modules=self.lora_modules,
                max_loras=self.max_loras,
                max_cpu_loras=self.max_cpu_loras,
                max_lora_rank=self.max_lora_rank,
            ),
        )
