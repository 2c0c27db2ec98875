"""Cache service settings: one environment variable per setting (CACHE_*, plus REDIS_URL)."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from cache_service.calibration import thresholds_for
from cache_service.embedding_models import DEFAULT_EMBEDDING_MODEL, EMBEDDING_MODELS, EmbeddingModel


class CacheSettings(BaseSettings):
    """Which requests may use the cache at all (CACHE_MAX_TEMPERATURE, n, logprobs) is the gateway's rule
    (gateway/settings.py, gateway/semantic.py); what is worth storing is this service's (core.py)."""

    model_config = SettingsConfigDict(env_prefix="CACHE_", extra="ignore", populate_by_name=True)

    host: str = "127.0.0.1"
    port: int = 50052
    metrics_port: int = 9102  # 0: no metrics HTTP server
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0", validation_alias=AliasChoices("REDIS_URL", "redis_url")
    )
    # all-minilm-l6-v2 or all-mpnet-base-v2 (opt-in: `make cache-models`): cache_service/embedding_models.py
    embedding_model: Literal["all-minilm-l6-v2", "all-mpnet-base-v2"] = DEFAULT_EMBEDDING_MODEL
    embedding_model_dir: str = ""  # its sentence-transformers directory; "": where the model ships
    # The risk knob: the share of lookups that should not hit which may be answered anyway, mapped to the
    # semantic tier's cosine threshold calibrated on the tune split (cache_service/calibration.py); below
    # the smallest calibrated budget (0.005) only exact and canonical hits are served.
    max_false_hit_rate: float = Field(default=0.02, ge=0.0, le=1.0)
    # An explicit cosine threshold instead (stricter or looser than the knob; measured nowhere): unset.
    similarity_threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    ttl_seconds: int = Field(default=86400, ge=1)
    # A stored answer's size at most, UTF-8 bytes (a larger Store is INVALID_ARGUMENT): an answer that fills
    # the model's whole context (2048 tokens) is some 10 KB, so only a client's mistake comes near 1 MiB.
    max_response_bytes: int = Field(default=1 << 20, ge=1)
    resync_seconds: float = Field(default=30.0, gt=0.0)  # full index resync from Redis, as a safety net
    embed_max_batch: int = Field(default=32, ge=1)
    # auto: the type the thresholds were calibrated on (float32); bfloat16-weights: float32 arithmetic on
    # weights stored in bf16, faster on CPUs without native bf16 (cache_service/embedder.py)
    embedding_dtype: Literal["auto", "float32", "bfloat16", "bfloat16-weights"] = "auto"
    # auto: ONNX Runtime for float32 (about twice torch's speed on a short question, the same numbers), torch
    # for the bf16 types; the export is kept in onnx_dir ("": models/onnx) (cache_service/onnx_encoder.py)
    embedding_backend: Literal["auto", "onnxruntime", "torch"] = "auto"
    onnx_dir: str = ""
    # intra-op threads of torch (process-wide) and ONNX Runtime; why 1: EMBEDDING_THREADS_DEFAULT in
    # cache_service/embedder.py
    embedding_threads: int = Field(default=1, ge=1)
    drain_timeout_s: float = Field(default=30.0, ge=0.0)  # on SIGTERM: lookups in flight may finish

    @model_validator(mode="after")
    def _model_threshold(self) -> CacheSettings:
        """The knob's threshold for the model; a model without a calibration needs an explicit one."""
        if self.similarity_threshold is None:
            self.similarity_threshold = thresholds_for(self.embedding_model, self.max_false_hit_rate)
        return self

    def model(self) -> EmbeddingModel:
        return EMBEDDING_MODELS[self.embedding_model]
