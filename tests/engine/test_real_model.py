"""The bundled SmolLM2-135M-Instruct through the async engine against transformers' generate."""

import asyncio
import json

import pytest
import torch

from worker.engine.config import EngineConfig, KVCacheConfig, SchedulerConfig
from worker.engine.errors import InvalidRequestError
from worker.engine.outputs import PromptInput
from worker.engine.sampling_params import GrammarSpec, SamplingParams
from worker.model.build import build_async_engine

MODEL_DIR = "models/SmolLM2-135M-Instruct"
MAX_NEW = 24

QUESTIONS = [
    "Hi!",
    "What is the capital of France?",
    "Name three primary colors.",
    "Explain in one sentence why the sky is blue.",
    "Write a haiku about autumn leaves falling on a quiet river at dusk.",
    "Translate 'good morning' into Spanish.",
    "I have a list of numbers: 4, 8, 15, 16, 23, 42. What is their sum, and which of them are even? "
    "Please show your reasoning step by step before giving the final answer.",
    "Give me a short tip for learning to play the guitar as an adult beginner with little free time.",
]


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(loop):
    config = EngineConfig(
        model=MODEL_DIR,
        dtype="float32",
        quantization="none",  # compared with transformers token for token
        scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16, max_model_len=1024),
        kv_cache=KVCacheConfig(block_size=16, num_blocks=400),
    )
    eng = build_async_engine(config)
    loop.run_until_complete(eng.start())
    yield eng
    loop.run_until_complete(eng.shutdown())


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()
    outputs = []
    for question in QUESTIONS:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
        generated = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)[0, ids.shape[1] :].tolist()
        outputs.append(generated)
    return outputs


async def _collect(engine, request_id, prompt, params, delay=0.0):
    await asyncio.sleep(delay)
    outputs = [o async for o in engine.generate(request_id, prompt, params)]
    return outputs


def test_greedy_equals_transformers_generate_for_concurrent_staggered_chats(loop, engine, reference):
    async def scenario():
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
        tasks = [
            _collect(
                engine,
                f"chat-{i}",
                PromptInput(messages=[{"role": "user", "content": q}]),
                params,
                delay=0.15 * (i % 4),
            )
            for i, q in enumerate(QUESTIONS)
        ]
        return await asyncio.gather(*tasks)

    results = loop.run_until_complete(scenario())
    for expected, outputs in zip(reference, results, strict=True):
        tokens = [t for o in outputs for t in o.token_ids]
        assert tokens == expected
        final = outputs[-1]
        assert final.finish_reason in ("stop", "length")
        assert final.usage.completion_tokens == len(tokens)
    stats = engine.stats()
    assert stats.num_kv_blocks_used == 0 and stats.num_running == 0
    assert stats.prefix_cache_hits > 0  # the shared system prompt of the chat template


def test_abort_frees_blocks_and_n_choices_share_the_prompt(loop, engine):
    async def scenario():
        gen = engine.generate("long", PromptInput(text="Once upon a time"), SamplingParams(max_tokens=500))
        first = await gen.__anext__()
        assert first.token_ids
        # Stats are a snapshot the engine thread publishes after each round: wait for the one after this step.
        for _ in range(50):
            if engine.stats().num_kv_blocks_used > 0:
                break
            await asyncio.sleep(0.02)
        assert engine.stats().num_kv_blocks_used > 0
        await gen.aclose()
        for _ in range(50):
            await asyncio.sleep(0.05)
            if engine.stats().num_kv_blocks_used == 0:
                break
        assert engine.stats().num_kv_blocks_used == 0

        hits_before = engine.stats().prefix_cache_hits
        long_prompt = "Summarize: " + "The quick brown fox jumps over the lazy dog. " * 8
        outputs = await _collect(
            engine,
            "multi",
            PromptInput(text=long_prompt),
            SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8),
        )
        finals = [o for o in outputs if o.finished]
        assert sorted(o.index for o in finals) == [0, 1, 2]
        assert engine.stats().prefix_cache_hits - hits_before >= 2 * 64  # choices 1 and 2 reuse the prompt

        with pytest.raises(InvalidRequestError, match="maximum context length is 1024"):
            await _collect(
                engine, "too-long", PromptInput(text="word " * 1100), SamplingParams(max_tokens=10)
            )

    loop.run_until_complete(scenario())


def test_speculative_decoding_keeps_greedy_output_identical(loop, reference):
    config = EngineConfig(
        model=MODEL_DIR,
        dtype="float32",
        quantization="none",
        scheduler=SchedulerConfig(max_num_batched_tokens=64, max_model_len=1024, num_speculative_tokens=4),
        kv_cache=KVCacheConfig(block_size=16, num_blocks=200),
    )
    engine = build_async_engine(config)

    async def scenario():
        await engine.start()
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
        results = []
        for i, question in enumerate(QUESTIONS[:5]):  # one at a time: a single stream speculates
            outputs = await _collect(
                engine, f"spec-{i}", PromptInput(messages=[{"role": "user", "content": question}]), params
            )
            results.append(outputs)
        await engine.shutdown()
        return results

    results = loop.run_until_complete(scenario())
    for expected, outputs in zip(reference, results, strict=False):
        assert [t for o in outputs for t in o.token_ids] == expected
    assert any(len(o.token_ids) > 1 for outputs in results for o in outputs), "no draft was ever accepted"
    assert engine.stats().num_kv_blocks_used == 0


def test_bfloat16_speculation_gives_the_tokens_plain_decoding_gives(loop):
    """Draft tokens run as decode rows, each rounding as its own decode step would: run as a prefill chunk
    they changed bfloat16 logits enough to flip a greedy token (3 of 6 chats within 96 tokens)."""
    from common.linear import amx_available, onednn_available

    probe = torch.zeros(32, 32, dtype=torch.bfloat16)
    if not (amx_available(probe) or onednn_available(probe)):
        pytest.skip("no native bfloat16 GEMM on this CPU: its kernels change method with the batch size")
    questions = [
        "Write a python function that adds two numbers, then repeat it.",
        "Explain what a CPU cache is.",
    ]

    def greedy(num_speculative_tokens: int) -> list[list[int]]:
        config = EngineConfig(
            model=MODEL_DIR,
            dtype="bfloat16",
            scheduler=SchedulerConfig(
                max_num_batched_tokens=64, max_model_len=1024, num_speculative_tokens=num_speculative_tokens
            ),
            kv_cache=KVCacheConfig(block_size=16, num_blocks=200),
        )
        engine = build_async_engine(config)

        async def scenario():
            await engine.start()
            params = SamplingParams(temperature=0.0, max_tokens=40)
            out = []
            for i, question in enumerate(questions):
                prompt = PromptInput(messages=[{"role": "user", "content": question}])
                out.append(
                    [t for o in await _collect(engine, f"bf16-{i}", prompt, params) for t in o.token_ids]
                )
            await engine.shutdown()
            return out

        return loop.run_until_complete(scenario())

    assert greedy(4) == greedy(0)


def test_logprobs_cover_the_text_not_the_final_eos(loop, engine):
    params = SamplingParams(temperature=0.0, max_tokens=60, logprobs=2)
    prompt = PromptInput(messages=[{"role": "user", "content": "Hi!"}])
    outputs = loop.run_until_complete(_collect(engine, "eos-logprobs", prompt, params))
    final = outputs[-1]
    assert final.finish_reason == "stop" and final.token_ids == [engine.engine.eos_token_id]
    assert final.logprobs == []
    assert all(len(o.logprobs) == len(o.token_ids) for o in outputs[:-1])
    assert "".join(p.chosen.token for o in outputs for p in o.logprobs) == "".join(o.text for o in outputs)


def test_a_completed_grammar_ends_the_output_before_min_tokens(loop, engine):
    """A grammar that has nothing left to allow but its end wins over min_tokens: the row had every token
    masked, drew token 0 (refused by the grammar) until min_tokens, and counted those tokens."""
    choice = GrammarSpec("choice", json.dumps(["yes", "no"]))
    params = SamplingParams(temperature=0.0, max_tokens=16, min_tokens=10, structured_output=choice)
    prompt = PromptInput(text="Is the sky blue? Answer yes or no:")
    outputs = loop.run_until_complete(_collect(engine, "grammar-min-tokens", prompt, params))
    assert "".join(o.text for o in outputs) in ("yes", "no")
    assert outputs[-1].finish_reason == "stop"
    assert outputs[-1].usage.completion_tokens <= 3  # the answer's tokens and its end


def test_a_stop_string_before_min_tokens_stays_in_the_text(loop, engine):
    """As vLLM: stop strings count only from min_tokens on; one met earlier is ordinary text, kept whole."""
    prompt = PromptInput(text="Count: 1, 2, 3, 4, 5, 6, 7, 8,")
    plain = SamplingParams(temperature=0.0, max_tokens=8)
    free = loop.run_until_complete(_collect(engine, "count-free", prompt, plain))
    free_text = "".join(o.text for o in free)  # " 9, 10, ": its first comma is its third token
    second_comma = free_text.index(",", free_text.index(",") + 1)
    params = SamplingParams(temperature=0.0, max_tokens=8, stop=[","], min_tokens=5)
    outputs = loop.run_until_complete(_collect(engine, "count-stop", prompt, params))
    assert outputs[-1].finish_reason == "stop"
    assert "".join(o.text for o in outputs) == free_text[:second_comma]
