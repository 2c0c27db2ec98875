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
