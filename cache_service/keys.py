"""What makes two requests interchangeable: the partition (everything that must match exactly) and the
conversation (what is compared by meaning).

A cached answer may only be reused for the same model, tenant, output-shaping parameters, system prompt and
shape of conversation (the same roles in the same order). So the index is partitioned by a hash of all of
that, and similarity is only computed inside one partition.

In a conversation, the earlier turns (user and assistant) must be the same text or canonical-equal
(cache_service/canonical.py: case, punctuation, wrappers, contractions, safe spelling fixes, clause order):
their canonical text is part of the searched partition (`search_partition`). Only the last question is
compared by meaning (`query`, what is embedded), by the same tiers as a lone question. So "I use a Mac. ...
how do I install Python?" answers "i use a mac ... How can I install Python?" but never "I use a PC. ...".
An earlier turn too long to canonicalize cheaply (most often the model's own long answer, replayed) must be
the same normalized text; a last question too long to compare is matched by the exact tier only, like a
completion's prompt (`ParsedKey.exact_only`).
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from dataclasses import dataclass

from cache_service.canonical import canonical_text
from common.gen import cache_pb2

_CONVERSATION_MARK = "\x1e"  # stored text of a multi-turn entry: this mark, then JSON [[role, text], ...]
SYSTEM_ROLES = ("system", "developer")  # instructions: matched exactly, never by meaning
# The model reads ~256 word pieces: a longer question's tail would be invisible to it, so a longer question is
# reused only when it is the same text. And the canonical passes grow faster than the length of a text (an
# earlier turn of ~900 KB held the event loop for 3 s): a longer earlier turn, or earlier turns longer than
# MAX_CANONICAL_CHARS together, are matched by their normalized text (linear) instead.
MAX_COMPARABLE_CHARS = 1000  # one turn
MAX_CANONICAL_CHARS = (
    8000  # the earlier turns canonicalized, together: about the model's context (2048 tokens)
)
MAX_MESSAGES = 2048  # per key, as the gateway's GATEWAY_MAX_MESSAGES: more is refused


class NotCacheableError(ValueError):
    """The key cannot be looked up or stored (no query text, both prompt and messages, ...)."""


@dataclass(frozen=True)
class Conversation:
    """The turns compared by meaning, the last user question last; one turn for a single question."""

    turns: tuple[tuple[str, str], ...]  # (role, text)

    @property
    def question(self) -> str:
        return self.turns[-1][1]

    @property
    def too_long(self) -> bool:
        """The last question is too long to compare by meaning (MAX_COMPARABLE_CHARS): exact tier only."""
        return len(self.question) > MAX_COMPARABLE_CHARS

    def earlier_context(self) -> list[list[str]]:
        """The earlier turns as the searched partition holds them: their canonical text, so that a retyped
        turn still matches; a turn longer than MAX_COMPARABLE_CHARS (or every turn, when the short ones are
        longer than MAX_CANONICAL_CHARS together) by its normalized text, which must then be the same."""
        earlier = self.turns[:-1]
        short = sum(len(text) for _, text in earlier if len(text) <= MAX_COMPARABLE_CHARS)
        return [
            [role, canonical_text(text)]
            if len(text) <= MAX_COMPARABLE_CHARS and short <= MAX_CANONICAL_CHARS
            else [role, "\x00" + normalize_text(text)]  # marked: never equal to a canonical text
            for role, text in earlier
        ]

    def encode(self) -> str:
        """The text stored with an entry (Redis and the index): a lone question as itself, unless it starts
        with the mark: a client may type one, and it must not be read back as the conversation it spells."""
        if len(self.turns) == 1 and not self.question.startswith(_CONVERSATION_MARK):
            return self.question
        return _CONVERSATION_MARK + json.dumps([list(t) for t in self.turns], ensure_ascii=False)

    @classmethod
    def decode(cls, text: str) -> Conversation:
        """The conversation `encode` wrote; a marked text that is no encoding is a lone question that a
        replica before the mark's escaping stored as itself."""
        turns = _decoded_turns(text[1:]) if text.startswith(_CONVERSATION_MARK) else None
        return cls(turns or (("user", text),))


def _decoded_turns(encoded: str) -> tuple[tuple[str, str], ...] | None:
    """The (role, text) pairs of an encoded conversation; None if `encoded` is not one."""
    try:
        turns = json.loads(encoded)
    except (ValueError, RecursionError):  # RecursionError: nested too deep to be a conversation
        return None
    if not isinstance(turns, list) or not turns:
        return None
    pairs = [t for t in turns if isinstance(t, list) and len(t) == 2 and all(isinstance(x, str) for x in t)]
    return tuple((role, text) for role, text in pairs) if len(pairs) == len(turns) else None


@dataclass(frozen=True)
class ParsedKey:
    partition: str  # hex digest of everything that must match exactly
    conversation: Conversation
    scope: str
    model: str
    kind: str = "chat"  # or "completion": a raw prompt, matched byte for byte only

    @property
    def exact_only(self) -> bool:
        """Only the exact tier may answer: a completion's prompt is text to continue, not a question (a
        trailing space, a capital or a sign changes what follows it: "return a" / "return a *"), and a last
        question too long to compare is compared by no other tier."""
        return self.kind == "completion" or self.conversation.too_long

    @property
    def query(self) -> str:
        """The text compared by meaning (embedded for the search): the last question. Earlier turns are
        matched by their canonical text, in `search_partition`."""
        return self.conversation.question

    @property
    def search_partition(self) -> str:
        """The partition searched by the canonical and semantic tiers: `partition` and the earlier turns'
        canonical text (`Conversation.earlier_context`; a lone question: `partition` itself). An exact-only
        key canonicalizes nothing: its entry is indexed without a row and its lookup searches nothing."""
        if len(self.conversation.turns) == 1 or self.exact_only:
            return self.partition
        context = self.conversation.earlier_context()
        material = json.dumps([self.partition, context], ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(material.encode()).hexdigest()[:32]

    @property
    def stored_text(self) -> str:
        return self.conversation.encode()

    @property
    def entry_id(self) -> str:
        """Same partition + same normalized turns = same entry (a store overwrites, a lookup hits exactly); a
        completion's prompt is not normalized."""
        same = (lambda text: text) if self.kind == "completion" else normalize_text
        # JSON, not the texts joined by a separator: a client may type the separator into a turn
        turns = json.dumps([same(text) for _, text in self.conversation.turns], ensure_ascii=False)
        digest = hashlib.sha256(f"{self.partition}\0{turns}".encode())
        return digest.hexdigest()[:32]


def normalize_text(text: str) -> str:
    """Only changes that cannot change meaning: Unicode form, case, runs of spaces, trailing punctuation.
    String methods, linear in the text: a regex anchored at the end backtracked over every run of marks."""
    text = " ".join(unicodedata.normalize("NFKC", text).lower().split())
    return text.rstrip(" ?.!")


def scope_digest(scope: str) -> str:
    return hashlib.sha256(scope.encode()).hexdigest()[:24]


def _chat(messages: list[cache_pb2.Message]) -> tuple[Conversation, list[object]]:
    """The conversation compared by meaning and the exact-match material: system messages with their
    place, the roles in order, and anything after the last user message."""
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    if last_user < 0:
        raise NotCacheableError("conversation has no user message")
    turns: list[tuple[str, str]] = []
    shape: list[object] = []
    for i, m in enumerate(messages):
        if m.role in SYSTEM_ROLES or i > last_user:
            shape.append([m.role, m.content])
        else:
            turns.append((m.role, m.content))
            shape.append(m.role)
    return Conversation(tuple(turns)), shape


def parse_key(key: cache_pb2.CacheKey) -> ParsedKey:
    if not key.model:
        raise NotCacheableError("key.model is required")
    if key.messages and key.prompt:
        raise NotCacheableError("key has both messages and prompt")
    if len(key.messages) > MAX_MESSAGES:
        raise NotCacheableError(f"key.messages has {len(key.messages)} messages; at most {MAX_MESSAGES}")
    if key.messages:
        conversation, shape = _chat(list(key.messages))
        kind = "chat"
    elif key.prompt:
        conversation, shape, kind = Conversation((("user", key.prompt),)), [], "completion"
    else:
        raise NotCacheableError("key has neither messages nor prompt")
    if not conversation.question.strip():
        raise NotCacheableError("query text is empty")
    material = json.dumps([kind, key.model, key.scope, key.params_fingerprint, shape], separators=(",", ":"))
    partition = hashlib.sha256(material.encode()).hexdigest()[:32]
    return ParsedKey(partition, conversation, key.scope, key.model, kind)
