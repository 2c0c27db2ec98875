"""Prompt logprobs on /v1/completions through the real gateway and worker, with the official openai SDK:
vLLM's `prompt_logprobs` field, and `echo` with `logprobs` (the prompt's tokens lead the legacy logprobs,
as in OpenAI's API)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import httpx
import openai
import pytest

from common.gen import worker_pb2_grpc
from scripts.launch import MODEL_NAME, Service
from tests.e2e.conftest import wait_for_idle

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(gateway: Service) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.addr}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def prompt_ids(gateway: Service, text: str) -> list[int]:
    return httpx.post(f"{gateway.addr}/tokenize", timeout=60, json={"prompt": text}).json()["tokens"]


def check_shape(entries: list, ids: list[int], k: int) -> None:
    """None first; then the prompt token (any rank) and the top k (ranks 1..k), keyed by token id."""
    assert entries[0] is None and len(entries) == len(ids)
    for token, entry in zip(ids[1:], entries[1:], strict=True):
        actual = entry[str(token)]
        assert actual["rank"] >= 1 and actual["logprob"] <= 0 and isinstance(actual["decoded_token"], str)
        top = sorted((e for e in entry.values() if e["rank"] <= k), key=lambda e: e["rank"])
        assert [e["rank"] for e in top] == list(range(1, k + 1))
        assert len(entry) == (k if actual["rank"] <= k else k + 1)
        assert all(a["logprob"] >= b["logprob"] for a, b in zip(top, top[1:], strict=False))


def test_prompt_logprobs_match_the_sampled_token_logprob(client: openai.OpenAI, gateway: Service) -> None:
    first = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=2
    ).choices[0]
    greedy_token, greedy_logprob = first.logprobs.tokens[0], first.logprobs.token_logprobs[0]
    extended = prompt_ids(gateway, PROMPT + greedy_token)
    reply = client.completions.create(
        model=MODEL_NAME, prompt=extended, max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 2}
    )
    entries = reply.choices[0].model_extra["prompt_logprobs"]
    check_shape(entries, extended, 2)
    # The prompt's last token is the one sampled above: the prefill row agrees with the decode row.
    last = entries[-1][str(extended[-1])]
    assert last["rank"] == 1 and last["decoded_token"] == greedy_token
    assert math.isclose(last["logprob"], greedy_logprob, abs_tol=2e-3)
    assert reply.choices[0].logprobs is None  # only what was asked for


def test_prompt_logprobs_bypass_the_prefix_cache(client: openai.OpenAI, gateway: Service) -> None:
    prompt = "Once upon a time, in a land far away, there lived a wise old owl who knew every song. " * 2
    client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1, temperature=0)  # fills the cache
    replies = [
        client.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=1, temperature=0, extra_body={"prompt_logprobs": 0}
        )
        for _ in range(2)
    ]
    ids = prompt_ids(gateway, prompt)
    for reply in replies:
        assert reply.usage.prompt_tokens_details.cached_tokens == 0
        check_shape(reply.choices[0].model_extra["prompt_logprobs"], ids, 0)
    first, second = (r.choices[0].model_extra["prompt_logprobs"] for r in replies)
    assert first == second
    cached = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1, temperature=0)
    assert cached.usage.prompt_tokens_details.cached_tokens > 0  # the cache itself still works


def test_echo_with_logprobs_leads_with_the_prompt(client: openai.OpenAI, gateway: Service) -> None:
    num_prompt = len(prompt_ids(gateway, PROMPT))
    reply = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=1
    )
    choice = choice_of(reply)
    lp = choice.logprobs
    assert choice.text.startswith(PROMPT)
    assert "".join(lp.tokens[:num_prompt]) == PROMPT
    assert "".join(lp.tokens) == choice.text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:]) and len(lp.tokens) == num_prompt + 3
    # up to k + 1 entries (OpenAI's legacy shape): the top one and the prompt token itself
    pairs = zip(lp.tokens[1:num_prompt], lp.top_logprobs[1:num_prompt], strict=True)
    assert all(token in top and 1 <= len(top) <= 2 for token, top in pairs)
    assert any(len(top) == 2 for top in lp.top_logprobs[1:num_prompt]), "some prompt token is not the top one"
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert "prompt_logprobs" not in (choice.model_extra or {})


def test_scoring_token_id_prompts_as_eval_harnesses_do(client: openai.OpenAI, gateway: Service) -> None:
    """lm-eval's loglikelihood request: token-id prompts in one call, echo, logprobs=1, max_tokens=1."""
    contexts = [prompt_ids(gateway, PROMPT + " Paris"), prompt_ids(gateway, "One, two, three")]
    reply = client.completions.create(
        model=MODEL_NAME, prompt=contexts, max_tokens=1, temperature=0, echo=True, logprobs=1
    )
    assert [c.index for c in reply.choices] == [0, 1]
    for ids, choice in zip(contexts, reply.choices, strict=True):
        lp = choice.logprobs
        assert len(lp.token_logprobs) == len(ids) + 1 and lp.token_logprobs[0] is None
        scored = lp.token_logprobs[1 : len(ids)]
        assert all(isinstance(v, float) and v <= 0 for v in scored)
        pairs = zip(lp.tokens[1:], lp.top_logprobs[1:], strict=True)
        greedy = [max(top, key=top.get) == token for token, top in pairs]
        assert len(greedy) == len(ids) and greedy[-1]  # the sampled token is the top one at temperature 0


def choice_of(reply):
    assert len(reply.choices) == 1
    return reply.choices[0]


def test_streaming_carries_them_on_the_first_chunk(client: openai.OpenAI, gateway: Service) -> None:
    ids = prompt_ids(gateway, PROMPT)
    stream = client.completions.create(
        model=MODEL_NAME,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        n=2,
        stream=True,
        echo=True,
        logprobs=0,
        extra_body={"prompt_logprobs": 1},
    )
    chunks = [c for c in stream if c.choices]
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == index]
        carrying = [c for c in mine if (c.model_extra or {}).get("prompt_logprobs") is not None]
        assert carrying == mine[:1]
        check_shape(mine[0].model_extra["prompt_logprobs"], ids, 1)
        tokens = [t for c in mine if c.logprobs for t in c.logprobs.tokens]
        assert "".join(tokens) == "".join(c.text for c in mine)
        assert mine[0].logprobs.token_logprobs[0] is None


def test_prompt_logprobs_refused_where_not_supported(gateway: Service) -> None:
    chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "prompt_logprobs": 1}
    refused = httpx.post(f"{gateway.addr}/v1/chat/completions", json=chat, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt_logprobs"
    too_many = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 21}
    refused = httpx.post(f"{gateway.addr}/v1/completions", json=too_many, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt_logprobs"


def test_echo_with_max_tokens_zero_scores_the_prompt(
    client: openai.OpenAI, gateway: Service, worker_stub: worker_pb2_grpc.WorkerStub
) -> None:
    """OpenAI's legacy scoring call: the prompt echoed with its logprobs (the first null), nothing
    generated, `length`, no completion tokens; for each prompt of a list and each choice, streamed or not;
    blocks freed."""
    texts = [PROMPT, "One, two, three"]
    prompts = [prompt_ids(gateway, text) for text in texts]
    reply = client.completions.create(
        model=MODEL_NAME, prompt=prompts, max_tokens=0, echo=True, logprobs=1, n=2
    )
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert reply.usage.completion_tokens == 0
    assert reply.usage.prompt_tokens == len(prompts[0]) + len(prompts[1])
    for choice, text in zip(reply.choices, [t for t in texts for _ in range(2)], strict=True):
        lp = choice.logprobs
        assert (choice.text, choice.finish_reason, "".join(lp.tokens)) == (text, "length", text)
        assert lp.token_logprobs[0] is None and all(v <= 0 for v in lp.token_logprobs[1:])
    plain = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=0, echo=True)
    only = plain.choices[0]
    assert (only.text, only.logprobs, only.finish_reason, plain.usage.completion_tokens) == (
        PROMPT,
        None,
        "length",
        0,
    )
    streamed = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=0, echo=True, logprobs=0, stream=True
    )
    (chunk,) = [c for c in streamed if c.choices]
    assert (chunk.choices[0].text, chunk.choices[0].finish_reason) == (PROMPT, "length")
    assert chunk.choices[0].logprobs.token_logprobs[0] is None
    assert wait_for_idle(worker_stub).num_kv_blocks_used == 0
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 0}  # no echo: nothing to return (as vLLM)
    refused = httpx.post(f"{gateway.addr}/v1/completions", timeout=60, json=body)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"
