"""The embedding model's tokenizer read from its folder's tokenizer.json by the `tokenizers` library alone.

transformers' fast tokenizer wraps the same file and the same library, so the ids are the same
(tests/cache/test_tokenizer.py); what is left out is importing transformers, about 1.5 s of a cache
service's 6 s start (AVX2 EPYC, 2026-12-06), paid at every start from the ONNX export. The calls the cache
makes are transformers' own (`tokenizer(texts, truncation=True, max_length=n)["input_ids"]`, `len`,
`pad_token_id`), so either tokenizer serves them.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

TOKENIZER_FILE = "tokenizer.json"


class TextTokenizer:
    """A folder's tokenizer.json as transformers' fast tokenizer calls it, for single texts or lists."""

    def __init__(self, folder: str | Path) -> None:
        from tokenizers import Tokenizer

        folder = Path(folder)
        self._plain = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        # The file may carry padding and truncation of its own (MiniLM's: both to 128); transformers sets
        # them for each call, and so does this class, on tokenizers of its own for each length.
        self._plain.no_padding()
        self._plain.no_truncation()
        self._cut: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.pad_token_id = self._plain.token_to_id(_pad_token(folder) or "") or 0

    @staticmethod
    def readable(folder: str | Path) -> bool:
        return (Path(folder) / TOKENIZER_FILE).is_file()

    def __len__(self) -> int:
        return int(self._plain.get_vocab_size(with_added_tokens=True))

    def __call__(
        self,
        texts: str | list[str],
        add_special_tokens: bool = True,
        truncation: bool = False,
        max_length: int | None = None,
        verbose: bool = False,
    ) -> dict[str, Any]:
        tokenizer = self._cutting_at(max_length) if truncation and max_length else self._plain
        # A single text too goes through encode_batch: tokenizers' `encode` keeps the GIL for the whole call
        # (~0.6 s for 1 MB of text in the service), which held every lookup behind an embeddings input being
        # tokenized on its thread; encode_batch lets go of it, as transformers' own call does.
        batch = [texts] if isinstance(texts, str) else texts
        encodings = tokenizer.encode_batch(batch, add_special_tokens=add_special_tokens)
        ids = [e.ids for e in encodings]
        return {"input_ids": ids[0] if isinstance(texts, str) else ids}

    def _cutting_at(self, max_length: int) -> Any:
        """A copy that cuts at `max_length` (special tokens included), made once: truncation is a setting of
        the tokenizer, and changing it on a shared one would race a call on another thread."""
        with self._lock:
            if max_length not in self._cut:
                from tokenizers import Tokenizer

                cut = Tokenizer.from_str(self._plain.to_str())
                cut.enable_truncation(max_length)
                self._cut[max_length] = cut
            return self._cut[max_length]


def _pad_token(folder: Path) -> str | None:
    """The pad token's text, as tokenizer_config.json (or special_tokens_map.json) names it."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / name
        if path.is_file():
            token = json.loads(path.read_text()).get("pad_token")
            if isinstance(token, dict):
                token = token.get("content")
            if token:
                return str(token)
    return None
