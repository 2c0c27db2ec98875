"""What makes two requests interchangeable: the partition (everything but the query) and the query text.

A cached answer may only be reused for the same model, tenant, output-shaping parameters and the exact same
conversation before the last user message; only that last message may be worded differently. So the index is
partitioned by a hash of all of that, and similarity is computed only between queries of one partition.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass

from services.gen import cache_pb2

_SPACES = re.compile(r"\s+")
_TRAILING_PUNCT = re.compile(r"[\s?.!]+$")


class NotCacheableError(ValueError):
    """The key cannot be looked up or stored (no query text, both prompt and messages, ...)."""


@dataclass(frozen=True)
class ParsedKey:
    partition: str  # hex digest of everything that must match exactly
    query: str  # the text compared by similarity
    scope: str
    model: str

    @property
    def entry_id(self) -> str:
        """Same partition + same normalized query = same entry (a store overwrites, a lookup hits exactly)."""
        digest = hashlib.sha256(f"{self.partition}\0{normalize_text(self.query)}".encode())
        return digest.hexdigest()[:32]


def normalize_text(text: str) -> str:
    """Only changes that cannot change meaning: Unicode form, case, runs of spaces, trailing punctuation."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = _SPACES.sub(" ", text).strip()
    return _TRAILING_PUNCT.sub("", text)


def scope_digest(scope: str) -> str:
    return hashlib.sha256(scope.encode()).hexdigest()[:24]


def parse_key(key: cache_pb2.CacheKey) -> ParsedKey:
    if not key.model:
        raise NotCacheableError("key.model is required")
    if key.messages and key.prompt:
        raise NotCacheableError("key has both messages and prompt")
    if key.messages:
        last_user = max((i for i, m in enumerate(key.messages) if m.role == "user"), default=-1)
        if last_user < 0:
            raise NotCacheableError("conversation has no user message")
        query = key.messages[last_user].content
        context = [[m.role, m.content] for m in key.messages]
        context[last_user] = ["user", None]  # the query's place in the conversation, not its text
        kind = "chat"
    elif key.prompt:
        query, context, kind = key.prompt, [], "completion"
    else:
        raise NotCacheableError("key has neither messages nor prompt")
    if not query.strip():
        raise NotCacheableError("query text is empty")
    material = json.dumps(
        [kind, key.model, key.scope, key.params_fingerprint, context], separators=(",", ":")
    )
    partition = hashlib.sha256(material.encode()).hexdigest()[:32]
    return ParsedKey(partition=partition, query=query, scope=key.scope, model=key.model)
