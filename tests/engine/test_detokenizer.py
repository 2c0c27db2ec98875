"""Incremental detokenization with the real tokenizer: multi-byte characters and stop strings."""

from pathlib import Path

import pytest

from worker.engine.detokenizer import IncrementalDetokenizer, TokenTexts
from worker.model.loader import load_tokenizer

MODEL_DIR = "models/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(MODEL_DIR)


def _stream(
    tokenizer, text: str, stop: list[str], include_stop: bool = False
) -> tuple[list[str], bool, IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(tokenizer, stop, include_stop=include_stop)
    deltas, stopped = [], False
    for token in tokenizer.encode(text):
        stopped = detok.add_token(token)
        deltas.append(detok.take_delta(final=stopped))
        if stopped:
            break
    if not stopped:
        deltas.append(detok.take_delta(final=True))
    return deltas, stopped, detok


def test_multibyte_characters_split_over_tokens_are_never_emitted_half(tokenizer):
    text = "Café ☕ costs 5€ — 日本語のテキスト 🎉🚀 naïve"
    ids = tokenizer.encode(text)
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids), "the sample must split characters"
    deltas, _, _ = _stream(tokenizer, text, [])
    assert "".join(deltas) == tokenizer.decode(ids)
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("text", ["Family 👨‍👩‍👧", "日本語", "Zürich ö"])
def test_a_character_cut_short_by_the_end_of_the_output_is_sent_as_decode_gives_it(tokenizer, text):
    """max_tokens (or EOS) can land inside a character: the final text is what decoding the output's ids
    gives (U+FFFD for the lone bytes), not the text without them, so the text, the token ids and their
    logprob bytes agree."""
    ids = tokenizer.encode(text)[:-1]
    assert tokenizer.decode(ids).endswith("\ufffd"), "the sample must end inside a character"
    detok = IncrementalDetokenizer(tokenizer, [])
    deltas = []
    for token in ids:
        detok.add_token(token)
        deltas.append(detok.take_delta(final=False))
    assert not any("\ufffd" in d for d in deltas), "held while the character may still complete"
    deltas.append(detok.take_delta(final=True))
    assert "".join(deltas) == tokenizer.decode(ids)


@pytest.mark.parametrize("text", ["a real replacement character \ufffd", "ends in one\ufffd"])
def test_a_replacement_character_the_model_wrote_last_is_kept(tokenizer, text):
    deltas, stopped, _ = _stream(tokenizer, text, [])
    assert not stopped and "".join(deltas) == tokenizer.decode(tokenizer.encode(text)) == text


def test_the_final_flush_never_brings_back_text_cut_at_a_stop_string(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, ["🎉"])
    for token in tokenizer.encode("a 🎉 b 🚀"):
        if detok.add_token(token):
            break
    assert detok.take_delta(final=True) == "a "


def test_stop_string_is_held_back_and_never_emitted(tokenizer):
    deltas, stopped, detok = _stream(tokenizer, "The capital of France is Paris. It is big.", ["Paris"])
    assert stopped
    assert "".join(deltas) == "The capital of France is "
    assert "Par" not in "".join(deltas) and detok.text == "The capital of France is "


def test_include_stop_str_in_output_ends_the_text_with_the_stop_string(tokenizer):
    text = "The capital of France is Paris. It is big."
    deltas, stopped, _ = _stream(tokenizer, text, ["is big", "Paris"], include_stop=True)
    assert stopped and "".join(deltas) == "The capital of France is Paris"
    deltas, stopped, _ = _stream(tokenizer, text, ["is big", "Paris. It"], include_stop=True)
    assert stopped and "".join(deltas) == "The capital of France is Paris. It"  # held back, then whole


def test_text_that_only_looks_like_a_stop_string_is_released(tokenizer):
    deltas, stopped, _ = _stream(tokenizer, "Paragraph one. Parsing two.", ["Paris"])
    assert not stopped
    assert "".join(deltas) == "Paragraph one. Parsing two."


def test_token_texts_give_raw_bytes_of_partial_characters(tokenizer):
    texts = TokenTexts(tokenizer)
    ids = tokenizer.encode("🎉")
    raw = b"".join(texts.lookup(t)[1] for t in ids)
    assert raw == "🎉".encode()


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_the_rust_decode_gives_the_text_transformers_decode_gives(tokenizer, skip_special_tokens):
    """The detokenizer calls the Rust tokenizer directly (the wrapper cost ~20 us a token): the same text,
    special tokens kept or skipped, over a chat-templated conversation streamed token by token."""
    messages = [
        {"role": "user", "content": "Café ☕ — naïve 日本語? 🎉"},
        {"role": "assistant", "content": "Yes:  two  spaces ."},
    ]
    ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    detok = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=skip_special_tokens)
    assert detok._decode_ids != tokenizer.decode, "the fast path is taken for this tokenizer"
    streamed = []
    for token in ids:
        detok.add_token(token)
        streamed.append(detok.take_delta(final=False))
    streamed.append(detok.take_delta(final=True))
    assert "".join(streamed) == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


GEMMA_DIR = Path("models/gemma-3-270m")
needs_gemma = pytest.mark.skipif(
    not (GEMMA_DIR / "config.json").exists(), reason="python -m tools.fetch_model --model gemma-3-270m"
)


@pytest.fixture(scope="module")
def gemma_tokenizer():
    return load_tokenizer(str(GEMMA_DIR))


@needs_gemma
def test_sentencepiece_token_texts_are_their_characters_and_bytes(gemma_tokenizer):
    """Gemma's pieces are text (`▁` for a space) with byte-fallback pieces `<0xF0>`, not byte-level BPE's
    alphabet: `über` is one token whose text is `über`, not a byte 0xFC; `Ā` is not a NUL byte."""
    texts = TokenTexts(gemma_tokenizer)
    text = "über Straße café naïve Ā 日本語 𝔘"
    ids = gemma_tokenizer.encode(text, add_special_tokens=False)
    assert "<0xF0>" in gemma_tokenizer.convert_ids_to_tokens(ids), "the sample must use byte fallback"
    assert b"".join(texts.lookup(t)[1] for t in ids) == text.encode()
    uber = gemma_tokenizer.encode("über", add_special_tokens=False)
    assert [texts.lookup(t) for t in uber] == [("über", "über".encode())]
    assert texts.lookup(gemma_tokenizer.convert_tokens_to_ids("Ā")) == ("Ā", "Ā".encode())


@needs_gemma
def test_sentencepiece_multibyte_characters_stream_whole(gemma_tokenizer):
    text = "über Straße café naïve Ā 日本語 𝔘 🎉"
    ids = gemma_tokenizer.encode(text)
    detok = IncrementalDetokenizer(gemma_tokenizer, [])
    deltas = []
    for token in ids:
        detok.add_token(token)
        deltas.append(detok.take_delta(final=False))
    deltas.append(detok.take_delta(final=True))
    assert "".join(deltas) == gemma_tokenizer.decode(ids, skip_special_tokens=True) == text
    assert not any("\ufffd" in d for d in deltas)
