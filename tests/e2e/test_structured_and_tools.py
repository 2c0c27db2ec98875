"""Structured output, tool calling and the remaining client fields, through the real gateway and worker
with the official openai SDK (and httpx for the routes the SDK has no call for)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import openai
import pytest

from scripts.launch import MODEL_NAME, Service
from tests.e2e.sample_schemas import CHAT_WEATHER_TOOL, Capital

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_TOOL = CHAT_WEATHER_TOOL


@pytest.fixture(scope="module")
def client(gateway: Service) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.addr}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def test_parse_with_pydantic_model(client: openai.OpenAI) -> None:
    reply = client.chat.completions.parse(
        model=MODEL_NAME, messages=QUESTION, response_format=Capital, max_tokens=40, temperature=0
    )
    parsed = reply.choices[0].message.parsed
    assert isinstance(parsed, Capital)
    assert reply.choices[0].finish_reason == "stop"


def test_json_schema_streams(client: openai.OpenAI) -> None:
    # No other properties: a sample may otherwise add keys until max_tokens (how many depends on the CPU's
    # rounding: on an AVX2 machine, int8 weights, this seed added a "languages" list and was cut off).
    schema = {**Capital.model_json_schema(), "additionalProperties": False}
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=QUESTION,
        max_tokens=40,
        temperature=0.7,
        seed=3,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": schema}},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    Capital.model_validate_json(text)


def test_regex_and_choice(client: openai.OpenAI) -> None:
    phone = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Give me a phone number."}],
        max_tokens=20,
        temperature=1.0,
        extra_body={"guided_regex": "[0-9]{3}-[0-9]{4}"},
    )
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", phone.choices[0].message.content)
    answer = client.completions.create(
        model=MODEL_NAME,
        prompt="Is the sky blue? Answer:",
        max_tokens=5,
        n=3,
        temperature=1.0,
        extra_body={"guided_choice": ["yes", "no", "maybe"]},
    )
    assert {c.text for c in answer.choices} <= {"yes", "no", "maybe"}


def test_invalid_schema_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL_NAME, messages=QUESTION, max_tokens=5, extra_body={"guided_regex": "(unclosed"}
        )


def test_tool_round_trip(client: openai.OpenAI) -> None:
    messages: list = [{"role": "user", "content": "What is the weather like in Paris?"}]
    first = client.chat.completions.create(
        model=MODEL_NAME,
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=40,
        temperature=0,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments)["city"] in ("Paris", "London", "Rome")
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append(
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 21, "sky": "sunny"}'}
    )
    second = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, tools=[WEATHER_TOOL], max_tokens=24, temperature=0
    )
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls


def test_named_tool_streams_as_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Weather in Rome?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=30,
        temperature=0,
        stream=True,
    )
    deltas, finish = [], None
    for chunk in stream:
        if chunk.choices:
            deltas.extend(chunk.choices[0].delta.tool_calls or [])
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments)["city"] in ("Paris", "London", "Rome")


def test_logit_bias_forces_a_token(client: openai.OpenAI, gateway: Service) -> None:
    ids = httpx.post(
        f"{gateway.addr}/tokenize", timeout=60, json={"prompt": " blue", "add_special_tokens": False}
    ).json()
    token = ids["tokens"][0]
    reply = client.completions.create(
        model=MODEL_NAME, prompt="The sky is", max_tokens=3, temperature=0, logit_bias={str(token): 100}
    )
    assert reply.choices[0].text == " blue" * 3


def test_echo_and_prompt_list(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL_NAME,
        prompt=["The capital of France is", "One, two,"],
        max_tokens=3,
        temperature=0,
        echo=True,
    )
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.choices[0].text.startswith("The capital of France is")
    assert reply.choices[1].text.startswith("One, two,")
    single = client.completions.create(model=MODEL_NAME, prompt="One, two,", max_tokens=3, temperature=0)
    assert reply.usage.prompt_tokens > single.usage.prompt_tokens


def test_n_with_streaming(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=QUESTION, n=2, max_tokens=5, temperature=1.0, stream=True
    )
    finished = {c.choices[0].index for c in stream if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}


def test_tokenize_detokenize(gateway: Service) -> None:
    chat = httpx.post(
        f"{gateway.addr}/tokenize", timeout=60, json={"model": MODEL_NAME, "messages": QUESTION}
    ).json()
    assert chat["count"] == len(chat["tokens"]) > 5 and chat["max_model_len"] > 0
    text = httpx.post(
        f"{gateway.addr}/tokenize", timeout=60, json={"prompt": "Hello world", "return_token_strs": True}
    )
    body = text.json()
    assert "".join(body["token_strs"]).replace("Ġ", " ").endswith("world")
    back = httpx.post(f"{gateway.addr}/detokenize", timeout=60, json={"tokens": body["tokens"]}).json()
    assert back["prompt"].endswith("Hello world")
    assert httpx.post(f"{gateway.addr}/tokenize", timeout=60, json={}).status_code == 400


def test_unsupported_fields_are_named(gateway: Service) -> None:
    body = {"model": MODEL_NAME, "messages": QUESTION, "max_tokens": 2, "functions": [{"name": "f"}]}
    refused = httpx.post(f"{gateway.addr}/v1/chat/completions", json=body, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "functions"
    harmless = {
        "model": MODEL_NAME,
        "messages": QUESTION,
        "max_tokens": 2,
        "store": True,
        "metadata": {"a": "b"},
    }
    assert httpx.post(f"{gateway.addr}/v1/chat/completions", json=harmless, timeout=60).status_code == 200


def test_continue_final_message_continues_the_assistants_message(
    client: openai.OpenAI, gateway: Service
) -> None:
    """vLLM's continue_final_message: the reply goes on from the assistant's own start, the prompt being the
    messages with that last one left open, which /tokenize renders alike (and greedy text from those very ids
    through /v1/completions is the same reply)."""
    messages = [
        {"role": "user", "content": "Count from one to ten."},
        {"role": "assistant", "content": "1, 2, 3,"},
    ]
    options = {"add_generation_prompt": False, "continue_final_message": True}
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0, extra_body=options
    )
    with httpx.Client(base_url=gateway.addr, timeout=60) as http:
        rendered = http.post("/tokenize", json={"model": MODEL_NAME, "messages": messages} | options).json()
        default = http.post("/tokenize", json={"model": MODEL_NAME, "messages": messages}).json()
        text = http.post("/detokenize", json={"model": MODEL_NAME, "tokens": rendered["tokens"]}).json()
    assert text["prompt"].endswith("<|im_start|>assistant\n1, 2, 3,")  # left open: no end of turn
    assert reply.usage.prompt_tokens == rendered["count"] < default["count"]  # no end-of-turn, no new turn
    same_ids = client.completions.create(
        model=MODEL_NAME, prompt=rendered["tokens"], max_tokens=8, temperature=0
    )
    assert reply.choices[0].message.content == same_ids.choices[0].text
    opened = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0)
    assert opened.usage.prompt_tokens == default["count"]
