"""The official openai SDK against a real worker and gateway: sync, async, stream, n, stop, seed, logprobs."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from scripts.launch import MODEL_NAME, Service

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(gateway: Service) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.addr}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def test_models_list(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME


def test_chat_completion(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, max_tokens=12, temperature=0)
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-") and reply.created > 0
    assert reply.model == MODEL_NAME
    assert "system_fingerprint" in reply.model_fields_set and reply.system_fingerprint is None  # as vLLM's
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage.prompt_tokens > 10 and 0 < usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_max_completion_tokens_and_vllm_extensions(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL_NAME,
        messages=QUESTION,
        max_completion_tokens=7,
        extra_body={
            "ignore_eos": True,
            "top_k": 5,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "min_tokens": 7,
        },
    )
    assert reply.usage.completion_tokens == 7
    assert reply.choices[0].finish_reason == "length"


async def test_async_chat_completion(gateway: Service) -> None:
    async with openai.AsyncOpenAI(base_url=f"{gateway.addr}/v1", api_key="unused", max_retries=0) as client:
        reply = await client.chat.completions.create(
            model=MODEL_NAME, messages=QUESTION, max_tokens=8, temperature=0
        )
        assert reply.choices[0].message.content
        stream = await client.completions.create(
            model=MODEL_NAME, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True
        )
        texts = [chunk.choices[0].text async for chunk in stream if chunk.choices]
        assert "Paris" in "".join(texts)


def test_streaming_with_usage(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, max_tokens=10, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=QUESTION,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_n_choices(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, max_tokens=6, n=3, seed=3)
    assert sorted(c.index for c in reply.choices) == [0, 1, 2]
    assert all(c.finish_reason for c in reply.choices)
    assert reply.usage.completion_tokens <= 18
    streamed = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=4, n=2, stream=True)
    indexes = {choice.index for chunk in streamed for choice in chunk.choices}
    assert indexes == {0, 1}


def test_stop(client: openai.OpenAI) -> None:
    prompt = "The capital of France is"
    free = (
        client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0)
        .choices[0]
        .text
    )
    stop_word = free.split()[1]
    for stop in (stop_word, [stop_word, "zzzz"]):
        reply = client.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0, stop=stop
        )
        assert reply.choices[0].finish_reason == "stop"
        assert stop_word not in reply.choices[0].text
        assert free.startswith(reply.choices[0].text)


def test_seed_repeats_a_sampled_answer(client: openai.OpenAI) -> None:
    def sample() -> str:
        reply = client.chat.completions.create(
            model=MODEL_NAME, messages=QUESTION, max_tokens=12, temperature=1.0, seed=4242
        )
        return reply.choices[0].message.content

    assert sample() == sample()


def test_chat_logprobs(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=QUESTION, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    for item in content:
        assert item.logprob <= 0.0 and bytes(item.bytes).decode(errors="replace")
        assert len(item.top_logprobs) == 3
        assert item.top_logprobs[0].token == item.token, "greedy picks the most likely token"


def test_completion_logprobs_legacy_shape(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL_NAME, prompt="The capital of France is", max_tokens=5, temperature=0, logprobs=2
    )
    choice = reply.choices[0]
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(5)]
    assert all(len(top) <= 2 and logprobs.tokens[i] in top for i, top in enumerate(logprobs.top_logprobs))
    sampled = (
        client.completions.create(
            model=MODEL_NAME, prompt="My favourite word is", max_tokens=8, temperature=2.0, seed=3, logprobs=0
        )
        .choices[0]
        .logprobs
    )
    assert [list(top) for top in sampled.top_logprobs] == [[token] for token in sampled.tokens]
    assert [top[token] for token, top in zip(sampled.tokens, sampled.top_logprobs, strict=True)] == (
        sampled.token_logprobs
    ), "logprobs=0: the sampled token's own entry, as OpenAI's and vLLM's"


def test_sdk_raises_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=QUESTION, max_tokens=2)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, max_tokens=2, temperature=5)
    assert info.value.body["param"] == "temperature"


def test_include_stop_str_in_output_keeps_the_matched_stop_string(client: openai.OpenAI) -> None:
    """vLLM's include_stop_str_in_output: the text ends with the stop string instead of before it."""

    def complete(**extra: object) -> openai.types.Completion:
        return client.completions.create(
            model=MODEL_NAME, prompt="The capital of France is", max_tokens=16, temperature=0, **extra
        )

    free = complete().choices[0].text
    stop = free.split()[2]  # a word inside the greedy text
    cut = complete(stop=[stop]).choices[0]
    kept = complete(stop=[stop], extra_body={"include_stop_str_in_output": True}).choices[0]
    assert cut.finish_reason == kept.finish_reason == "stop"
    assert cut.text == free[: free.index(stop)]
    assert kept.text == free[: free.index(stop) + len(stop)]


def test_special_tokens_reach_the_text_only_when_asked(client: openai.OpenAI) -> None:
    """vLLM's skip_special_tokens; the stop token that ends a reply (here EOS) stays out of the text unless
    include_stop_str_in_output asks for it, as in vLLM."""
    im_start, im_end = 1, 2  # SmolLM2's <|im_start|> and <|im_end|> (EOS)

    def chat(bias: int, **extra: object) -> openai.types.chat.ChatCompletion:
        return client.chat.completions.create(
            model=MODEL_NAME,
            messages=QUESTION,
            max_tokens=3,
            temperature=0,
            logit_bias={str(bias): 100},
            extra_body=extra,
        )

    assert chat(im_start).choices[0].message.content == ""
    assert chat(im_start, skip_special_tokens=False).choices[0].message.content == "<|im_start|>" * 3
    ended = chat(im_end, skip_special_tokens=False).choices[0]
    assert ended.finish_reason == "stop" and ended.message.content == ""
    kept = chat(im_end, skip_special_tokens=False, include_stop_str_in_output=True).choices[0]
    assert kept.message.content == "<|im_end|>"
    # logprobs cover the text: the stop token's with it, none without
    with_logprobs = {"logprobs": True, "skip_special_tokens": False}
    assert [
        p.token
        for p in chat(im_end, include_stop_str_in_output=True, **with_logprobs).choices[0].logprobs.content
    ] == ["<|im_end|>"]
    assert chat(im_end, **with_logprobs).choices[0].logprobs.content == []


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(
    client: openai.OpenAI, gateway: Service
) -> None:
    """vLLM's truncate_prompt_tokens: the prompt's last k tokens only, the same as sending those ids."""
    prompt = "Once upon a time, in a kingdom by the sea, there lived a king who loved to count his gold"
    with httpx.Client(base_url=gateway.addr, timeout=60) as http:
        ids = http.post("/tokenize", json={"model": MODEL_NAME, "prompt": prompt}).json()["tokens"]
    assert len(ids) > 8
    cut = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0, extra_body={"truncate_prompt_tokens": 8}
    )
    last = client.completions.create(model=MODEL_NAME, prompt=ids[-8:], max_tokens=6, temperature=0)
    assert cut.usage.prompt_tokens == 8 and cut.choices[0].text == last.choices[0].text
    whole = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=1, extra_body={"truncate_prompt_tokens": -1}
    )
    assert whole.usage.prompt_tokens == len(ids)  # shorter than the context: nothing to cut
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=QUESTION, max_tokens=1, extra_body={"truncate_prompt_tokens": 5}
    )
    assert chat.usage.prompt_tokens == 5


def test_allowed_token_ids_are_the_only_tokens_sampled(client: openai.OpenAI, gateway: Service) -> None:
    """vLLM's allowed_token_ids: every sampled token is one of them, greedy or not."""
    with httpx.Client(base_url=gateway.addr, timeout=60) as http:
        allowed = http.post("/tokenize", json={"model": MODEL_NAME, "prompt": " yes no"}).json()["tokens"]
    assert len(allowed) == 2
    for temperature in (0.0, 1.5):
        reply = client.completions.create(
            model=MODEL_NAME,
            prompt="Is the sky blue?",
            max_tokens=6,
            temperature=temperature,
            logprobs=0,
            extra_body={"allowed_token_ids": allowed},
        )
        tokens = reply.choices[0].logprobs.tokens
        assert len(tokens) == 6 and set(tokens) <= {" yes", " no"}, tokens


def test_text_cut_inside_a_character_is_the_same_streamed_whole_and_decoded(
    client: openai.OpenAI, gateway: Service
) -> None:
    """max_tokens inside a multi-byte character: the whole text, the streamed deltas joined and the decode of
    the ids agree (U+FFFD for the lone bytes, sent last), and no delta carries a U+FFFD before then."""
    with httpx.Client(base_url=gateway.addr, timeout=60) as http:
        party = http.post(
            "/tokenize", json={"model": MODEL_NAME, "prompt": "🎉", "add_special_tokens": False}
        )
        ids = party.json()["tokens"]
        decoded = http.post("/detokenize", json={"model": MODEL_NAME, "tokens": ids[:-1]}).json()["prompt"]
    assert len(ids) > 1 and decoded.endswith("\ufffd"), "the emoji must span tokens"
    body = {
        "model": MODEL_NAME,
        "prompt": "Party:",
        "max_tokens": len(ids) - 1,
        "temperature": 0,
        "extra_body": {"allowed_token_ids": ids[:-1]},
        "extra_headers": {"X-Semantic-Cache": "bypass"},
    }
    whole = client.completions.create(**body).choices[0]
    deltas = [c.choices[0].text for c in client.completions.create(**body, stream=True) if c.choices]
    assert whole.finish_reason == "length" and whole.text.endswith("\ufffd")
    assert "".join(deltas) == whole.text
    assert not any("\ufffd" in d for d in deltas[:-1])


def test_bad_words_are_not_generated(client: openai.OpenAI) -> None:
    """vLLM's bad_words: the greedy answer's own words, banned, are no longer in it."""

    def complete(**extra: object) -> str:
        return (
            client.completions.create(
                model=MODEL_NAME,
                prompt="My favourite animals are",
                max_tokens=12,
                temperature=0,
                extra_body=extra,
            )
            .choices[0]
            .text
        )

    free = complete()
    words = [w.strip(".,;:!?") for w in free.split()]
    banned = [w for w in words if len(w) > 2][:2]
    assert banned, free
    kept = complete(bad_words=banned)
    assert kept != free and not set(banned) & {w.strip(".,;:!?") for w in kept.split()}, (free, kept)
