"""Inputs that used to be answered with 200 are refused with a 400 naming the parameter; the
defaults and GATEWAY_MAX_* settings decide where the bounds are."""

from __future__ import annotations

import httpx
import pytest

from scripts.launch import MODEL_NAME, Service, start_gateway
from tests.e2e.test_gateway_errors import assert_openai_error

CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"messages": [{"role": "user"}]}, "messages"),
        ({"messages": [{"role": "system", "content": None}, {"role": "user", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "tool", "tool_call_id": "c1"}]}, "messages"),
        ({"stop": [f"s{i}" for i in range(1000)]}, "stop"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": "x" * 257}, "stop"),
        ({"n": 64, "max_tokens": 2048}, "max_tokens"),
        ({"n": 64, "max_tokens": None}, "n"),
    ],
)
def test_refused_with_the_parameter_named(http: httpx.Client, change: dict, param: str) -> None:
    body = {k: v for k, v in (CHAT | change).items() if v is not None}
    assert_openai_error(http.post("/v1/chat/completions", json=body), 400, param)


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"prompt": ["a"] * 129}, "prompt"),  # GATEWAY_MAX_PROMPTS: each prompt of a list runs
        ({"prompt": ["a"] * 64, "max_tokens": 2048}, "max_tokens"),  # 64 x 2048 > 65536: all prompts count
    ],
)
def test_a_list_of_prompts_is_bounded_as_a_whole(http: httpx.Client, change: dict, param: str) -> None:
    body = {"model": MODEL_NAME, "max_tokens": 2} | change
    assert_openai_error(http.post("/v1/completions", json=body), 400, param)


def test_an_assistant_message_may_have_no_content_only_when_it_calls_tools(http: httpx.Client) -> None:
    """As OpenAI's API: content null needs tool_calls (else 400 naming the messages)."""
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "user", "content": "Again"},
    ]
    response = http.post("/v1/chat/completions", json=CHAT | {"messages": messages})
    assert response.status_code == 200, response.text
    messages[1] = {"role": "assistant", "content": None}
    refused = http.post("/v1/chat/completions", json=CHAT | {"messages": messages})
    assert_openai_error(refused, 400, "messages")


def test_four_stop_strings_are_fine(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json=CHAT | {"stop": ["a", "b", "c", "d"]})
    assert response.status_code == 200, response.text


def test_limits_follow_the_settings(worker: Service, log_dir) -> None:
    env = {
        "GATEWAY_MAX_STOP": "1",
        "GATEWAY_MAX_MESSAGES": "2",
        "GATEWAY_MAX_PROMPT_CHARS": "10",
        "GATEWAY_MAX_TOTAL_TOKENS": "4",
        "GATEWAY_MAX_PROMPTS": "2",
    }
    gateway = start_gateway("gateway-small-limits", log_dir, worker.addr, **env)
    try:
        with httpx.Client(base_url=gateway.addr, timeout=60) as client:
            chat = "/v1/chat/completions"
            assert client.post(chat, json=CHAT | {"stop": ["a"]}).status_code == 200
            assert_openai_error(client.post(chat, json=CHAT | {"stop": ["a", "b"]}), 400, "stop")
            three = [{"role": "user", "content": "a"}] * 3
            assert_openai_error(client.post(chat, json=CHAT | {"messages": three}), 400, "messages")
            long = [{"role": "user", "content": "x" * 11}]
            assert_openai_error(client.post(chat, json=CHAT | {"messages": long}), 400, "messages")
            assert_openai_error(client.post(chat, json=CHAT | {"n": 3}), 400, "max_tokens")
            prompt = {"model": MODEL_NAME, "prompt": "y" * 11, "max_tokens": 1}
            assert_openai_error(client.post("/v1/completions", json=prompt), 400, "prompt")
            split = prompt | {"prompt": ["y" * 6, "y" * 5]}  # 11 characters over two prompts
            assert_openai_error(client.post("/v1/completions", json=split), 400, "prompt")
            three = prompt | {"prompt": ["a", "b", "c"]}
            assert_openai_error(client.post("/v1/completions", json=three), 400, "prompt")
    finally:
        gateway.stop()
