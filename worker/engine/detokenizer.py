"""Incremental detokenization and stop strings, in one place.

Text is decoded from a sliding window of tokens, so a multi-byte UTF-8 character split over several
tokens is only emitted once complete; bytes still pending when the output ends go out as decoding them
gives (U+FFFD), so the text is always the decode of the output's ids. Text that may still turn into a
stop string is held back; what follows a matched stop string never reaches the client, nor the stop string
itself unless the request asked for it (vLLM's include_stop_str_in_output).
"""

from __future__ import annotations

import re
from functools import lru_cache


class IncrementalDetokenizer:
    def __init__(
        self, tokenizer, stop: list[str], skip_special_tokens: bool = True, include_stop: bool = False
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.skip_special_tokens = skip_special_tokens
        self.include_stop = include_stop
        self.token_ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""  # all decoded text (stop string excluded once matched)
        self.emitted = 0  # characters of self.text already returned
        self.checking_stop = True  # whether the last token was past min_tokens (stop strings count)
        self.stopped = False  # a stop string matched: the text ends there, whatever tokens came after
        self._decode_ids = _raw_decoder(tokenizer) or tokenizer.decode

    def _decode(self, ids: list[int]) -> str:
        return self._decode_ids(ids, skip_special_tokens=self.skip_special_tokens)

    def add_token(self, token_id: int, check_stop: bool = True) -> bool:
        """Append one token; return True if a stop string matched (the text is then truncated). With
        `check_stop` false (the output is still short of min_tokens) stop strings are plain text."""
        self.token_ids.append(token_id)
        self.checking_stop = check_stop
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.token_ids[self.prefix_offset :])
        if new_text.endswith("\ufffd") or len(new_text) <= len(prefix_text):
            return False  # an incomplete character (or nothing visible yet): wait for more tokens
        delta = new_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        return self._append(delta, check_stop)

    def _append(self, delta: str, check_stop: bool) -> bool:
        """Add decoded text; True if a stop string now matches (searched only where the delta can reach)."""
        search_from = max(0, len(self.text) - max((len(s) for s in self.stop), default=0) + 1)
        self.text += delta
        return check_stop and self._truncate_at_stop(search_from)

    def _truncate_at_stop(self, search_from: int) -> bool:
        """Cut the text at the first stop string to start (the longest starting there), or after it."""
        hits = [(i, -len(s)) for s in self.stop if (i := self.text.find(s, search_from)) >= 0]
        if not hits:
            return False
        start, minus_length = min(hits)
        self.text = self.text[: start - minus_length if self.include_stop else start]
        self.stopped = True
        return True

    def take_delta(self, final: bool) -> str:
        """New text safe to send: all of it when final, else all but a possible stop-string start."""
        if final:
            self._flush_pending()
        end = len(self.text)
        if not final and self.stop:
            end -= self._held_back()
        end = max(end, self.emitted)
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta

    def _flush_pending(self) -> None:
        """The output ended inside a character (max_tokens, EOS) or on a U+FFFD the model wrote: add what
        the held tokens decode to, as a decode of all the ids would, unless a stop string already ended it."""
        if self.stopped or self.read_offset == len(self.token_ids):
            return
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.token_ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.token_ids)
        self._append(new_text[len(prefix_text) :], self.checking_stop)

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of some stop string."""
        longest = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:n]):
                    longest = n
                    break
        return longest


def _raw_decoder(tokenizer):
    """The Rust tokenizer's own decode where transformers' would return the same text (a fast tokenizer that
    cleans up no spaces): twice per token per sequence, the Python wrapper around it cost ~20 us a token (a
    64-sequence decode step spent 1.4 ms in it)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    return backend.decode


_BYTE_LEVEL_CHARS: dict[str, int] | None = None


def _byte_level_map() -> dict[str, int]:
    """The byte-level BPE alphabet: each byte 0..255 is written as one printable character."""
    global _BYTE_LEVEL_CHARS
    if _BYTE_LEVEL_CHARS is None:
        printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
        printable += list(range(ord("®"), ord("ÿ") + 1))
        chars = list(printable)
        extra = 0
        for b in range(256):
            if b not in printable:
                printable.append(b)
                chars.append(256 + extra)
                extra += 1
        _BYTE_LEVEL_CHARS = {chr(c): b for b, c in zip(printable, chars, strict=True)}
    return _BYTE_LEVEL_CHARS


_BYTE_FALLBACK_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _pieces_are_byte_level(tokenizer) -> bool:
    """Whether the vocabulary is written in byte-level BPE's alphabet (GPT-2's, SmolLM2's, Llama 3's: each
    character one byte), not as text pieces (SentencePiece's: `▁` a space, `<0xF0>` a byte; Gemma's)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return decoder is not None and b'"ByteLevel"' in decoder.__getstate__()


class TokenTexts:
    """Text and raw bytes of single tokens, for logprobs."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.byte_level = _pieces_are_byte_level(tokenizer)
        self.lookup = lru_cache(maxsize=65536)(self._lookup)

    def _lookup(self, token_id: int) -> tuple[str, bytes]:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        raw = self._piece_bytes(piece) if isinstance(piece, str) and piece else None
        if raw is None:
            raw = self.tokenizer.decode([token_id]).encode("utf-8")
        return raw.decode("utf-8", errors="replace"), raw

    def _piece_bytes(self, piece: str) -> bytes | None:
        """The bytes a piece stands for where the decoded text cannot say (part of a character); None: the
        piece is whole text."""
        if not self.byte_level:
            fallback = _BYTE_FALLBACK_PIECE.fullmatch(piece)
            return bytes([int(fallback.group(1), 16)]) if fallback else None
        table = _byte_level_map()
        return bytes(table[ch] for ch in piece) if all(ch in table for ch in piece) else None
