"""Cheap, general checks that veto a candidate before the learned verifier: numbers, negation, dates.

A sentence model reads "3 pounds" and "a pound", "safe" and "not safe", "in June" and "in December" as
almost the same question. These closed word classes of English are checked exactly instead. The lists are
general vocabulary (number words, negators, calendar words), not words picked from any evaluation set.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+(?:'[^\W\d_]+)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
# "one" is left out: it is a pronoun as often as a number ("merge one branch into another").
_CARDINALS = (
    "zero _ two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty"
).split()
NUMBER_WORDS: dict[str, float] = {w: float(i) for i, w in enumerate(_CARDINALS) if w != "_"}
NUMBER_WORDS |= {
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
    "hundred": 100,
    "thousand": 1e3,
    "million": 1e6,
    "billion": 1e9,
}
_ORDINALS = "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth".split()
ORDINAL_WORDS: dict[str, float] = {w: float(i + 1) for i, w in enumerate(_ORDINALS)}
NEGATORS = frozenset("not no never without none nobody nothing neither nor cannot".split())
DATE_WORDS = frozenset(
    "january february march april june july august september october november december monday tuesday "
    "wednesday thursday friday saturday sunday today tomorrow yesterday tonight spring summer autumn "
    "winter".split()
)  # "may" and "fall" are left out: mostly a verb


# Contractions whose expansion is unambiguous; "'s" only after words where it can only be "is" ("John's car").
_CONTRACTIONS = (
    (re.compile(r"\b(can)'t\b", re.I), r"\1not"),
    (re.compile(r"\bwon't\b", re.I), "will not"),
    (re.compile(r"n't\b", re.I), " not"),
    (re.compile(r"'re\b", re.I), " are"),
    (re.compile(r"'ll\b", re.I), " will"),
    (re.compile(r"'ve\b", re.I), " have"),
    (re.compile(r"\b(i)'m\b", re.I), r"\1 am"),
    (re.compile(r"\b(what|where|who|how|when|why|it|that|there|here)'s\b", re.I), r"\1 is"),
)


def expand_contractions(text: str) -> str:
    """ "What's" -> "what is", "can't" -> "cannot": the same question written both ways reads the same."""
    text = text.replace("’", "'")
    for pattern, replacement in _CONTRACTIONS:
        text = pattern.sub(replacement, text)
    return text


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("’", "'"))


def numbers(ws: list[str]) -> list[float]:
    """Every number written in digits or as a word, as a sorted multiset ("1,000" = 1000, "2nd" = 2)."""
    out: list[float] = []
    previous_tens = False  # "twenty five", "twenty-fifth": one number
    for w in ws:
        value = _value(w)
        if value is None:
            previous_tens = False
            continue
        if previous_tens and 1 <= value <= 9:
            out[-1] += value
            previous_tens = False
            continue
        out.append(value)
        previous_tens = w in NUMBER_WORDS and 20 <= value <= 90 and value % 10 == 0
    return sorted(out)


def _value(w: str) -> float | None:
    if w[0].isdigit():
        try:
            return float(_THOUSANDS.sub("", w))
        except ValueError:
            return None
    return NUMBER_WORDS.get(w, ORDINAL_WORDS.get(w))


def negated(ws: list[str]) -> bool:
    """Odd number of negators ("not", "no", "without", "n't"...): two cancel out."""
    return sum(1 for w in ws if w in NEGATORS or w.endswith("n't")) % 2 == 1


def dates(ws: list[str]) -> set[str]:
    """Calendar words, singular ("Sundays" = "sunday")."""
    found = set()
    for w in ws:
        base = w[:-1] if w.endswith("s") and w[:-1] in DATE_WORDS else w
        if base in DATE_WORDS:
            found.add(base)
    return found


def veto(a: str, b: str) -> str:
    """Why `a` and `b` can't share an answer ("" when none of the checks objects)."""
    wa, wb = words(a), words(b)
    if numbers(wa) != numbers(wb):
        return "numbers differ"
    if negated(wa) != negated(wb):
        return "negation differs"
    da, db = dates(wa), dates(wb)
    if da and db and da != db:  # one side naming no date ("each night") is not a different date
        return "dates differ"
    return ""
