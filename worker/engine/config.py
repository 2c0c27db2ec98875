"""Engine configuration: numbers and strings only, so the scheduler builds without a model.

The one source of every engine default and of every accepted name: `worker/server/settings.py` (the WORKER_*
environment and flags) takes its defaults and choices from here, and the implementations check against
the same tuples (common/linear.py, worker/model/attention.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.linear import LINEAR_BACKENDS  # the layer's own names (common/linear.py)
from worker.engine.lora_config import LoraConfig

# auto: bfloat16 where the device computes it natively, else float32 on CPU and float16 on a CUDA GPU
# without bf16 (worker/model/loader.py resolve_dtype). float16 is meant for such GPUs: on CPU it runs, but
# only through the plain torch paths (oneDNN packing and the native attention kernel refuse it).
DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("auto", "native", "torch")  # native: compiled CPU decode kernel; torch: gather + matmul
# weight-only, linear layers (worker/model/quant.py); auto: see worker/model/loader.py resolve_quantization
QUANTIZATIONS = ("auto", "none", "int8", "int4", "w8a8", "w4a8")


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int = 2048
    max_waiting: int = 1024  # queue full beyond this: the request is refused as overloaded
    num_speculative_tokens: int = 0  # n-gram draft tokens per greedy decode; 0: off
    speculative_max_batch: int = 4  # speculate only while at most this many sequences run
    max_loras: int = 1  # distinct LoRA adapters among the running requests (worker/model/lora/)


@dataclass
class KVCacheConfig:
    """The paged KV cache (not the semantic cache, whose settings are CACHE_*)."""

    block_size: int = 16
    num_blocks: int | None = None  # None: sized from kv_cache_memory_gb
    kv_cache_memory_gb: float = 1.0
    enable_prefix_caching: bool = True


@dataclass
class EngineConfig:
    model: str = "models/SmolLM2-135M-Instruct"
    served_model_name: str | None = None
    dtype: str = "auto"  # one of DTYPES
    device: str = "auto"  # auto (cuda when there is one) | cpu | cuda[:N]
    num_threads: int | None = None  # torch intra-op threads; None: torch's default (the worker's settings
    # pick one per physical core it may use, common/cpus.py)
    linear_backend: str = "auto"  # one of LINEAR_BACKENDS
    attention_backend: str = "auto"  # one of ATTENTION_BACKENDS
    quantization: str = "auto"  # one of QUANTIZATIONS
    enforce_eager: bool = False  # CUDA: never replay decode steps from CUDA graphs (model/decode_graphs.py)
    huge_pages: bool = True  # CPU: weights and KV pool on memory advised as huge pages (common/hugepages.py)
    scheduler: SchedulerConfig | None = None
    kv_cache: KVCacheConfig | None = None
    lora: LoraConfig | None = None

    def __post_init__(self) -> None:
        self.scheduler = self.scheduler or SchedulerConfig()
        self.kv_cache = self.kv_cache or KVCacheConfig()
        self.lora = self.lora or LoraConfig()
        for what, value, allowed in (
            ("dtype", self.dtype, DTYPES),
            ("linear backend", self.linear_backend, LINEAR_BACKENDS),
            ("attention backend", self.attention_backend, ATTENTION_BACKENDS),
            ("quantization", self.quantization, QUANTIZATIONS),
        ):
            if value not in allowed:
                raise ValueError(f"unsupported {what} {value!r}; expected one of {', '.join(allowed)}")
