"""Engine configuration: numbers and strings only, so the scheduler builds without a model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int = 2048
    max_waiting: int = 1024  # queue full beyond this: the request is refused as overloaded
    num_speculative_tokens: int = 0  # n-gram draft tokens per greedy decode; 0: off
    speculative_max_batch: int = 4  # speculate only while at most this many sequences run


@dataclass
class CacheConfig:
    block_size: int = 16
    num_blocks: int | None = None  # None: sized from kv_cache_memory_gb
    kv_cache_memory_gb: float = 1.0
    enable_prefix_caching: bool = True


@dataclass
class EngineConfig:
    model: str = "models/SmolLM2-135M-Instruct"
    served_model_name: str | None = None
    # auto (bfloat16 where the device computes it natively, else float32) | float32 | bfloat16 | float16
    dtype: str = "auto"
    device: str = "auto"  # auto (cuda when there is one) | cpu | cuda[:N]
    num_threads: int | None = None  # torch intra-op threads; None: torch's default
    linear_backend: str = "auto"  # auto | onednn (weights prepacked, CPU) | torch (plain F.linear)
    attention_backend: str = "auto"  # auto | native (compiled CPU decode kernel) | torch (gather + matmul)
    quantization: str = "none"  # none | int8 | int4: weight-only, linear layers (services/quant.py)
    scheduler: SchedulerConfig | None = None
    cache: CacheConfig | None = None

    def __post_init__(self) -> None:
        self.scheduler = self.scheduler or SchedulerConfig()
        self.cache = self.cache or CacheConfig()
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"unsupported dtype {self.dtype!r}")
        if self.linear_backend not in ("auto", "onednn", "torch"):
            raise ValueError(f"unsupported linear backend {self.linear_backend!r}")
        if self.quantization not in ("none", "int8", "int4"):
            raise ValueError(f"unsupported quantization {self.quantization!r}")
        if self.attention_backend not in ("auto", "native", "torch"):
            raise ValueError(f"unsupported attention backend {self.attention_backend!r}")
