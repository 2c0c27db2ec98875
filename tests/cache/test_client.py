"""The gateway-side client: key building (pure) and behaviour against a live and a dead service."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from gateway.cache_client import SemanticCacheClient, build_cache_key, params_fingerprint
from gateway.protocol import ChatCompletionRequest, CompletionRequest, parse_request
from gateway.semantic import SemanticCacheGate, output_params
from gateway.settings import GatewaySettings
from scripts.launch import free_port
from tests.cache.procs import CacheService

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of Italy?"},
]
GREEDY = {"temperature": 0.0}


def test_key_carries_conversation_and_params() -> None:
    key = build_cache_key("m", "tenant", messages=MESSAGES, params=GREEDY | {"max_tokens": 20})
    assert key is not None
    assert [(m.role, m.content) for m in key.messages] == [(m["role"], m["content"]) for m in MESSAGES]
    assert (key.model, key.scope) == ("m", "tenant")
    prompt_key = build_cache_key("m", "tenant", prompt="Once upon a time", params=GREEDY)
    assert prompt_key is not None and prompt_key.prompt == "Once upon a time" and not prompt_key.messages


def gate(**settings: object) -> SemanticCacheGate:
    return SemanticCacheGate(GatewaySettings(**settings))


def chat(**fields: object) -> ChatCompletionRequest:
    body = {"model": "m", "messages": MESSAGES} | fields
    return parse_request(ChatCompletionRequest, json.dumps(body).encode())


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0.0, "n": 2},
        {"temperature": 0.0, "logprobs": True},
        {"temperature": 0.0, "logprobs": True, "top_logprobs": 3},
        {"temperature": 0.0, "tools": [{"type": "function", "function": {"name": "f"}}]},
        {"temperature": 0.7},
        {},  # the engine's (OpenAI's) default temperature is 1
        {"temperature": 0.0, "add_generation_prompt": False},  # the same messages rendered otherwise
        {"temperature": 0.0, "truncate_prompt_tokens": 4},  # a part of the prompt
        {"temperature": 0.0, "chat_template_kwargs": {"date_string": "1 Dec 2026"}},  # template inputs
        {"temperature": 0.0, "documents": [{"text": "x"}]},
        {
            "temperature": 0.0,
            "messages": [*MESSAGES, {"role": "assistant", "content": "Paris"}],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    ],
)
def test_requests_whose_answer_may_not_be_reused(fields: dict) -> None:
    assert not gate().may_reuse(chat(**fields))


def test_prompt_logprobs_are_not_reused() -> None:
    body = {"model": "m", "prompt": "Once upon a time", "temperature": 0}
    assert gate().may_reuse(parse_request(CompletionRequest, json.dumps(body).encode()))
    with_prompt_logprobs = json.dumps(body | {"prompt_logprobs": 1}).encode()
    assert not gate().may_reuse(parse_request(CompletionRequest, with_prompt_logprobs))


def test_the_gateway_owns_the_temperature_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gate().may_reuse(chat(temperature=0.0))
    assert gate(cache_max_temperature=0.5).may_reuse(chat(temperature=0.5))
    assert not gate(cache_max_temperature=0.5).may_reuse(chat(temperature=0.6))
    monkeypatch.setenv("CACHE_MAX_TEMPERATURE", "0.7")
    assert GatewaySettings().cache_max_temperature == 0.7
    monkeypatch.setenv("CACHE_MAX_TEMPERATURE", "warm")  # refused at start-up, not read as 0
    with pytest.raises(ValidationError, match="cache_max_temperature"):
        GatewaySettings()
    monkeypatch.setenv("CACHE_MAX_TEMPERATURE", "-1")
    with pytest.raises(ValidationError, match="cache_max_temperature"):
        GatewaySettings()


def test_uncacheable_shapes() -> None:
    assert build_cache_key("m", "t", params=GREEDY) is None
    assert build_cache_key("m", "t", messages=[{"role": "system", "content": "x"}], params=GREEDY) is None
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert build_cache_key("m", "t", messages=parts, params=GREEDY) is None
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]}
    assert build_cache_key("m", "t", messages=[*MESSAGES, call, *MESSAGES], params=GREEDY) is None


def test_fingerprint_canonicalizes() -> None:
    assert params_fingerprint({}) == params_fingerprint({"top_p": 1.0, "stop": [], "seed": None})
    assert params_fingerprint({"stop": ["a", "b"]}) == params_fingerprint({"stop": ["b", "a"]})
    assert params_fingerprint({"stop": "a"}) == params_fingerprint({"stop": ["a"]})
    assert params_fingerprint({"max_tokens": 10}) != params_fingerprint({"max_tokens": 11})
    assert params_fingerprint({"seed": 1}) != params_fingerprint({})
    assert params_fingerprint({"temperature": 0.0}) == params_fingerprint({"temperature": 0.0001})
    # every output-shaping parameter counts, the grammar ones included
    assert params_fingerprint({"guided_regex": "a+"}) != params_fingerprint({})
    assert params_fingerprint({"stop_token_ids": [2]}) != params_fingerprint({"stop_token_ids": []})


def test_output_params_cover_the_grammar() -> None:
    free = params_fingerprint(output_params(chat(temperature=0)))
    assert free == params_fingerprint(output_params(chat(temperature=0, top_p=1.0, stop=[])))
    assert free != params_fingerprint(output_params(chat(temperature=0, guided_choice=["a", "b"])))
    json_mode = chat(temperature=0, response_format={"type": "json_object"})
    assert free != params_fingerprint(output_params(json_mode))
    # vLLM's text options: an answer cut before its stop string is not one that ends with it
    assert free == params_fingerprint(output_params(chat(temperature=0, skip_special_tokens=True)))
    assert free != params_fingerprint(output_params(chat(temperature=0, include_stop_str_in_output=True)))
    assert free != params_fingerprint(output_params(chat(temperature=0, skip_special_tokens=False)))


async def test_store_then_hit_through_the_client(cache_service: CacheService) -> None:
    errors: list[str] = []
    client = SemanticCacheClient(cache_service.addr, timeout_s=5.0, on_error=errors.append)
    try:
        key = build_cache_key("m", "client-t", messages=MESSAGES, params=GREEDY)
        assert await client.lookup(key) is None
        client.store_later(key, "Rome.", "stop", 12, 2)
        client.store_later(key, "partial", "abort", 12, 1)  # the service refuses an incomplete answer
        await client.drain()
        hit = await client.lookup(key)
        assert hit is not None
        assert (hit.text, hit.exact, hit.finish_reason, hit.prompt_tokens, hit.completion_tokens) == (
            "Rome.",
            True,
            "stop",
            12,
            2,
        )
        para = build_cache_key(
            "m",
            "client-t",
            params=GREEDY,
            messages=[MESSAGES[0], {"role": "user", "content": "Tell me the capital of Italy."}],
        )
        semantic = await client.lookup(para)
        assert semantic is not None and semantic.text == "Rome." and semantic.tier == "semantic"
        assert errors == []
    finally:
        await client.close()


async def test_dead_service_is_a_miss_not_an_error() -> None:
    errors: list[str] = []
    client = SemanticCacheClient(f"127.0.0.1:{free_port()}", timeout_s=0.2, on_error=errors.append)
    try:
        key = build_cache_key("m", "t", messages=MESSAGES, params=GREEDY)
        started = asyncio.get_running_loop().time()
        assert await client.lookup(key) is None
        assert asyncio.get_running_loop().time() - started < 2.0
        client.store_later(key, "Rome.", "stop", 1, 1)
        await client.drain()
        assert len(errors) == 2 and client.errors == 2
    finally:
        await client.close()
