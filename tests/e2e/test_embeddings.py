"""/v1/embeddings through the official openai SDK against real processes (worker, Redis, the cache service
and a gateway), checked against sentence-transformers' own float32 vectors for the same model."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from cache_service.embedding_models import DEFAULT_EMBEDDING_MODEL, embedding_model
from scripts.launch import MODEL_NAME, Service, start_cache_service, start_gateway, start_redis

EMBEDDING_MODEL = DEFAULT_EMBEDDING_MODEL
TEXTS = ["What is the capital of France?", "Paris is the capital of France.", "A cat sat on the mat 🐈."]
MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def reference() -> Any:
    """sentence-transformers itself, float32, on the directory the cache service loads."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(embedding_model(EMBEDDING_MODEL).default_directory(), device="cpu")


@pytest.fixture(scope="module")
def redis_url(log_dir: Path) -> Iterator[str]:
    redis, url = start_redis(log_dir, "redis-embeddings")
    yield url
    redis.stop()


@pytest.fixture(scope="module")
def cache_service(log_dir: Path, redis_url: str) -> Iterator[Service]:
    service = start_cache_service("cache-embeddings", log_dir, redis_url)
    yield service
    service.stop()


@pytest.fixture(scope="module")
def gateway(worker: Service, cache_service: Service, log_dir: Path) -> Iterator[Service]:
    service = start_gateway(
        "gateway-embeddings", log_dir, worker.addr, CACHE_ENABLED="true", CACHE_ADDR=cache_service.addr
    )
    yield service
    service.stop()


@pytest.fixture(scope="module")
def client(gateway: Service) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.addr}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def cosines(got: list[list[float]], want: np.ndarray) -> np.ndarray:
    got_arr = np.asarray(got, dtype=np.float64)
    want64 = want.astype(np.float64)
    return (got_arr * want64).sum(1) / np.linalg.norm(got_arr, axis=1) / np.linalg.norm(want64, axis=1)


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_strings_match_sentence_transformers(
    client: openai.OpenAI, reference: Any, encoding_format: str
) -> None:
    reply = client.embeddings.create(model=EMBEDDING_MODEL, input=TEXTS, encoding_format=encoding_format)
    want = reference.encode(TEXTS, convert_to_numpy=True)
    if encoding_format == "base64":  # the SDK hands the base64 text back untouched when asked for it
        vectors = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in reply.data]
    else:
        vectors = [d.embedding for d in reply.data]
    assert [d.index for d in reply.data] == [0, 1, 2] and reply.model == EMBEDDING_MODEL
    assert all(len(v) == want.shape[1] for v in vectors)
    assert cosines(vectors, want).min() >= MIN_COSINE
    tokens = sum(len(reference.tokenizer(t)["input_ids"]) for t in TEXTS)
    assert reply.usage.prompt_tokens == tokens == reply.usage.total_tokens


def test_sdk_default_encoding_and_single_string(client: openai.OpenAI, reference: Any) -> None:
    """Left unset, the SDK asks for base64 and decodes it itself."""
    reply = client.embeddings.create(model=EMBEDDING_MODEL, input=TEXTS[0])
    assert len(reply.data) == 1
    assert cosines([reply.data[0].embedding], reference.encode([TEXTS[0]])).min() >= MIN_COSINE


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_token_arrays(client: openai.OpenAI, reference: Any, encoding_format: str) -> None:
    ids = [reference.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    one = client.embeddings.create(model=EMBEDDING_MODEL, input=ids[0], encoding_format=encoding_format)
    many = client.embeddings.create(model=EMBEDDING_MODEL, input=ids, encoding_format=encoding_format)
    want = reference.encode(TEXTS, convert_to_numpy=True)
    decode = (lambda e: np.frombuffer(base64.b64decode(e), "<f4")) if encoding_format == "base64" else list
    assert cosines([decode(one.data[0].embedding)], want[:1]).min() >= MIN_COSINE
    assert cosines([decode(d.embedding) for d in many.data], want).min() >= MIN_COSINE
    assert many.usage.prompt_tokens == sum(len(i) + 2 for i in ids)  # [CLS] and [SEP] each


def test_dimensions_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=EMBEDDING_MODEL, input="hi", dimensions=128)
    assert caught.value.body["param"] == "dimensions"


def test_long_input_is_refused_unless_truncated(client: openai.OpenAI, reference: Any) -> None:
    text = " ".join(f"word{i}" for i in range(400))
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=EMBEDDING_MODEL, input=text, encoding_format="float")
    assert caught.value.body["param"] == "input" and "truncate_prompt_tokens" in caught.value.body["message"]
    cut = client.embeddings.create(
        model=EMBEDDING_MODEL, input=text, encoding_format="float", extra_body={"truncate_prompt_tokens": 64}
    )
    assert cut.usage.prompt_tokens == 64
    # The last 62 word pieces with [CLS] and [SEP]: the same vector as those pieces sent as tokens.
    tail = reference.tokenizer(text, add_special_tokens=False)["input_ids"][-62:]
    same = client.embeddings.create(model=EMBEDDING_MODEL, input=tail, encoding_format="float")
    assert cosines([cut.data[0].embedding], np.asarray([same.data[0].embedding])).min() >= MIN_COSINE
    whole = client.embeddings.create(
        model=EMBEDDING_MODEL, input=text, encoding_format="float", extra_body={"truncate_prompt_tokens": -1}
    )
    assert whole.usage.prompt_tokens == reference.get_max_seq_length()
    for beyond in (2, reference.get_max_seq_length() + 1):  # no room past [CLS] [SEP], or more than it reads
        with pytest.raises(openai.BadRequestError) as caught:
            client.embeddings.create(
                model=EMBEDDING_MODEL, input="hi", extra_body={"truncate_prompt_tokens": beyond}
            )
        assert caught.value.body["param"] == "truncate_prompt_tokens"


def test_bad_inputs(client: openai.OpenAI, gateway: Service) -> None:
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=EMBEDDING_MODEL, input=[10**6])  # outside the vocabulary
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=EMBEDDING_MODEL, input="")
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model=MODEL_NAME, input="hi")  # the chat model does not embed
    for wrong in ([1, "a"], [[1], [-1]], 5):  # the message says what input takes, not one union member's type
        reply = httpx.post(f"{gateway.addr}/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": wrong})
        error = reply.json()["error"]
        assert reply.status_code == 400 and error["param"] == "input"
        assert error["message"].startswith("input: Input should be a string, a list of strings, a list")


def test_listed_in_models(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL_NAME, EMBEDDING_MODEL]
    assert client.models.retrieve(EMBEDDING_MODEL).id == EMBEDDING_MODEL


@pytest.mark.scenario
def test_cache_service_down_is_503_until_it_is_back(
    worker: Service, dead_addr: str, log_dir: Path, redis_url: str
) -> None:
    service = start_gateway(
        "gateway-no-cache", log_dir, worker.addr, CACHE_ENABLED="true", CACHE_ADDR=dead_addr
    )
    cache = None
    try:
        with openai.OpenAI(base_url=f"{service.addr}/v1", api_key="x", max_retries=0, timeout=60) as down:
            with pytest.raises(openai.InternalServerError) as caught:
                down.embeddings.create(model=EMBEDDING_MODEL, input="hi")
            assert caught.value.status_code == 503
            assert caught.value.body["type"] == "service_unavailable"
            assert "ipv4" not in caught.value.body["message"], "gRPC's text stays in the gateway's log"
            assert caught.value.response.headers["retry-after"]
            assert [m.id for m in down.models.list().data] == [MODEL_NAME], "not listed while it is away"
            port = dead_addr.rsplit(":", 1)[1]
            cache = start_cache_service("cache-comes-back", log_dir, redis_url, CACHE_PORT=port)
            deadline = (
                time.monotonic() + 15
            )  # the gateway reconnects within its 2 s backoff, then the model loads
            while True:
                try:
                    reply = down.embeddings.create(model=EMBEDDING_MODEL, input="hi")
                    break
                except openai.InternalServerError:
                    assert time.monotonic() < deadline, "the gateway did not reconnect"
                    time.sleep(0.2)
            assert len(reply.data[0].embedding) == 384
    finally:
        service.stop()
        if cache is not None:
            cache.stop()
