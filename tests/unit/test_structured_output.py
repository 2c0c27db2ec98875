"""Constrained decoding pieces on the real tokenizer: specs compile (once), masks allow only what the grammar
allows, the sampler applies them per row, rejected specs are input errors."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from worker.engine.chat_template import hermes_messages
from worker.engine.sampling_params import GrammarSpec
from worker.engine.structured_output import GrammarCache, GrammarError
from worker.model.sampler import allocate_bitmask, apply_bitmask

MODEL_DIR = "models/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def cache(tokenizer) -> GrammarCache:
    return GrammarCache(tokenizer, [tokenizer.eos_token_id], len(tokenizer))


def allowed_tokens(grammar, vocab: int) -> set[int]:
    bitmask = allocate_bitmask(1, vocab)
    grammar.fill_bitmask(bitmask, 0)
    logits = torch.zeros(1, vocab)
    apply_bitmask(logits, bitmask)
    return set(torch.isfinite(logits[0]).nonzero().flatten().tolist())


def test_choice_walk_and_eos(cache: GrammarCache, tokenizer) -> None:
    grammar = cache.matcher(GrammarSpec("choice", json.dumps(["yes", "no"])))
    allowed = allowed_tokens(grammar, cache.vocab_size)
    assert (
        tokenizer.convert_tokens_to_ids("yes") in allowed and tokenizer.convert_tokens_to_ids("no") in allowed
    )
    assert tokenizer.eos_token_id not in allowed and tokenizer.convert_tokens_to_ids("maybe") not in allowed
    assert grammar.accept(tokenizer.convert_tokens_to_ids("yes"))
    assert allowed_tokens(grammar, cache.vocab_size) == {tokenizer.eos_token_id}  # done: only EOS


def test_json_schema_cached_and_independent(cache: GrammarCache, tokenizer) -> None:
    spec = GrammarSpec(
        "json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})
    )
    first, second = cache.matcher(spec), cache.matcher(spec)
    assert cache.hits >= 1
    brace = tokenizer.convert_tokens_to_ids("{")
    assert allowed_tokens(first, cache.vocab_size) == allowed_tokens(second, cache.vocab_size)
    assert first.accept(brace)
    assert brace in allowed_tokens(second, cache.vocab_size)  # copies do not share state
    assert brace not in allowed_tokens(first, cache.vocab_size)


def test_bad_specs_are_refused(cache: GrammarCache) -> None:
    for spec in (GrammarSpec("regex", "(unclosed"), GrammarSpec("json_schema", "{not json")):
        with pytest.raises(GrammarError):
            cache.matcher(spec)


def test_bitmask_bit_order() -> None:
    bitmask = allocate_bitmask(2, 70)
    bitmask[0, 0] = 0b101  # tokens 0 and 2
    bitmask[1, 2] = 0b10  # token 65
    logits = torch.zeros(2, 70)
    apply_bitmask(logits, bitmask)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0, 2]
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [65]
    three = torch.zeros(3, 70)
    apply_bitmask(three, bitmask[1:], rows=[2])  # only the constrained row is touched
    assert torch.isfinite(three[:2]).all() and torch.isfinite(three[2]).nonzero().flatten().tolist() == [65]


def test_hermes_rendering() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": {"x": 1}}}],
        },
        {"role": "tool", "tool_call_id": "1", "content": "42"},
    ]
    out = hermes_messages(messages, tools)
    assert (
        out[0]["role"] == "system" and '"name": "f"' in out[0]["content"] and "<tools>" in out[0]["content"]
    )
    assert out[2]["content"] == '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    assert out[3] == {"role": "tool", "content": "<tool_response>\n42\n</tool_response>"}
