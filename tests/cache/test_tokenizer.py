"""The cache's own tokenizer (cache_service/tokenizer.py) against transformers' for each embedding model."""

from __future__ import annotations

import threading
import time

import pytest
from transformers import AutoTokenizer

from cache_service.embedding_models import EMBEDDING_MODELS, embedding_model
from cache_service.tokenizer import TextTokenizer

TEXTS = [
    "Hello, World!",
    "  leading and trailing  ",
    "Ünïcödé café naïve — “quotes” ‘x’ Straße ﬁ",
    "中文字符测试 and 日本語, emoji 😀🎉",
    "tabs\tand\nnewlines\r\n",
    "[CLS] [SEP] [PAD] [MASK] <s> </s> <mask> <pad>",
    "",
    "How do I reset my router's password? It's a TP-Link AX1800, bought in 2021 for $79.99.",
    " ".join(["supercalifragilistic"] * 150),  # past every model's length: cut
    "a" * 3000,
]


def folders() -> list:
    out = []
    for name in EMBEDDING_MODELS:
        folder = embedding_model(name).default_directory()
        reason = f"{name} is not fetched (make cache-models)"
        out.append(
            pytest.param(
                folder, id=name, marks=pytest.mark.skipif(not TextTokenizer.readable(folder), reason=reason)
            )
        )
    return out


@pytest.mark.parametrize("folder", folders())
def test_the_same_ids_as_transformers_cut_or_not_with_or_without_special_tokens(folder: str) -> None:
    ours, theirs = TextTokenizer(folder), AutoTokenizer.from_pretrained(folder)
    assert len(ours) == len(theirs) and ours.pad_token_id == theirs.pad_token_id
    for call in (
        {"truncation": True, "max_length": 256},
        {"truncation": True, "max_length": 7},
        {"add_special_tokens": False},
        {},
    ):
        assert ours(TEXTS, **call)["input_ids"] == theirs(TEXTS, **call)["input_ids"], call
        assert ours(TEXTS[2], **call)["input_ids"] == theirs(TEXTS[2], **call)["input_ids"], call
    # The file's own truncation (MiniLM's: 128 tokens) is not applied where no call asks for one.
    assert len(ours(TEXTS[-2])["input_ids"]) > 300


@pytest.mark.parametrize("folder", folders()[:1])
def test_calls_cutting_at_different_lengths_on_two_threads_do_not_mix(folder: str) -> None:
    tokenizer = TextTokenizer(folder)
    long_text = TEXTS[-2]
    lengths: dict[int, set[int]] = {8: set(), 64: set()}

    def call(limit: int) -> None:
        for _ in range(200):
            lengths[limit].add(len(tokenizer(long_text, truncation=True, max_length=limit)["input_ids"]))

    threads = [threading.Thread(target=call, args=(n,)) for n in lengths]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert lengths == {8: {8}, 64: {64}}


@pytest.mark.parametrize("folder", folders()[:1])
def test_a_long_text_is_tokenized_without_holding_the_gil(folder: str) -> None:
    """The service tokenizes /v1/embeddings inputs on a thread so that its lookups go on meanwhile; that only
    helps if the call lets go of the GIL. tokenizers' `encode` keeps it for the whole call (the thread that
    starts it does not even hand back from `start()` until it ends); `encode_batch` lets go."""
    tokenizer = TextTokenizer(folder)
    text = "The quick brown fox jumps over the lazy dog. " * 5000  # ~50,000 tokens: ~0.1-0.2 s
    call: dict[str, float] = {}

    def tokenize() -> None:
        call["start"] = time.perf_counter()
        tokenizer(text, add_special_tokens=False)
        call["end"] = time.perf_counter()

    worker = threading.Thread(target=tokenize)
    worker.start()
    ticks = []
    while worker.is_alive():
        ticks.append(time.perf_counter())
        time.sleep(0.001)
    worker.join()
    during = [t for t in ticks if call["start"] < t < call["end"]]
    seconds = call["end"] - call["start"]
    assert len(during) >= 5, f"this thread ran {len(during)} times in a {seconds:.3f} s call"
