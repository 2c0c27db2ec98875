"""Vector index and key partitioning: pure, no model and no Redis."""

from __future__ import annotations

import time

import numpy as np
import pytest

from cache_service import keys
from cache_service.index import VectorIndex
from cache_service.keys import (
    MAX_CANONICAL_CHARS,
    MAX_COMPARABLE_CHARS,
    MAX_MESSAGES,
    NotCacheableError,
    normalize_text,
    parse_key,
)
from common.gen import cache_pb2


def unit(v: list[float]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float32)
    return a / np.linalg.norm(a)


def test_search_ranks_by_cosine_within_partition() -> None:
    idx = VectorIndex(dim=3)
    idx.add("a", "p1", "s", unit([1, 0, 0]), "qa")
    idx.add("b", "p1", "s", unit([1, 1, 0]), "qb")
    idx.add("c", "p2", "s", unit([1, 0, 0]), "qc")
    found = idx.search("p1", unit([1, 0.1, 0]), k=4, min_similarity=0.0)
    assert [c.entry_id for c in found] == ["a", "b"]
    assert found[0].similarity == pytest.approx(float(unit([1, 0.1, 0]) @ unit([1, 0, 0])))
    assert [c.entry_id for c in idx.search("p1", unit([1, 0.1, 0]), k=4, min_similarity=0.9)] == ["a"]
    assert idx.search("p3", unit([1, 0, 0]), k=4, min_similarity=0.0) == []


def test_remove_keeps_rows_consistent_and_grows() -> None:
    idx = VectorIndex(dim=2)
    # Evenly spread directions, shuffled: neighbours are 0.008 apart in cosine, well above the float16 storage
    # error (2^-11), so each vector's best match is itself (random 2-d vectors can be closer than that).
    angles = np.random.default_rng(0).permutation(50) * 2 * np.pi / 50
    vectors = {f"e{i}": unit([np.cos(a), np.sin(a)]) for i, a in enumerate(angles)}
    for entry_id, v in vectors.items():
        idx.add(entry_id, "p", "s", v, entry_id)
    for i in range(0, 50, 3):
        assert idx.remove(f"e{i}")
    assert not idx.remove("e0")
    for entry_id, v in vectors.items():
        best = idx.search("p", v, k=1, min_similarity=-1.0)
        if int(entry_id[1:]) % 3 == 0:
            assert entry_id not in idx and (not best or best[0].entry_id != entry_id)
        else:
            assert best[0].entry_id == entry_id and best[0].query == entry_id
    assert len(idx) == 50 - 17
    assert idx.ids_in_scope("s") and idx.ids_in_scope("other") == []


def test_partition_is_empty_after_last_removal() -> None:
    idx = VectorIndex(dim=2)
    idx.add("x", "p", "s", unit([1, 0]), "q")
    idx.remove("x")
    assert not idx.has_partition("p")


def test_an_exact_only_entry_has_no_row_and_is_known_by_id() -> None:
    idx = VectorIndex(dim=2)
    idx.add_exact("x", "s")
    assert "x" in idx and len(idx) == 1 and idx.entry_ids() == {"x"} and idx.ids_in_scope("s") == ["x"]
    assert not idx.has_partition("p") and idx.search("p", unit([1, 0]), k=4, min_similarity=-1.0) == []
    idx.add("x", "p", "s", unit([1, 0]), "q")  # stored again with a vector: one entry, searched
    assert len(idx) == 1 and idx.search("p", unit([1, 0]), k=4, min_similarity=0.0)[0].entry_id == "x"
    idx.add_exact("x", "s")
    assert len(idx) == 1 and not idx.has_partition("p")
    assert idx.remove("x") and "x" not in idx and len(idx) == 0 and not idx.remove("x")


def key(messages: list[tuple[str, str]], **kw: str) -> cache_pb2.CacheKey:
    base = {"model": "m", "scope": "s", "params_fingerprint": "f"} | kw
    return cache_pb2.CacheKey(messages=[cache_pb2.Message(role=r, content=c) for r, c in messages], **base)


def test_partition_depends_on_everything_but_the_last_user_message() -> None:
    base = parse_key(key([("system", "be brief"), ("user", "hi")]))
    assert parse_key(key([("system", "be brief"), ("user", "hello")])).partition == base.partition
    for other in (
        key([("system", "be long"), ("user", "hi")]),
        key([("user", "hi")]),
        key([("system", "be brief"), ("user", "hi")], model="m2"),
        key([("system", "be brief"), ("user", "hi")], scope="s2"),
        key([("system", "be brief"), ("user", "hi")], params_fingerprint="g"),
    ):
        assert parse_key(other).partition != base.partition
    assert (
        parse_key(cache_pb2.CacheKey(model="m", scope="s", params_fingerprint="f", prompt="hi")).partition
        != base.partition
    )


def test_query_is_the_last_question_and_entry_id_normalizes() -> None:
    parsed = parse_key(key([("user", "first"), ("assistant", "ok"), ("user", "  What is   2FA? ")]))
    assert parsed.conversation.question == "  What is   2FA? "
    assert parsed.query == "  What is   2FA? "  # only the last question is compared by meaning
    # earlier turns are matched by their canonical text, in the searched partition
    retyped = parse_key(key([("user", "First!"), ("assistant", "OK"), ("user", "What is 2FA?")]))
    other = parse_key(key([("user", "second"), ("assistant", "ok"), ("user", "What is 2FA?")]))
    assert parsed.search_partition == retyped.search_partition != parsed.partition
    assert other.search_partition != parsed.search_partition and other.partition == parsed.partition
    assert (
        parsed.entry_id
        == parse_key(key([("user", "first"), ("assistant", "ok"), ("user", "what is 2fa")])).entry_id
    )
    assert normalize_text("Ｈello   World?!") == "hello world"


HUGE = "tell me about cats " * 50000  # ~950 KB: canonicalizing it held the event loop for ~3 s


def _never(text: str) -> str:
    raise AssertionError(f"canonicalized a text of {len(text)} characters")


def test_an_over_long_earlier_turn_is_matched_by_its_normalized_text_never_canonicalized(monkeypatch) -> None:
    """Canonical text grows faster than the text: a long earlier turn (most often the model's own answer,
    replayed) must be the same normalized text, while the short question keeps every tier."""
    parsed = parse_key(
        key([("user", HUGE), ("assistant", "Cats are small carnivores."), ("user", "And dogs?")])
    )
    short_turn = keys.canonical_text
    calls: list[int] = []
    monkeypatch.setattr(keys, "canonical_text", lambda text: calls.append(len(text)) or short_turn(text))
    assert not parsed.exact_only and parsed.search_partition != parsed.partition
    assert max(calls) == len("Cats are small carnivores.")  # the long turn was not canonicalized
    retyped = key(
        [("user", HUGE.upper() + "?"), ("assistant", "cats are small carnivores"), ("user", "And dogs?")]
    )
    assert parse_key(retyped).search_partition == parsed.search_partition
    other = key(
        [("user", HUGE + " and dogs"), ("assistant", "Cats are small carnivores."), ("user", "And dogs?")]
    )
    assert parse_key(other).search_partition != parsed.search_partition


def test_an_over_long_question_is_exact_only_and_never_canonicalized(monkeypatch) -> None:
    monkeypatch.setattr(keys, "canonical_text", _never)
    parsed = parse_key(key([("user", "hi"), ("assistant", "Hello!"), ("user", HUGE)]))
    assert parsed.exact_only and parsed.search_partition == parsed.partition
    assert (
        parse_key(key([("user", "HI"), ("assistant", "hello"), ("user", HUGE.upper())])).entry_id
        == parsed.entry_id
    )


def test_the_comparable_limits(monkeypatch) -> None:
    """A question of MAX_COMPARABLE_CHARS is still compared, one more character is not; earlier turns are
    canonicalized while they are short and MAX_CANONICAL_CHARS together."""
    longest = "a" * MAX_COMPARABLE_CHARS
    assert not parse_key(key([("user", "hi"), ("assistant", "ok"), ("user", longest)])).exact_only
    assert parse_key(key([("user", "hi"), ("assistant", "ok"), ("user", longest + "a")])).exact_only
    assert parse_key(key([("user", longest + "a")])).exact_only
    monkeypatch.setattr(keys, "canonical_text", _never)
    history = [("user", longest), ("assistant", longest)] * (MAX_CANONICAL_CHARS // MAX_COMPARABLE_CHARS)
    many = parse_key(key(history + [("user", "and then?")]))  # one turn past the limit: none canonicalized
    assert not many.exact_only and many.search_partition


def test_a_key_has_at_most_max_messages() -> None:
    turns = [("user", "hi"), ("assistant", "hello")] * (MAX_MESSAGES // 2)
    assert parse_key(key(turns[:-1] + [("user", "why?")])).query == "why?"  # MAX_MESSAGES of them
    with pytest.raises(NotCacheableError, match="messages"):
        parse_key(key(turns + [("user", "why?")]))


def test_normalize_text_is_linear_in_a_run_of_marks() -> None:
    """A trailing-punctuation regex backtracked quadratically: 50,000 marks took seconds."""
    started = time.perf_counter()
    assert normalize_text("?" * 50_000 + "a") == "?" * 50_000 + "a"
    assert normalize_text("a" + " ?." * 20_000) == "a"
    assert time.perf_counter() - started < 1.0
    assert normalize_text(" Is\u00a0it   OK ?!. \n") == "is it ok"


@pytest.mark.parametrize(
    "bad",
    [
        cache_pb2.CacheKey(model="m"),
        cache_pb2.CacheKey(prompt="x"),
        cache_pb2.CacheKey(model="m", prompt="x", messages=[cache_pb2.Message(role="user", content="y")]),
        cache_pb2.CacheKey(model="m", messages=[cache_pb2.Message(role="assistant", content="y")]),
        cache_pb2.CacheKey(model="m", prompt="   "),
    ],
)
def test_uncacheable_keys(bad: cache_pb2.CacheKey) -> None:
    with pytest.raises(NotCacheableError):
        parse_key(bad)
