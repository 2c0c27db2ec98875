"""Second check on a candidate hit: do two questions ask for the same thing?

Sentence embeddings put "turn on 2FA" next to "turn off 2FA" and "capital of France" next to "capital
of Germany". A candidate above the similarity threshold is accepted only if, word for word, nothing that
changes the answer differs: numbers, negation, opposite words (on/off, increase/decrease...), units and the
direction of a conversion ("km to miles" vs "miles to km"), named entities, and content words substituted
for others.
Pure Python and deterministic, so it is cheap to run on every candidate and easy to unit test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cache_service.verifier_words import (
    FILLERS,
    GAZETTEER,
    NEGATIONS,
    NUMBER_WORDS,
    ORDINALS,
    PHRASES,
    POLAR_GROUPS,
    STOPWORDS,
    SYNONYMS,
    UNITS,
)

_TOKEN = re.compile(r"[$€£¥°%]|\d+(?:[.,:/]\d+)*(?:st|nd|rd|th)?|[^\W\d_]+(?:['’][^\W\d_]+)?|\d+[^\W_]*")
# word -> ((group, side), ...): one dict lookup per word instead of a scan of every group
_POLAR_INDEX: dict[str, tuple[tuple[str, str], ...]] = {}
for _group, _sides in POLAR_GROUPS.items():
    for _side, _members in _sides.items():
        for _member in _members:
            _POLAR_INDEX[_member] = _POLAR_INDEX.get(_member, ()) + ((_group, _side),)
_SOURCE_BEFORE = {"from"}
_TARGET_BEFORE = {"to", "into", "in", "many", "much"}


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""


@dataclass
class Features:
    tokens: list[str]  # lower-cased words, phrases joined with "_", synonyms canonicalized
    stems: set[str] = field(default_factory=set)
    numbers: list[str] = field(default_factory=list)
    negated: bool = False
    polar: dict[str, set[str]] = field(default_factory=dict)
    units: list[str] = field(default_factory=list)
    unit_roles: dict[str, set[str]] = field(default_factory=dict)
    pairs: set[tuple[str, str]] = field(default_factory=set)
    entities: set[str] = field(default_factory=set)
    content: set[str] = field(default_factory=set)


def stem(word: str) -> str:
    """A deliberately crude suffix stripper: enough to match plural/tense variants."""
    base = word
    for suffix, min_len in (("ies", 5), ("ing", 6), ("ed", 5), ("es", 5), ("s", 4), ("ly", 6)):
        if word.endswith(suffix) and len(word) >= min_len and not word.endswith("ss"):
            base = word[: -len(suffix)] + ("y" if suffix == "ies" else "")
            break
    for suffix in ("er", "or"):  # agent nouns: painter ~ painted, creator ~ created
        if base.endswith(suffix) and len(base) >= 7:
            base = base[: -len(suffix)]
            break
    return base[:-1] if base.endswith("e") and len(base) > 4 else base


def _raw_tokens(text: str) -> list[tuple[str, bool]]:
    """(token, looks like a name) pairs; a capitalized word not starting a sentence looks like a name."""
    out: list[tuple[str, bool]] = []
    sentence_start = True
    for m in _TOKEN.finditer(text.replace("’", "'")):
        tok = m.group(0)
        is_name = (tok[:1].isupper() and not sentence_start and tok != "I") or (
            any(c.isdigit() for c in tok) and any(c.isalpha() for c in tok) and not _is_number(tok.lower())
        )
        low = tok.lower()
        if low.endswith("'s"):
            low = low[:-2]
        elif "'" in low:
            head, _, tail = low.partition("'")
            if tail == "t":
                out.append((head[:-1] if head.endswith("n") else head, False))
                out.append(("not", False))
                sentence_start = False
                continue
            low = head
        out.append((low, is_name))
        sentence_start = False
        end = m.end()
        rest = text[end : end + 2]
        if rest[:1] in ".?!" and not rest[:1] == "" and (len(rest) < 2 or rest[1:2] == " "):
            sentence_start = True
    return out


def _is_number(tok: str) -> bool:
    return bool(re.fullmatch(r"\d+(?:[.,:/]\d+)*(?:st|nd|rd|th)?", tok))


def _number_value(tok: str) -> str | None:
    if _is_number(tok):
        tok = re.sub(r"(st|nd|rd|th)$", "", tok)
        if re.fullmatch(r"\d{1,3}(?:,\d{3})+", tok):
            tok = tok.replace(",", "")
        if re.fullmatch(r"\d+\.\d+", tok):
            tok = tok.rstrip("0").rstrip(".")
        return tok.lstrip("0") or "0"
    if tok in NUMBER_WORDS:
        return str(NUMBER_WORDS[tok])
    if tok in ORDINALS:
        return str(ORDINALS[tok])
    return None


def _join_phrases(tokens: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    i = 0
    while i < len(tokens):
        for length in (3, 2):
            chunk = " ".join(t for t, _ in tokens[i : i + length])
            if len(tokens) - i >= length and chunk in PHRASES:
                out.append((PHRASES[chunk], any(n for _, n in tokens[i : i + length])))
                i += length
                break
        else:
            out.append(tokens[i])
            i += 1
    return out


def _merge_compound_numbers(values: list[tuple[int, str]]) -> list[str]:
    """'twenty five' -> 25: a tens word directly followed by a unit word."""
    merged: list[str] = []
    skip = False
    for j, (pos, val) in enumerate(values):
        if skip:
            skip = False
            continue
        nxt = values[j + 1] if j + 1 < len(values) else None
        if nxt and nxt[0] == pos + 1 and val.isdigit() and nxt[1].isdigit():
            a, b = int(val), int(nxt[1])
            if 20 <= a <= 90 and a % 10 == 0 and 1 <= b <= 9:
                merged.append(str(a + b))
                skip = True
                continue
        merged.append(val)
    return merged


def extract(text: str) -> Features:
    tokens = _join_phrases(_raw_tokens(text))
    words = [SYNONYMS.get(t, t) for t, _ in tokens]
    f = Features(tokens=words)
    numbers: list[tuple[int, str]] = []
    negations = 0
    for i, (word, (_, is_name)) in enumerate(zip(words, tokens, strict=True)):
        value = _number_value(word)
        if value is not None:
            numbers.append((i, value))
            continue
        if word in NEGATIONS:
            negations += 1
            continue
        s = stem(word)
        for group, side in _POLAR_INDEX.get(word, ()) + _POLAR_INDEX.get(s, ()):
            f.polar.setdefault(group, set()).add(side)
        unit = UNITS.get(word) or UNITS.get(s)
        if unit:
            f.units.append(unit)
            prev = words[i - 1] if i > 0 else ""
            nxt = words[i + 1] if i + 1 < len(words) else ""
            if _number_value(prev) is not None or prev in _SOURCE_BEFORE or nxt in ("to", "into"):
                f.unit_roles.setdefault("source", set()).add(unit)
            elif prev in _TARGET_BEFORE or nxt == "from":
                f.unit_roles.setdefault("target", set()).add(unit)
            continue
        if is_name or word in GAZETTEER:
            f.entities.add(word)
        if word not in STOPWORDS and word not in FILLERS and len(word) > 1:
            f.content.add(s)
    f.numbers = sorted(_merge_compound_numbers(numbers))
    f.negated = negations % 2 == 1
    f.stems = {stem(w) for w in words}
    f.pairs = _direction_pairs(words)
    return f


def _direction_pairs(words: list[str]) -> set[tuple[str, str]]:
    """Ordered (x, y) for 'from x to y' / 'x to y' / 'x into y': the order changes the question."""
    pairs: set[tuple[str, str]] = set()
    for i, w in enumerate(words):
        if w in ("to", "into") and 0 < i < len(words) - 1:
            x, y = words[i - 1], words[i + 1]
            if x not in STOPWORDS and y not in STOPWORDS and x != y:
                pairs.add((stem(x), stem(y)))
    return pairs


def verify(query: str, cached: str, max_substitutions: int = 0, max_unmatched: int = 2) -> Verdict:
    """May the answer cached for `cached` be returned for `query`?"""
    a, b = extract(query), extract(cached)
    if a.numbers != b.numbers:
        return Verdict(False, "numbers differ")
    if a.negated != b.negated:
        return Verdict(False, "negation differs")
    for group in a.polar.keys() & b.polar.keys():
        if a.polar[group] != b.polar[group]:
            return Verdict(False, f"opposite words ({group})")
    for role in a.unit_roles.keys() & b.unit_roles.keys():
        if a.unit_roles[role] != b.unit_roles[role]:
            return Verdict(False, f"units differ ({role})")
    if a.unit_roles.keys() != b.unit_roles.keys() and a.unit_roles and b.unit_roles:
        return Verdict(False, "conversion direction differs")
    if any((y, x) in b.pairs and (x, y) not in b.pairs for x, y in a.pairs):
        return Verdict(False, "order reversed")
    missing = {e for e in a.entities if e not in b.tokens and stem(e) not in b.stems} | {
        e for e in b.entities if e not in a.tokens and stem(e) not in a.stems
    }
    if missing:
        return Verdict(False, "named entities differ")
    only_a, only_b = a.content - b.content, b.content - a.content
    if min(len(only_a), len(only_b)) > max_substitutions:
        return Verdict(False, "content words substituted")
    if len(only_a) + len(only_b) > max_unmatched:  # "capital city of France" ok; a whole added clause is not
        return Verdict(False, "content words added")
    return Verdict(True)
