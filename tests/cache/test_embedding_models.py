"""CACHE_EMBEDDING_MODEL: each model brings its own calibrated thresholds (cache_service/calibration.json),
and the opt-in all-mpnet-base-v2 (fetched into models/ by `make cache-models`, a step of `make test`) serves
at the default risk knob through a real cache service process."""

from __future__ import annotations

import typing
from pathlib import Path

import grpc
import pytest

from cache_service import calibration
from cache_service.calibration import BUDGETS, SEMANTIC_OFF, calibrated_models, thresholds_for
from cache_service.embedding_models import DEFAULT_EMBEDDING_MODEL, EMBEDDING_MODELS, MPNET
from cache_service.settings import CacheSettings
from common.gen import cache_pb2_grpc
from tests.cache.keyutil import chat_key, lookup, store
from tests.cache.procs import start_cache_service


def test_the_setting_offers_every_model() -> None:
    choices = typing.get_args(CacheSettings.model_fields["embedding_model"].annotation)
    assert set(choices) == set(EMBEDDING_MODELS)


def test_every_model_is_calibrated_at_every_budget() -> None:
    assert set(EMBEDDING_MODELS) <= set(calibrated_models())
    for name in calibrated_models():
        thresholds = [thresholds_for(name, b) for b in BUDGETS]
        assert all(0.5 <= t <= 1.0 for t in thresholds), thresholds
        assert thresholds == sorted(thresholds, reverse=True)  # a larger budget never a stricter threshold


def test_an_uncalibrated_model_needs_an_explicit_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model added without a calibration starts only with CACHE_SIMILARITY_THRESHOLD set, never with a
    threshold calibrated for another model (here mpnet's calibration is hidden)."""
    only_default = {DEFAULT_EMBEDDING_MODEL: calibration._table()[DEFAULT_EMBEDDING_MODEL]}
    monkeypatch.setattr(calibration, "_table", lambda: only_default)
    monkeypatch.setenv("CACHE_EMBEDDING_MODEL", MPNET)
    with pytest.raises(ValueError, match="no calibration for embedding model all-mpnet-base-v2"):
        CacheSettings()
    monkeypatch.setenv("CACHE_SIMILARITY_THRESHOLD", "0.9")
    assert CacheSettings().similarity_threshold == 0.9


@pytest.mark.parametrize("name", calibrated_models())
def test_the_knob_maps_to_the_models_own_threshold(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHE_EMBEDDING_MODEL", name)
    assert CacheSettings().similarity_threshold == thresholds_for(name, 0.02)  # the default ceiling
    monkeypatch.setenv("CACHE_MAX_FALSE_HIT_RATE", "0.05")
    assert CacheSettings().similarity_threshold == thresholds_for(name, 0.05)
    monkeypatch.setenv("CACHE_MAX_FALSE_HIT_RATE", "0.025")  # between budgets: the stricter one
    assert CacheSettings().similarity_threshold == thresholds_for(name, 0.02)
    monkeypatch.setenv("CACHE_MAX_FALSE_HIT_RATE", "0.001")  # below every budget: no semantic tier
    assert CacheSettings().similarity_threshold == SEMANTIC_OFF
    monkeypatch.setenv("CACHE_SIMILARITY_THRESHOLD", "0.9")  # an explicit threshold wins
    assert CacheSettings().similarity_threshold == 0.9


def test_a_missing_model_directory_says_how_to_fetch_it(tmp_path: Path) -> None:
    from cache_service.embedder import Embedder

    with pytest.raises(FileNotFoundError, match="make cache-models"):
        Embedder(str(tmp_path / "absent"), model=MPNET)


@pytest.fixture(scope="module")
def mpnet_service(log_dir: Path, redis_url: str):
    service = start_cache_service(log_dir, redis_url, name="cache-mpnet", CACHE_EMBEDDING_MODEL=MPNET)
    try:
        yield service
    finally:
        service.proc.stop()


def test_the_mpnet_service_serves_rewordings_and_refuses_traps(mpnet_service) -> None:
    with grpc.insecure_channel(mpnet_service.addr) as channel:
        stub = cache_pb2_grpc.SemanticCacheStub(channel)
        store(stub, chat_key("What is the capital of France?", "t-mpnet"), "Paris.")
        hit = lookup(stub, chat_key("Tell me the capital of France.", "t-mpnet"))
        assert hit.hit and not hit.exact and hit.response == "Paris."
        assert not lookup(stub, chat_key("What is the capital of Germany?", "t-mpnet")).hit
        store(stub, chat_key("How do I turn on two-factor authentication?", "t-mpnet"), "Settings > 2FA.")
        assert not lookup(stub, chat_key("How do I turn off two-factor authentication?", "t-mpnet")).hit
    log = mpnet_service.proc.log_path.read_text()
    assert "embedder all-mpnet-base-v2 float32" in log
    assert f"threshold {thresholds_for(MPNET, 0.02):.2f}," in log  # its own, at the default risk knob
