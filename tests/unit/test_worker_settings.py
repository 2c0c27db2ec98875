"""WorkerSettings takes its engine defaults and accepted names from worker/engine/config.py, their one
source."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from worker.engine.config import DTYPES, LINEAR_BACKENDS, EngineConfig, KVCacheConfig, SchedulerConfig
from worker.server.settings import WorkerSettings


def test_defaults_are_the_engine_config_defaults() -> None:
    built = WorkerSettings().engine_config()
    plain = EngineConfig()
    assert (built.model, built.dtype, built.linear_backend, built.attention_backend, built.quantization) == (
        plain.model,
        plain.dtype,
        plain.linear_backend,
        plain.attention_backend,
        plain.quantization,
    )
    assert built.kv_cache == KVCacheConfig()
    assert built.scheduler == SchedulerConfig()


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_the_engine_accepts_is_a_setting(dtype: str) -> None:
    assert WorkerSettings(dtype=dtype).engine_config().dtype == dtype


def test_unknown_names_are_refused_by_both() -> None:
    with pytest.raises(ValidationError, match="linear_backend"):
        WorkerSettings(linear_backend="mkl")
    with pytest.raises(ValueError, match="onednn"):
        EngineConfig(linear_backend="mkl")
    assert set(LINEAR_BACKENDS) == {"auto", "amx", "onednn", "torch"}
    with pytest.raises(ValidationError, match="dtype"):
        WorkerSettings(dtype="float8")


def test_the_served_name_follows_the_model_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    """As vLLM's --served-model-name follows --model: WORKER_MODEL alone names the model clients send, so
    another model is never served (nor cached) under the default model's name."""
    monkeypatch.setenv("WORKER_MODEL", "models/gemma-3-270m")
    assert WorkerSettings().served_model_name == "gemma-3-270m"
    assert WorkerSettings().engine_config().served_model_name == "gemma-3-270m"
    monkeypatch.setenv("WORKER_SERVED_MODEL_NAME", "gemma")
    assert WorkerSettings().served_model_name == "gemma"
    monkeypatch.delenv("WORKER_MODEL")
    monkeypatch.delenv("WORKER_SERVED_MODEL_NAME")
    assert WorkerSettings().served_model_name == "SmolLM2-135M-Instruct"
