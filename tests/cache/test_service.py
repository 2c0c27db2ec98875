"""The cache service as a real process against a real Redis: what hits, what must miss, TTL, invalidation."""

from __future__ import annotations

import time
import urllib.request

import grpc
import pytest

from cache_service.keys import MAX_MESSAGES
from common.gen import cache_pb2, cache_pb2_grpc
from tests.cache.keyutil import chat_key, lookup, store
from tests.cache.procs import CacheService
from tests.support.grpc_checks import serving_with_reflection


def test_exact_hit_and_miss(stub) -> None:
    key = chat_key("How do I reset my password?", "t-exact")
    assert not lookup(stub, key).hit
    stored = store(stub, key, "Open Settings > Security > Reset password.")
    assert stored.stored and stored.entry_id
    again = lookup(stub, chat_key("how do I reset my password", "t-exact"))
    assert again.hit and again.exact
    assert again.response == "Open Settings > Security > Reset password."
    assert again.entry_id == stored.entry_id
    assert (again.finish_reason, again.prompt_tokens, again.completion_tokens) == ("stop", 11, 7)
    assert not lookup(stub, chat_key("How do I bake sourdough bread?", "t-exact")).hit


def test_paraphrase_hits_by_similarity(stub) -> None:
    store(stub, chat_key("What is the population of Tokyo?", "t-para"), "About 14 million.")
    hit = lookup(stub, chat_key("How many people live in Tokyo?", "t-para"))
    assert hit.hit and not hit.exact
    assert 0.0 < hit.similarity < 1.0
    assert hit.response == "About 14 million."


@pytest.mark.parametrize(
    ("stored_q", "asked_q"),
    [
        ("How do I turn on two-factor authentication?", "How do I turn off two-factor authentication?"),
        ("What is the capital of France?", "What is the capital of Germany?"),
        ("Convert 5 km to miles", "Convert 5 miles to km"),
        ("What is 15% of 200?", "What is 20% of 200?"),
        ("Is it safe to eat raw eggs?", "Is it not safe to eat raw eggs?"),
    ],
)
def test_hard_negatives_miss(stub, stored_q: str, asked_q: str) -> None:
    scope = f"t-neg-{abs(hash(stored_q))}"
    store(stub, chat_key(stored_q, scope), "an answer")
    assert lookup(stub, chat_key(stored_q, scope)).hit  # the stored question itself does hit
    assert not lookup(stub, chat_key(asked_q, scope)).hit


def test_threshold_per_request_only_narrows(stub) -> None:
    store(stub, chat_key("What is the capital of France?", "t-thr"), "Paris")
    key = chat_key("Tell me the capital of France.", "t-thr")
    assert lookup(stub, key).hit
    strict = stub.Lookup(cache_pb2.LookupRequest(key=key, threshold=0.999), timeout=30)
    assert not strict.hit
    far = chat_key("How tall is the Eiffel Tower?", "t-thr")
    assert not stub.Lookup(cache_pb2.LookupRequest(key=far, threshold=0.0), timeout=30).hit


def test_a_stricter_threshold_holds_for_mistyped_questions_too(stub) -> None:
    """The semantic tier takes a question that differs by a few mistyped letters from far below its cosine
    threshold (TYPO_FLOOR). A request's stricter threshold did not reach that rule: asked for 0.99, it got a
    hit of similarity ~0.6. A client that asks for a stricter threshold now gets no hit below it."""
    store(stub, chat_key("how do i get a refund for a cancelled flight", "t-thr-typo"), "Ask the airline.")
    key = chat_key("how do i gte a rfeund for a cancelled flight", "t-thr-typo")
    loose = lookup(stub, key)
    assert loose.hit and loose.tier == "semantic" and loose.similarity < 0.9
    strict = stub.Lookup(cache_pb2.LookupRequest(key=key, threshold=0.99), timeout=30)
    assert not strict.hit


def test_tiers_and_levels(stub) -> None:
    """Exact, canonical and semantic hits are told apart; a request's level narrows the tiers."""
    store(stub, chat_key("How do I apply for a student loan?", "t-tier"), "Apply online.")
    exact = lookup(stub, chat_key("how do I apply for a student loan", "t-tier"))
    assert exact.hit and exact.tier == "exact" and exact.exact
    retyped = chat_key("Hiya, how do i apply for a student loan?? Thanks in advance", "t-tier")
    canonical = lookup(stub, retyped)
    assert canonical.hit and canonical.tier == "canonical" and not canonical.exact
    assert not stub.Lookup(cache_pb2.LookupRequest(key=retyped, level="exact"), timeout=30).hit
    reworded = chat_key("How can I apply for a student loan?", "t-tier")
    semantic = lookup(stub, reworded)
    assert semantic.hit and semantic.tier == "semantic" and semantic.similarity < 1.0
    assert not stub.Lookup(cache_pb2.LookupRequest(key=reworded, level="canonical"), timeout=30).hit
    assert stub.Lookup(cache_pb2.LookupRequest(key=reworded, level="semantic"), timeout=30).hit
    with pytest.raises(grpc.RpcError) as err:
        stub.Lookup(cache_pb2.LookupRequest(key=reworded, level="anything"), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_answers_never_cross_tenants(stub) -> None:
    store(stub, chat_key("What is my account balance?", "alice"), "Alice has $10.")
    assert lookup(stub, chat_key("What is my account balance?", "alice")).hit
    assert not lookup(stub, chat_key("What is my account balance?", "bob")).hit
    assert not lookup(stub, chat_key("What's my account balance?", "bob")).hit


def test_earlier_conversation_must_match(stub) -> None:
    france = [("user", "What is the capital of France?"), ("assistant", "Paris.")]
    germany = [("user", "What is the capital of Germany?"), ("assistant", "Berlin.")]
    store(stub, chat_key("What is its population?", "t-hist", france), "About 2.1 million.")
    assert lookup(stub, chat_key("What is its population?", "t-hist", france)).hit
    assert not lookup(stub, chat_key("What is its population?", "t-hist", germany)).hit
    assert not lookup(stub, chat_key("What is its population?", "t-hist")).hit
    system = [("system", "Answer in French.")] + france
    assert not lookup(stub, chat_key("What is its population?", "t-hist", system)).hit


def test_turns_that_split_the_same_text_apart_are_other_conversations(stub) -> None:
    """The entry id hashes the turns one by one: a NUL a client typed into one is no turn boundary."""
    first = [("user", "Pick a number\0Seven"), ("assistant", "Done.")]
    second = [("user", "Pick a number"), ("assistant", "Seven\0Done.")]
    store(stub, chat_key("Which one?", "t-split", first), "Seven.")
    assert lookup(stub, chat_key("Which one?", "t-split", first)).hit
    assert not lookup(stub, chat_key("Which one?", "t-split", second)).hit


def test_a_conversation_hits_when_earlier_turns_are_canonical_equal(stub) -> None:
    """Earlier turns must be the same text or canonical-equal; only the last question may be reworded."""
    france = [("user", "What is the capital of France?"), ("assistant", "Paris.")]
    store(stub, chat_key("What is the population of Paris?", "t-conv", france), "About 2.1 million.")
    retyped = [("user", "whats the capital of france"), ("assistant", "Paris.")]
    hit = lookup(stub, chat_key("How many people live in Paris?", "t-conv", retyped))
    assert hit.hit and not hit.exact and hit.response == "About 2.1 million."
    reworded = [("user", "Which city is France's capital?"), ("assistant", "Paris.")]
    assert not lookup(stub, chat_key("What is the population of Paris?", "t-conv", reworded)).hit
    germany = [("user", "What is the capital of Germany?"), ("assistant", "Paris.")]
    assert not lookup(stub, chat_key("What is the population of Paris?", "t-conv", germany)).hit
    assert not lookup(stub, chat_key("What is 3 times the population of Paris?", "t-conv", france)).hit


def test_parameters_are_part_of_the_key(stub) -> None:
    """Temperature is not the service's business: the gateway only asks for requests it may answer
    (tests/cache/test_client.py covers that rule)."""
    store(stub, chat_key("Name a prime number.", "t-params", params="max_tokens=5"), "7")
    assert lookup(stub, chat_key("Name a prime number.", "t-params", params="max_tokens=5")).hit
    assert not lookup(stub, chat_key("Name a prime number.", "t-params", params="max_tokens=50")).hit


@pytest.mark.parametrize("finish_reason", ["abort", "tool_calls"])
def test_only_complete_answers_are_stored(stub, finish_reason: str) -> None:
    key = chat_key("Tell me a story.", "t-finish")
    req = cache_pb2.StoreRequest(key=key, response="Once upon", finish_reason=finish_reason)
    assert not stub.Store(req, timeout=30).stored
    assert not lookup(stub, key).hit


@pytest.mark.parametrize(
    ("field", "value"),
    [("prompt_tokens", -1), ("completion_tokens", -7), ("finish_reason", ""), ("finish_reason", "bogus")],
)
def test_a_store_of_invalid_data_is_refused_naming_the_field(stub, field: str, value: object) -> None:
    key = chat_key("Name a primary color.", f"t-invalid-{field}-{value}")
    req = cache_pb2.StoreRequest(
        key=key, response="Blue.", finish_reason="stop", prompt_tokens=5, completion_tokens=2
    )
    setattr(req, field, value)
    with pytest.raises(grpc.RpcError) as err:
        stub.Store(req, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details()
    assert not lookup(stub, key).hit


def test_a_store_over_the_size_caps_is_refused(stub) -> None:
    """At most 1 MiB of response (CACHE_MAX_RESPONSE_BYTES) and MAX_MESSAGES messages: far above any
    answer or conversation the model's context holds."""
    key = chat_key("Write me a long story.", "t-caps")
    at_cap = cache_pb2.StoreRequest(key=key, response="x" * (1 << 20), finish_reason="length")
    assert stub.Store(at_cap, timeout=30).stored
    over = cache_pb2.StoreRequest(key=key, response="x" * ((1 << 20) + 1), finish_reason="length")
    with pytest.raises(grpc.RpcError) as err:
        stub.Store(over, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "response" in err.value.details()
    history = [("user", "Go on."), ("assistant", "And then?")] * (MAX_MESSAGES // 2)
    assert store(stub, chat_key("The end?", "t-caps", history[:-1]), "Yes.").stored
    with pytest.raises(grpc.RpcError) as err:
        store(stub, chat_key("The end?", "t-caps", history), "Yes.")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "messages" in err.value.details()


def test_expired_entries_are_not_served(stub) -> None:
    key = chat_key("What is the speed of light?", "t-ttl")
    store(stub, key, "299,792 km/s", ttl=1)
    assert lookup(stub, key).hit
    time.sleep(2.2)
    assert not lookup(stub, key).hit
    assert not lookup(stub, chat_key("How fast does light travel?", "t-ttl")).hit


def test_invalidate_one_entry(stub) -> None:
    a = store(stub, chat_key("How do I cancel my subscription?", "t-inv"), "Billing > Cancel.")
    store(stub, chat_key("How do I export my data?", "t-inv"), "Settings > Export.")
    removed = stub.Invalidate(cache_pb2.InvalidateRequest(entry_id=a.entry_id), timeout=10)
    assert removed.removed == 1
    assert not lookup(stub, chat_key("How do I cancel my subscription?", "t-inv")).hit
    assert not lookup(stub, chat_key("How can I cancel my subscription?", "t-inv")).hit
    assert lookup(stub, chat_key("How do I export my data?", "t-inv")).hit


def test_invalidate_scope(stub) -> None:
    for q in ("Which plan am I on?", "When does my subscription renew?", "What is my shipping address?"):
        store(stub, chat_key(q, "tenant-gone"), "answer")
    store(stub, chat_key("Which plan am I on?", "tenant-kept"), "Pro")
    removed = stub.Invalidate(cache_pb2.InvalidateRequest(scope="tenant-gone"), timeout=10)
    assert removed.removed == 3
    assert not lookup(stub, chat_key("Which plan am I on?", "tenant-gone")).hit
    assert not lookup(stub, chat_key("What plan am I on?", "tenant-gone")).hit
    assert lookup(stub, chat_key("Which plan am I on?", "tenant-kept")).hit


def test_bad_requests_are_invalid_argument(stub) -> None:
    for key in (
        cache_pb2.CacheKey(model="m", scope="s"),  # neither messages nor prompt
        cache_pb2.CacheKey(scope="s", prompt="hi"),  # no model
        cache_pb2.CacheKey(model="m", scope="s", messages=[cache_pb2.Message(role="system", content="x")]),
    ):
        with pytest.raises(grpc.RpcError) as err:
            stub.Lookup(cache_pb2.LookupRequest(key=key), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        stub.Invalidate(cache_pb2.InvalidateRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_completion_prompts_are_cached_apart_from_chat(stub) -> None:
    prompt_key = cache_pb2.CacheKey(model="m", scope="t-prompt", prompt="The capital of France is")
    store(stub, prompt_key, " Paris.")
    assert lookup(stub, prompt_key).hit
    assert not lookup(stub, chat_key("The capital of France is", "t-prompt")).hit


@pytest.mark.parametrize(
    "asked",
    [
        "def add(a, b):\n    return a *",  # a sign the canonical key drops
        "def add(a, b):\n    return a ",  # a trailing space, which the chat tiers drop
        "def add(a, b):\n    return a\n",
        "DEF ADD(A, B):\n    RETURN A",
        "def add(a, b):\n    return a.",
        "def add(a, b):\n  return a",  # other spacing
    ],
)
def test_a_completion_prompt_hits_only_byte_for_byte(stub, asked: str) -> None:
    """A prompt is text to continue: whatever differs changes what follows it."""
    stored = "def add(a, b):\n    return a"
    store(stub, cache_pb2.CacheKey(model="m", scope="t-raw", prompt=stored), " + b")
    assert lookup(stub, cache_pb2.CacheKey(model="m", scope="t-raw", prompt=stored)).exact
    assert not lookup(stub, cache_pb2.CacheKey(model="m", scope="t-raw", prompt=asked)).hit


def test_health_and_reflection(cache_service: CacheService) -> None:
    methods = serving_with_reflection(cache_service.addr, "llmserve.cache.v1.SemanticCache")
    assert methods == {"Lookup", "Store", "Invalidate", "GetStats"}
    methods = serving_with_reflection(cache_service.addr, "llmserve.cache.v1.Embeddings")
    assert methods == {"Embed", "GetEmbeddingModel"}


def test_stats_and_metrics(stub, cache_service: CacheService) -> None:
    before = stub.GetStats(cache_pb2.CacheStatsRequest(), timeout=5)
    store(stub, chat_key("What is the largest ocean?", "t-stats"), "The Pacific.")
    lookup(stub, chat_key("What is the largest ocean?", "t-stats"))
    lookup(stub, chat_key("How do volcanoes form?", "t-stats"))
    after = stub.GetStats(cache_pb2.CacheStatsRequest(), timeout=5)
    assert (after.stores - before.stores, after.lookups - before.lookups) == (1, 2)
    assert (after.hits - before.hits, after.misses - before.misses) == (1, 1)
    assert after.entries >= 1
    text = urllib.request.urlopen(cache_service.metrics_url, timeout=5).read().decode()
    for name in (
        "llmserve_cache_lookups_total",
        "llmserve_cache_hits_total",
        "llmserve_cache_misses_total",
        "llmserve_cache_stores_total",
        "llmserve_cache_entries",
        "llmserve_cache_embedding_seconds_bucket",
        "llmserve_cache_embedding_batches_total",
        "llmserve_cache_embedding_inputs_total",
        "llmserve_cache_lookup_seconds_bucket",
        'llmserve_cache_artifact_info{artifact="calibration"',
    ):
        assert name in text


def test_long_queries_hit_only_exactly(stub) -> None:
    text = "Summarize the following notes. " + "The meeting covered budgets, hiring and the roadmap. " * 25
    store(stub, chat_key(text, "t-long"), "A summary.")
    assert lookup(stub, chat_key(text.upper(), "t-long")).exact
    assert not lookup(stub, chat_key(text + " Thanks!", "t-long")).hit


def _metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


LOOKUP_INPUTS = 'llmserve_cache_embedding_inputs_total{kind="lookup"}'
MEMO_HITS = "llmserve_cache_embedding_memo_hits_total"


ERRORS = 'llmserve_cache_errors_total{method="Lookup"}'
INVALID = 'llmserve_cache_invalid_requests_total{method="Lookup"}'
LOOKUPS = "llmserve_cache_lookups_total"


def test_a_malformed_lookup_is_no_service_error_and_no_lookup(stub, cache_service: CacheService) -> None:
    """A client's mistake is counted apart from the service's failures, and a lookup refused for its level
    is no lookup: lookups stay hits + misses."""
    url = cache_service.metrics_url
    before = {name: _metric(url, name) for name in (ERRORS, INVALID, LOOKUPS)}
    stats = stub.GetStats(cache_pb2.CacheStatsRequest(), timeout=5)
    for request in (
        cache_pb2.LookupRequest(key=cache_pb2.CacheKey(model="m", scope="t-malformed")),
        cache_pb2.LookupRequest(key=chat_key("Is it raining?", "t-malformed"), level="anything"),
    ):
        with pytest.raises(grpc.RpcError) as err:
            stub.Lookup(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = {name: _metric(url, name) - before[name] for name in before}
    assert after == {ERRORS: 0, INVALID: 2, LOOKUPS: 0}
    assert stub.GetStats(cache_pb2.CacheStatsRequest(), timeout=5).lookups == stats.lookups


def test_a_huge_earlier_turn_is_matched_by_its_text_and_quickly(stub, cache_service: CacheService) -> None:
    """An earlier turn of ~950 KB held the event loop for ~3 s per call while it was canonicalized: a long
    earlier turn is now matched by its normalized text, and the short question is embedded alone."""
    huge = "tell me about cats " * 50000
    history = [("user", huge), ("assistant", "Cats are small carnivores.")]
    url = cache_service.metrics_url
    encoded = _metric(url, LOOKUP_INPUTS)
    started = time.perf_counter()
    assert not lookup(stub, chat_key("What do they eat?", "t-huge", history)).hit
    assert store(stub, chat_key("What do they eat?", "t-huge", history), "Mostly meat.").stored
    retyped = [("user", huge.upper()), ("assistant", "cats are small carnivores")]
    assert lookup(stub, chat_key("what do they eat", "t-huge", retyped)).exact
    changed = [("user", huge + "and dogs"), ("assistant", "Cats are small carnivores.")]
    assert not lookup(stub, chat_key("What do they eat?", "t-huge", changed)).hit
    assert time.perf_counter() - started < 2.0
    assert _metric(url, LOOKUP_INPUTS) - encoded <= 2  # the questions, never the long turn


def test_lookups_are_served_while_a_long_embeddings_input_is_tokenized(stub, cache_service) -> None:
    """/v1/embeddings inputs were tokenized on the service's event loop: ~1 MB of text held every
    tenant's lookups for as long (~0.8 s). The lookup sent after it now comes back first."""
    with grpc.insecure_channel(cache_service.addr) as channel:
        embeddings = cache_pb2_grpc.EmbeddingsStub(channel)
        model = embeddings.GetEmbeddingModel(cache_pb2.EmbeddingModelRequest(), timeout=120).model
        text = "The quick brown fox jumps over the lazy dog. " * 21000  # ~210,000 tokens: refused as too long
        request = cache_pb2.EmbedRequest(model=model, inputs=[cache_pb2.EmbedInput(text=text)])
        pending = embeddings.Embed.future(request, timeout=60)
        time.sleep(0.1)  # the Embed is being tokenized
        assert not lookup(stub, chat_key("Is the embeddings call still running?", "t-loop")).hit
        assert not pending.done()
        with pytest.raises(grpc.RpcError) as refused:
            pending.result()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most" in refused.value.details()


def test_a_semantic_hit_runs_the_model_once(stub, cache_service: CacheService) -> None:
    """The stored question was embedded when it was stored: the only text encoded is the query."""
    store(stub, chat_key("How do I clear my browser cache?", "t-once"), "Settings > Privacy > Clear data.")
    url = cache_service.metrics_url
    encoded = _metric(url, LOOKUP_INPUTS)
    hit = lookup(stub, chat_key("What is the way to clear my browser cache?", "t-once"))
    assert hit.hit and not hit.exact
    assert _metric(url, LOOKUP_INPUTS) - encoded == 1


def test_a_store_after_a_missed_lookup_reuses_its_vector(stub, cache_service: CacheService) -> None:
    """The gateway stores the answer of a lookup that missed: the question was embedded a moment ago."""
    store(stub, chat_key("How do I water a cactus?", "t-memo"), "Rarely.")
    url = cache_service.metrics_url
    encoded, remembered = _metric(url, LOOKUP_INPUTS), _metric(url, MEMO_HITS)
    key = chat_key("How do I repot an orchid?", "t-memo")
    assert not lookup(stub, key).hit
    assert store(stub, key, "Gently.").stored
    assert _metric(url, LOOKUP_INPUTS) - encoded == 1
    assert _metric(url, MEMO_HITS) - remembered == 1


def test_a_question_inside_framing_hits_and_context_does_not(stub) -> None:
    """Neither a canonical key in common nor the vetoes' consent for the whole message ("a detail differs");
    its question's own run passes them."""
    store(stub, chat_key("How do I descale a kettle?", "t-framing"), "Boil vinegar and water in it.")
    framed = lookup(
        stub, chat_key("Ok, tired dad here, bear with me. How do I descale a kettle?", "t-framing")
    )
    assert framed.hit and framed.tier == "semantic"
    assert framed.response == "Boil vinegar and water in it."
    context = chat_key("How do I descale a kettle? Mine is a glass kettle from 1998.", "t-framing")
    assert not lookup(stub, context).hit


def test_an_embeddings_input_with_neither_text_nor_token_ids_is_refused(cache_service: CacheService) -> None:
    """An EmbedInput left unset is a client's mistake: it was read as the empty text and got that vector.
    The empty text set on purpose is still embedded (its special tokens alone)."""
    with grpc.insecure_channel(cache_service.addr) as channel:
        embeddings = cache_pb2_grpc.EmbeddingsStub(channel)
        model = embeddings.GetEmbeddingModel(cache_pb2.EmbeddingModelRequest(), timeout=120).model
        unset = [cache_pb2.EmbedInput(text="hello"), cache_pb2.EmbedInput()]
        with pytest.raises(grpc.RpcError) as refused:
            embeddings.Embed(cache_pb2.EmbedRequest(model=model, inputs=unset), timeout=60)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "input 1" in refused.value.details()
        empty = embeddings.Embed(
            cache_pb2.EmbedRequest(model=model, inputs=[cache_pb2.EmbedInput(text="")]), timeout=60
        )
        assert empty.embeddings[0].tokens == 2
