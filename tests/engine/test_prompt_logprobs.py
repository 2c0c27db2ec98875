"""Prompt logprobs through the real engine (scheduler, paged runner, sampler) against transformers.

Each prompt position's logprob, rank and top tokens must equal log_softmax of transformers' logits for
the same prompt (float32), however the prompt was split into chunks, whatever the prefix cache held,
and after a preemption.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.factories import tiny_engine, tiny_llama
from worker.engine.engine import LLMEngine
from worker.engine.outputs import PromptInput, RequestOutput
from worker.engine.sampling_params import SamplingParams

VOCAB = 256
BLOCK = 4


@pytest.fixture(scope="module")
def hf_model():
    return tiny_llama(seed=1, vocab_size=VOCAB)


def make_engine(hf_model, budget: int = 64, num_blocks: int = 128, max_num_seqs: int = 8) -> LLMEngine:
    return tiny_engine(hf_model, VOCAB, BLOCK, budget, num_blocks, max_num_seqs)


def run(
    engine: LLMEngine, prompts: dict[str, tuple[list[int], SamplingParams]]
) -> dict[str, list[RequestOutput]]:
    """Add every request, step to the end; each request's outputs in order (all choices together)."""
    for request_id, (prompt, params) in prompts.items():
        engine.add(engine.make_requests(request_id, PromptInput(token_ids=prompt), params))
    outputs: dict[str, list[RequestOutput]] = {request_id: [] for request_id in prompts}
    for _ in range(2000):
        if not engine.has_unfinished():
            break
        for output in engine.step().outputs:
            outputs[output.group_id].append(output)
    assert not engine.has_unfinished()
    assert engine.scheduler.block_manager.num_used_blocks == 0
    return outputs


def params(prompt_logprobs: int | None, max_tokens: int = 3, n: int = 1) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, prompt_logprobs=prompt_logprobs, n=n)


def prompt_of(length: int, salt: int = 0) -> list[int]:
    return [(11 * i + 5 + salt) % (VOCAB - 1) + 1 for i in range(length)]


def assert_prompt_logprobs(hf_model, prompt: list[int], choice_outputs: list[RequestOutput], k: int) -> None:
    """Only the first output of the choice carries them, and they match transformers."""
    first, *rest = choice_outputs
    assert all(o.prompt_logprobs is None for o in rest)
    assert first.prompt_logprobs is not None and len(first.prompt_logprobs) == len(prompt)
    head, *got = first.prompt_logprobs
    assert (head.chosen.token_id, head.chosen.rank, head.top) == (prompt[0], 0, [])
    with torch.no_grad():
        expected = hf_model(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    for position, entry in enumerate(got, start=1):
        row = expected[position - 1]
        token = prompt[position]
        assert entry.chosen.token_id == token and entry.chosen.token == f"<{token}>"
        torch.testing.assert_close(entry.chosen.logprob, float(row[token]), rtol=1e-4, atol=1e-4)
        assert entry.chosen.rank == int((row >= row[token]).sum())  # vLLM's: the last of its ties
        top_values, top_ids = row.topk(k)
        assert [t.token_id for t in entry.top] == top_ids.tolist()
        assert [t.rank for t in entry.top] == list(range(1, k + 1))
        torch.testing.assert_close(
            torch.tensor([t.logprob for t in entry.top]), top_values, rtol=1e-4, atol=1e-4
        )


def test_chunked_prefill_beside_other_requests(hf_model) -> None:
    engine = make_engine(hf_model, budget=10)
    prompt = prompt_of(37)
    outputs = run(
        engine,
        {
            "plain": (prompt_of(9, salt=3), params(None)),
            "scored": (prompt, params(3)),
            "k0": (prompt, params(0)),
        },
    )
    assert all(o.prompt_logprobs is None for o in outputs["plain"])
    assert_prompt_logprobs(hf_model, prompt, outputs["scored"], 3)
    assert_prompt_logprobs(hf_model, prompt, outputs["k0"], 0)


def test_prefix_cache_is_bypassed_until_they_are_out(hf_model) -> None:
    engine = make_engine(hf_model)
    prompt = prompt_of(30, salt=7)
    warm = run(engine, {"warm": (prompt, params(None))})
    assert warm["warm"][-1].usage.cached_tokens == 0
    scored = run(engine, {"scored": (prompt, params(2))})["scored"]
    assert scored[-1].usage.cached_tokens == 0  # ran whole, although its blocks were cached
    assert_prompt_logprobs(hf_model, prompt, scored, 2)
    again = run(engine, {"again": (prompt, params(None))})["again"]
    assert again[-1].usage.cached_tokens == 28


def test_single_token_prompt_and_max_tokens_one(hf_model) -> None:
    engine = make_engine(hf_model)
    outputs = run(engine, {"one": ([42], params(2, max_tokens=1)), "two": ([42, 7], params(2, max_tokens=1))})
    (only,) = outputs["one"][0].prompt_logprobs
    assert only.chosen.token_id == 42 and only.chosen.rank == 0 and outputs["one"][0].finished
    assert_prompt_logprobs(hf_model, [42, 7], outputs["two"], 2)


def test_every_choice_and_after_preemption(hf_model) -> None:
    engine = make_engine(hf_model, budget=16, num_blocks=24)
    prompts = {f"r{i}": (prompt_of(13 + i, salt=i), params(2, max_tokens=20, n=2)) for i in range(3)}
    outputs = run(engine, prompts)
    assert engine.scheduler.num_preemptions > 0
    for request_id, (prompt, _) in prompts.items():
        for index in range(2):
            choice = [o for o in outputs[request_id] if o.index == index]
            assert_prompt_logprobs(hf_model, prompt, choice, 2)


def test_max_tokens_zero_scores_the_prompt_and_samples_nothing(hf_model) -> None:
    """OpenAI's echo with max_tokens 0: each choice ends after its (chunked) prefill with its prompt
    logprobs, no token and `length`; its blocks are freed (run checks)."""
    engine = make_engine(hf_model, budget=10)
    prompt = prompt_of(23, salt=5)
    outputs = run(engine, {"scored": (prompt, params(2, max_tokens=0, n=2)), "one": ([42], params(0, 0))})
    for index in range(2):
        (only,) = [o for o in outputs["scored"] if o.index == index]
        assert (only.token_ids, only.text, only.finish_reason) == ([], "", "length")
        assert (only.usage.prompt_tokens, only.usage.completion_tokens) == (23, 0)
        assert_prompt_logprobs(hf_model, prompt, [only], 2)
    (single,) = outputs["one"]
    assert single.finish_reason == "length" and len(single.prompt_logprobs) == 1


def test_a_tied_prompt_token_ranks_last_among_its_equals_as_in_vllm() -> None:
    """vLLM's rank counts the tokens at least as likely, itself included: tied with the top token, a prompt
    token ranks 2, not 1 (bfloat16 logits tie often: 11 of 53 prompt positions of a probe)."""
    from worker.model.sampler import gather_prompt_logprobs

    logits = torch.tensor([[2.0, 2.0, 1.0, 0.0], [2.0, 2.0, 1.0, 0.0], [3.0, 2.0, 2.0, 0.0]])
    entries = gather_prompt_logprobs(logits, torch.tensor([1, 2, 0]), 1)
    assert [rank for _, rank, _, _ in entries] == [2, 3, 1]
