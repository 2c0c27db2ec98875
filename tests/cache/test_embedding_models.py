"""CACHE_EMBEDDING_MODEL: each model brings the verifier fitted on its own vectors and its own thresholds, and
the opt-in all-mpnet-base-v2 (fetched into models/ by `make cache-models`, a step of `make test`) serves
through a real cache service process."""

from __future__ import annotations

import json
import shutil
import typing
from pathlib import Path

import grpc
import pytest

from cache_service.embedding_models import EMBEDDING_MODELS, MINILM, MPNET
from cache_service.settings import CacheSettings
from cache_service.verifier import load_classifier
from common.gen import cache_pb2_grpc
from tests.cache.keyutil import chat_key, lookup, store
from tests.cache.procs import start_cache_service


def test_the_setting_offers_every_model() -> None:
    choices = typing.get_args(CacheSettings.model_fields["embedding_model"].annotation)
    assert set(choices) == set(EMBEDDING_MODELS)


@pytest.mark.parametrize("name", sorted(EMBEDDING_MODELS))
def test_thresholds_default_to_the_models_own(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = EMBEDDING_MODELS[name]
    monkeypatch.setenv("CACHE_EMBEDDING_MODEL", name)
    settings = CacheSettings()
    assert settings.similarity_threshold == model.similarity_threshold
    thresholds = settings.verifier_thresholds()
    assert (thresholds.question, thresholds.context) == (
        model.verifier_threshold,
        model.context_verifier_threshold,
    )
    monkeypatch.setenv("CACHE_VERIFIER_THRESHOLD", "0.5")
    assert CacheSettings().verifier_thresholds().question == 0.5  # an explicit value wins


def test_the_two_models_have_their_own_thresholds() -> None:
    minilm, mpnet = EMBEDDING_MODELS[MINILM], EMBEDDING_MODELS[MPNET]
    assert (minilm.similarity_threshold, minilm.verifier_threshold) != (
        mpnet.similarity_threshold,
        mpnet.verifier_threshold,
    )


def test_a_classifier_fitted_on_another_models_vectors_is_refused() -> None:
    with pytest.raises(RuntimeError, match="fitted on all-minilm-l6-v2 vectors"):
        load_classifier(EMBEDDING_MODELS[MINILM].verifier_file, MPNET)
    with pytest.raises(RuntimeError, match="fitted on all-mpnet-base-v2 vectors"):
        load_classifier(EMBEDDING_MODELS[MPNET].verifier_file, MINILM)


def test_a_classifier_fitted_on_other_context_layers_is_refused(tmp_path: Path) -> None:
    shipped = EMBEDDING_MODELS[MINILM].verifier_file
    copy = tmp_path / shipped.name
    shutil.copy(shipped, copy)
    meta = json.loads(shipped.with_suffix(".json").read_text())
    assert tuple(meta["context_layers"]) == EMBEDDING_MODELS[MINILM].context_layers
    load_classifier(shipped, MINILM)  # the shipped one matches
    meta["context_layers"] = [*meta["context_layers"], 1]
    copy.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(RuntimeError, match="contextual vectors of layers"):
        load_classifier(copy, MINILM)


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
        hit = lookup(stub, chat_key("Which city is France's capital?", "t-mpnet"))
        assert hit.hit and not hit.exact and hit.response == "Paris."
        assert not lookup(stub, chat_key("What is the capital of Germany?", "t-mpnet")).hit
        store(stub, chat_key("How do I turn on two-factor authentication?", "t-mpnet"), "Settings > 2FA.")
        assert not lookup(stub, chat_key("How do I turn off two-factor authentication?", "t-mpnet")).hit
    log = mpnet_service.proc.log_path.read_text()
    assert "embedder all-mpnet-base-v2 float32" in log
