"""Request validation and conversion in the gateway, with no process or socket."""

from __future__ import annotations

import json

import pytest

from gateway.errors import APIError
from gateway.limits import RequestLimits
from gateway.protocol import ChatCompletionRequest, CompletionRequest, parse_request
from gateway.semantic import scope_of
from gateway.worker_request import chat_request, completion_request

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def chat(**fields: object) -> ChatCompletionRequest:
    return parse_request(ChatCompletionRequest, json.dumps(CHAT | fields).encode())


def refused(model: type, body: dict | bytes) -> APIError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(APIError) as info:
        parse_request(model, raw)
    assert info.value.status == 400
    return info.value


def test_unknown_fields_are_ignored() -> None:
    assert chat(foo=1, logit_bias={"1": 2}).model == "m"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": "0.5"}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop": {"a": 1}}, "stop"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logprobs": 1}, "logprobs"),
        ({"frequency_penalty": 2.1}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"top_k": -2}, "top_k"),
        ({"stream_options": {"include_usage": "yes"}, "stream": True}, "stream_options"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # only with stream: true
        ({"stream_options": {"include_usage": True}, "stream": False}, "stream_options"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages"),
        ({"seed": 2**64}, "seed"),
        ({"messages": [{"role": "tool", "content": "42"}]}, "messages"),  # no tool_call_id
        ({"messages": [{"role": "assistant", "content": None}]}, "messages"),  # no content, no tool_calls
        ({"messages": [{"role": "assistant"}]}, "messages"),
        ({"tools": []}, "tools"),
    ],
)
def test_chat_refusals_name_the_parameter(fields: dict, param: str) -> None:
    error = refused(ChatCompletionRequest, CHAT | fields)
    assert error.param == param
    assert error.body()["error"]["type"] == "invalid_request_error"


def test_stream_options_need_stream_on_both_endpoints() -> None:
    error = refused(CompletionRequest, {"model": "m", "prompt": "hi", "stream_options": {}})
    assert error.param == "stream_options"
    assert error.message == "Stream options can only be defined when `stream=True`."
    assert chat(stream=True, stream_options={"include_usage": True}).include_usage


def test_bad_json_and_missing_fields() -> None:
    assert "not valid JSON" in refused(ChatCompletionRequest, b"{oops").message
    assert refused(ChatCompletionRequest, {"messages": CHAT["messages"]}).param == "model"
    assert refused(CompletionRequest, {"model": "m"}).param == "prompt"


def test_completion_prompt_forms() -> None:
    def prompt_of(prompt: object) -> object:
        return parse_request(
            CompletionRequest, json.dumps({"model": "m", "prompt": prompt}).encode()
        ).single_prompt()

    assert prompt_of("hi") == "hi"
    assert prompt_of(["hi"]) == "hi"
    assert prompt_of([1, 2, 3]) == [1, 2, 3]
    assert prompt_of([[4, 5]]) == [4, 5]
    for batch in (["a", "b"], [[1], [2, 3]]):
        req = parse_request(CompletionRequest, json.dumps({"model": "m", "prompt": batch}).encode())
        assert req.prompts() == batch
    for bad in ([], [1, -1], 5):
        assert refused(CompletionRequest, {"model": "m", "prompt": bad}).param == "prompt"


SMALL = RequestLimits(max_prompts=3, max_prompt_chars=10, max_total_tokens=8)


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        # Each prompt of a list runs: the limits count all of them, not the first one alone.
        ({"prompt": ["y" * 6, "y" * 6], "max_tokens": 1}, "prompt", "got 12"),
        ({"prompt": [[1] * 6, [2] * 6], "max_tokens": 1}, "prompt", "got 12"),  # token ids count one each
        ({"prompt": ["a"] * 4, "max_tokens": 1}, "prompt", "at most 3 prompts"),
        ({"prompt": ["a", "b"], "max_tokens": 5}, "max_tokens", "for each of 2 prompts"),
        ({"prompt": ["a", "b"]}, "max_tokens", "1 x 16 for each"),  # unset: OpenAI's default of 16
        ({"prompt": ["a", "b"], "max_tokens": None}, "max_tokens", "1 x 2048 for each"),  # null: the context
        ({"prompt": ["a", "b"], "n": 2, "max_tokens": 3}, "max_tokens", "2 x 3 for each of 2 prompts"),
    ],
)
def test_a_list_of_prompts_counts_every_prompt(fields: dict, param: str, words: str) -> None:
    with pytest.raises(APIError) as info:
        parse_request(CompletionRequest, json.dumps({"model": "m"} | fields).encode(), SMALL, 2048)
    assert (info.value.status, info.value.param) == (400, param)
    assert words in info.value.message


def test_a_list_of_prompts_within_the_limits_is_accepted() -> None:
    body = {"model": "m", "prompt": ["abc", "def", "ghi"], "max_tokens": 2}
    assert len(parse_request(CompletionRequest, json.dumps(body).encode(), SMALL, 2048).prompts()) == 3


def test_malformed_messages_say_which_one_and_what_is_missing() -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},  # content may be null with tool_calls
        {"role": "tool", "content": "42"},
    ]
    assert refused(ChatCompletionRequest, CHAT | {"messages": messages}).message == (
        "messages.2: tool_call_id is required for a 'tool' message"
    )
    assert chat(messages=messages[:2] + [messages[2] | {"tool_call_id": "call_1"}]).messages[1].tool_calls


def test_text_parts_are_joined() -> None:
    req = chat(
        messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    )
    assert req.messages[0].text() == "ab"


def test_chat_to_worker_request() -> None:
    req = chat(
        max_tokens=5,
        max_completion_tokens=7,
        temperature=0.0,
        stop="x",
        top_k=-1,
        logprobs=True,
        top_logprobs=2,
        n=2,
        seed=9,
        ignore_eos=True,
        min_tokens=1,
    )
    out = chat_request(req, "rid", "m")
    assert out.WhichOneof("prompt") == "chat" and out.chat.messages[0].content == "hi"
    p = out.params
    assert (p.max_tokens, p.temperature, list(p.stop), p.top_k, p.logprobs, p.n, p.seed) == (
        7,
        0.0,
        ["x"],
        0,
        2,
        2,
        9,
    )
    assert p.ignore_eos and p.min_tokens == 1
    assert not p.HasField("top_p") and not p.HasField("presence_penalty"), (
        "unset stays unset: engine defaults"
    )


def test_chat_logprobs_false_sends_none() -> None:
    assert not chat_request(chat(logprobs=False), "r", "m").params.HasField("logprobs")
    assert chat_request(chat(logprobs=True), "r", "m").params.logprobs == 0


def test_completion_to_worker_request() -> None:
    req = parse_request(
        CompletionRequest, b'{"model": "m", "prompt": [1, 2], "logprobs": 0, "stop": ["a", "b"]}'
    )
    out = completion_request(req, "rid", "m")
    assert list(out.token_ids.ids) == [1, 2]
    assert out.params.logprobs == 0 and list(out.params.stop) == ["a", "b"]


def test_completions_default_to_16_tokens_and_chat_to_the_context() -> None:
    """OpenAI's and vLLM's defaults: 16 tokens for legacy completions, none (the context) for chat."""
    completion = parse_request(CompletionRequest, b'{"model": "m", "prompt": "hi there"}')
    assert completion_request(completion, "rid", "m").params.max_tokens == 16
    unbounded = parse_request(CompletionRequest, b'{"model": "m", "prompt": "hi", "max_tokens": null}')
    assert not completion_request(unbounded, "rid", "m").params.HasField("max_tokens")
    assert not chat_request(chat(), "rid", "m").params.HasField("max_tokens")


def test_max_tokens_zero_only_scores_an_echoed_prompt() -> None:
    """OpenAI's legacy scoring call (echo, max_tokens 0) asks the worker for the prompt only, with prompt
    logprobs (the contract's condition); without echo, and on chat, 0 is refused as by vLLM."""
    body = {"model": "m", "prompt": "hi", "max_tokens": 0, "echo": True}
    params = completion_request(parse_request(CompletionRequest, json.dumps(body).encode()), "r", "m").params
    assert (params.max_tokens, params.prompt_logprobs) == (0, 0)
    assert refused(CompletionRequest, body | {"echo": False}).param == "max_tokens"
    assert refused(ChatCompletionRequest, CHAT | {"max_tokens": 0}).param == "max_tokens"


def test_cache_scope() -> None:
    key = scope_of("Bearer k1", None)
    assert len(key) == 64 and key != scope_of("Bearer k2", None) and key == scope_of("bearer  k1 ", None)
    # one key shared by every client: the users it names stay apart (they shared one scope)
    assert len({scope_of("Bearer k1", "bob"), scope_of("Bearer k1", "alice"), key}) == 3
    assert scope_of(None, "bob") != scope_of("Bearer k1", "bob") != scope_of(None, None) == "anonymous"
    assert scope_of(None, "anonymous") != "anonymous"  # a user's name never reaches another form's scope
    assert scope_of(None, key) != key
