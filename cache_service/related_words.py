"""Which words of one question the other question does not account for, by meaning as a dictionary knows it.

The word-piece features (pair_features.py) see "buy" and "purchase", or "recommend" and "suggestion", as
unshared pieces with no close static partner: the same evidence as "Paris" against "Lyon". WordNet knows the
difference: "buy" and "purchase" share a meaning (a synset), "installation" is derived from "install". So for
the content words only one side has (function words such as "do", "can", "my" left out: a closed class of
English), the verifier is told how many find no related word among the other side's such words, per side, and
how many do. A reworded question then shows as unshared-but-related words; a swapped entity or a changed scope
as unshared words nothing explains.

The table (cache_service/related_words.tsv.gz) is built from WordNet 3.0 by cache_service/wordnet_build.py:
every single word's meanings, and the links followed from a meaning (LINKS). Two words are related when a
meaning of one is a meaning of the other, or is one link away from it.
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path

from cache_service.pair_checks import base_forms, numbers

RELATED_FILE = Path(__file__).with_name("related_words.tsv.gz")
# WordNet pointer symbols followed one step: derivation alone (hypernyms, "@" / "~", were measured and lost:
# docs/SEMANTIC_CACHE.md). The build writes only these links.
LINKS = ("+",)
RELATED_NAMES = ("unrelated_words_min", "unrelated_words_max", "related_words")

# English function words (pronouns, determiners, auxiliaries and modals, prepositions, conjunctions,
# question words, a few fillers): a closed class, not picked from any data. A rewording swaps them freely
# ("How do I" / "How can I") without changing what is asked.
FUNCTION_WORDS = frozenset(
    """
    a an the this that these those my your his her its our their me you him us them i we he she it they
    myself yourself mine yours what which who whom whose when where why how whether if then than so because
    as while until since though although and or but nor not no do does did done doing be is am are was were
    been being have has had having can could will would shall should may might must to of in on at by for
    with from into onto about over under up down out off some any all each every both either neither much
    many more most few less least other another such own same there here very just too also only even still
    yet again ever please hey hi thanks thank ok okay
    """.split()
)


Meanings = tuple[frozenset[int], frozenset[int]]  # a word's own, and those one link away


@functools.cache
def _table() -> tuple[dict[str, str], dict[int, str], dict[str, str]]:
    """word -> its meanings; meaning -> the meanings one link away (both as the file writes them, read into
    numbers on first use: ~0.1 s to load instead of ~0.4); inflected form -> base form. `load` at start."""
    meanings: dict[str, str] = {}
    linked: dict[int, str] = {}
    inflections: dict[str, str] = {}
    for line in gzip.decompress(RELATED_FILE.read_bytes()).decode().splitlines():
        if not line or line.startswith("#"):
            continue
        head, tail = line.split("\t")
        if head.startswith("="):
            inflections[head[1:]] = tail
        elif not head[0].isalpha():  # a link: its pointer symbol, then the meaning it starts from
            if head[0] in LINKS:
                key = int(head[1:])
                linked[key] = f"{linked[key]} {tail}" if key in linked else tail
        else:
            meanings[head] = tail
    return meanings, linked, inflections


def load() -> None:
    """Read the table now (the service calls this at start, so no lookup pays for it)."""
    _table()


@functools.lru_cache(maxsize=1 << 16)
def word_meanings(word: str) -> frozenset[int]:
    """The meanings (synsets) WordNet gives a word in exactly this form."""
    raw = _table()[0].get(word)
    return frozenset(map(int, raw.split())) if raw else frozenset()


@functools.lru_cache(maxsize=1 << 16)
def linked_meanings(meaning: int) -> frozenset[int]:
    """The meanings one followed link (LINKS) away from a meaning."""
    raw = _table()[1].get(meaning)
    return frozenset(map(int, raw.split())) if raw else frozenset()


def _forms(word: str) -> set[str]:
    """The word and its possible base forms, WordNet's irregular ones included ("got" -> "get")."""
    inflections = _table()[2]
    return base_forms(word) | ({inflections[word]} if word in inflections else set())


def _meanings(forms: set[str]) -> Meanings:
    """A word's own meanings (over its base forms) and those one link away from them."""
    own = frozenset().union(*(word_meanings(f) for f in forms))
    near = frozenset().union(own, *(linked_meanings(m) for m in own))
    return own, near


def _related(one: Meanings, other: Meanings) -> bool:
    return bool(one[0] & other[1] or one[1] & other[0])


def _content(word: str) -> bool:
    """Not a function word, and not a number (numbers are the cheap checks' business: "4" = "four")."""
    return word not in FUNCTION_WORDS and not numbers([word])


def one_sided_words(wa: list[str], wb: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Of two texts' words (pair_checks.words), the content words (function words and numbers left out) of
    a that share no base form with any of b's, the same of b, and a's content words that b shares; each
    sorted."""
    forms_a = {w: _forms(w) for w in set(wa) if _content(w)}
    forms_b = {w: _forms(w) for w in set(wb) if _content(w)}
    all_a = set().union(*forms_a.values()) if forms_a else set()
    all_b = set().union(*forms_b.values()) if forms_b else set()
    only_a = sorted(w for w, forms in forms_a.items() if not forms & all_b)
    only_b = sorted(w for w, forms in forms_b.items() if not forms & all_a)
    shared = sorted(w for w, forms in forms_a.items() if forms & all_b)
    return only_a, only_b, shared


def related_features(wa: list[str], wb: list[str]) -> tuple[float, float, float]:
    """RELATED_NAMES for two texts' words (pair_checks.words): of the content words only one side has (no
    base form in common with the other side; numbers left out), how many find no related word among the
    other side's, on the side with fewer and the side with more such words, and how many (side a) do."""
    one_sided_a, one_sided_b, _ = one_sided_words(wa, wb)
    return related_counts(one_sided_a, one_sided_b)


def related_counts(one_sided_a: list[str], one_sided_b: list[str]) -> tuple[float, float, float]:
    """related_features from the two sides' one-sided words (one_sided_words), for callers that have them."""
    only_a = {w: _meanings(_forms(w)) for w in one_sided_a}
    only_b = {w: _meanings(_forms(w)) for w in one_sided_b}
    related_a = sum(1 for m in only_a.values() if any(_related(m, o) for o in only_b.values()))
    related_b = sum(1 for m in only_b.values() if any(_related(m, o) for o in only_a.values()))
    unrelated = sorted((len(only_a) - related_a, len(only_b) - related_b))
    return float(unrelated[0]), float(unrelated[1]), float(related_a)
