"""Cheap, general checks on two questions: numbers (and what they count), negation (words and prefixes),
dates, contractions.

A sentence model reads "3 pounds" and "a pound", "safe" and "not safe", "legal" and "illegal", "in June" and
"in December" as almost the same question. These closed classes of English (number words, negators,
negating prefixes, calendar words) are checked exactly instead. They are general vocabulary and morphology,
not words picked from any evaluation set. Different numbers (when both sides name some), a negation on one
side only, and different arithmetic relations or operations veto a candidate (`veto`, called by
cache_service/vetoes.py).
"""

from __future__ import annotations

import re
import unicodedata

# A clock time ("3:30") and a number with a thousands "k" ("$10k") are one word each.
_WORD = re.compile(r"\d{1,2}:\d\d\b|\d+(?:[.,]\d+)*k\b|\d+(?:[.,]\d+)*|[^\W\d_]+(?:'[^\W\d_]+)?")
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
# The same contractions typed without the apostrophe, as chat users do ("whats", "dont", "im"), where the
# bare form is no other English word: "its", "were", "well", "ill", "id", "lets", "hell", "shell" and "wed"
# are words of their own and are left alone. "wont" is one too ("as was his wont"), but not in a question
# typed to a chat: there it is "won't".
_BARE_NOT = "do does did is are was were has have had could should would must need".split()
_BARE = {f"{w}nt": f"{w} not" for w in _BARE_NOT} | {"cant": "cannot", "aint": "is not", "wont": "will not"}
_BARE |= {f"{w}s": f"{w} is" for w in "what where who how when why that there here".split()}
_BARE |= {
    "im": "i am",
    "ive": "i have",
    "youre": "you are",
    "youve": "you have",
    "youll": "you will",
    "theyre": "they are",
    "theyve": "they have",
    "theyll": "they will",
    "weve": "we have",
    "hes": "he is",
    "shes": "she is",
}
_BARE_WORD = re.compile(r"\b(" + "|".join(sorted(_BARE, key=len, reverse=True)) + r")\b", re.I)
# "w/o" and "w/" are written "without" and "with" in notes and chat: "Arduino w/o delay()"
_WITHOUT = re.compile(r"\bw/o\b|\bwith out\b", re.I)  # "with out": "without" split in two
_WITH = re.compile(r"\bw/(?=\s)", re.I)


def expand_contractions(text: str) -> str:
    """ "What's" -> "what is", "can't" -> "cannot": the same question written both ways reads the same."""
    text = text.replace("’", "'")
    for pattern, replacement in _CONTRACTIONS:
        text = pattern.sub(replacement, text)
    text = _WITH.sub("with", _WITHOUT.sub("without", text))
    return _BARE_WORD.sub(lambda m: _BARE[m.group(1).lower()], text)


_DECIMAL_POINT = re.compile(r"(?<=\d)\.(?=\d)")
_NOT_WORDING = re.compile(r"[^\w%$#+&@=<>≤≥≠\x00\x01]+")  # punctuation, hyphens, quotes, spaces
# The relations of arithmetic: "3x + 7 = 22" and "3x + 7 > 22" ask different things.
_RELATIONS = re.compile(r"[=<>≤≥≠]")
# A capital "A" inside a text is a name, not an article ("vitamin A", "plan A"): kept, as \x01.
_NAMED_A = re.compile(r"(?<=\S)(\s+)A\b")
_ARTICLE = re.compile(r"\b(?:a|an|the)\b")


def wording(text: str) -> str:
    """What is left of a text once case, punctuation, hyphens, spacing and articles are gone, as answer
    normalization in question-answering evaluation does (SQuAD's: lower case, no punctuation, no articles):
    "carry-on" = "carry on", "7pm" = "7 pm", "co-worker" = "coworker", "$3,000" = "$3000", "the second coat" =
    "a second coat". Decimal points and the symbols that change a quantity or a name (% $ # + & @) or a
    relation (= < > ≤ ≥ ≠) stay: "3.5" is not "35", "C++" is not "C", "x = 2" is not "x > 2"."""
    text = _NAMED_A.sub("\\1\x01", unicodedata.normalize("NFKC", text).strip()).lower()
    text = _ARTICLE.sub(" ", _DECIMAL_POINT.sub("\x00", _THOUSANDS.sub("", text)))
    text = _NOT_WORDING.sub(" ", text)
    return re.sub(r"\s+", "", text).replace("\x00", ".")


def same_wording(a: str, b: str) -> bool:
    return wording(a) == wording(b)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("’", "'"))


_SCALES = {"hundred": 100.0, "thousand": 1e3, "million": 1e6, "billion": 1e9}


def with_next(ws: list[str]) -> zip:
    """Each word with the one after it ("" after the last)."""
    return zip(ws, [*ws[1:], ""], strict=True)


def numbers(ws: list[str]) -> list[float]:
    """Every number written in digits or as a word, as a sorted multiset ("1,000" = 1000, "2nd" = 2); number
    words in a row are one number ("twenty five" = 25, "ten thousand" = 10000, "three hundred and fifty" =
    350, "10 thousand" = 10000)."""
    out: list[float] = []
    run: list[tuple[str, float]] = []  # the number words (and a number before a scale) being read

    def close() -> None:
        if run:
            out.append(_run_value(run))
            run.clear()

    for i, w in enumerate(ws):
        value = _value(w)
        ahead = ws[i + 1] if i + 1 < len(ws) else ""
        if w == "and" and run and run[-1][0] in _SCALES and ahead in NUMBER_WORDS:
            continue  # "three hundred and fifty"
        if value is None:
            close()
            continue
        word = w in NUMBER_WORDS or w in ORDINAL_WORDS  # "twenty fifth"
        joins = run and (
            w in _SCALES  # "ten thousand", "10 thousand"
            or (word and run[-1][0] in NUMBER_WORDS and _joins(run, value))
        )
        if not joins:
            close()
        if word or ahead in _SCALES:
            run.append((w if word else "#", value))
        else:
            out.append(value)
    close()
    return sorted(out)


_SPOKEN_PARTS = {"one": 1.0, "oh": 0.0}  # "one" is no number word alone ("one of them"); "oh" is a zero


def spoken_numbers(ws: list[str]) -> list[float]:
    """`numbers` with numbers read aloud in parts: a run of number words that counting does not join, every
    part under 100 and each after the first two digits long or an "oh", is its parts' digits in a row ("one
    eighty" = 180, "three fifty" = 350, "twenty fifteen" = 2015, "one oh two" = 102)."""
    out: list[str] = []
    i = 0
    while i < len(ws):
        j = i
        while j < len(ws) and (ws[j] in _SPOKEN_PARTS or NUMBER_WORDS.get(ws[j], 100) < 100):
            j += 1
        digits = _spoken_digits(ws[i:j]) if j - i >= 2 else None
        out += [digits] if digits else ws[i : max(j, i + 1)]
        i = max(j, i + 1)
    return numbers(out)


def _spoken_digits(run: list[str]) -> str | None:
    parts: list[tuple[str, float]] = []
    for w in run:
        value = NUMBER_WORDS.get(w, _SPOKEN_PARTS.get(w))
        if parts and parts[-1][0] not in _SPOKEN_PARTS and value is not None and _joins(parts[-1:], value):
            parts[-1] = (parts[-1][0] + " " + w, parts[-1][1] + value)  # "eighty five"
        else:
            parts.append((w, value))
    # every part after the first is two digits ("one eighty"), an "oh", or one digit after an "oh"
    later = list(zip(parts, parts[1:], strict=False))
    if not later or any(v < 10 and w != "oh" and before != "oh" for (before, _), (w, v) in later):
        return None
    return "".join("0" if w == "oh" else str(int(v)) for w, v in parts)


def _joins(run: list[tuple[str, float]], value: float) -> bool:
    """Whether a number word continues the run: a smaller part after a tens word ("twenty five") or after a
    scale ("hundred fifty"); never two units in a row ("two three")."""
    last_word, last = run[-1]
    if last_word in _SCALES:
        return value < last
    return 20 <= last <= 90 and last % 10 == 0 and 1 <= value <= 9


def _run_value(run: list[tuple[str, float]]) -> float:
    total = current = 0.0
    for word, value in run:
        if word in _SCALES:
            if value == 100:
                current = (current or 1) * 100
            else:
                total += (current or 1) * value
                current = 0.0
        else:
            current += value
    return total + current


def _value(w: str) -> float | None:
    """A word's number: "1,000" = 1000, "10k" = 10000, "3:30" = 3.5 (hours), "twelve" = 12, "2nd" = 2."""
    if w[0].isdigit():
        if ":" in w:
            hours, minutes = w.split(":")
            return int(hours) + int(minutes) / 60
        scale = 1e3 if w.endswith("k") else 1.0
        try:
            return float(_THOUSANDS.sub("", w.removesuffix("k"))) * scale
        except ValueError:
            return None
    return NUMBER_WORDS.get(w, ORDINAL_WORDS.get(w))


# Verbs and words that negate what follows them ("avoid doing X" asks the opposite of "do X"): a closed
# class of English, in all their forms.
_NEGATING_STEMS = (
    "avoid", "prevent", "refus", "declin", "stop", "quit", "fail", "lack", "skip", "opposite",
)  # fmt: skip
_FORMS = ("", "s", "ed", "ing", "e", "es", "ping", "ped")
NEGATING_WORDS = frozenset(stem + end for stem in _NEGATING_STEMS for end in _FORMS) | frozenset(
    "except unlike instead".split()
)


# Phrasal verbs that refuse, cancel or prevent ("turn down an offer", "rule it out", "keep pipes from
# freezing"), in all their forms, with their particle up to PARTICLE_REACH words after the verb.
_PHRASAL_NEGATORS = {
    "down": "turn turns turned turning",
    "out": "rule rules ruled ruling opt opts opted opting",
    "off": "call calls called calling",
    "up": "give gives gave given giving",
}
_PHRASAL_VERBS = {verb: particle for particle, verbs in _PHRASAL_NEGATORS.items() for verb in verbs.split()}
_KEEP_FROM = frozenset("keep keeps kept keeping".split())
PARTICLE_REACH = 3


def _phrasal_negator(ws: list[str]) -> bool:
    for i, w in enumerate(ws):
        ahead = ws[i + 1 : i + 1 + PARTICLE_REACH]
        if _PHRASAL_VERBS.get(w) in ahead:
            return True
        window = ws[i + 1 : i + 2 + PARTICLE_REACH]  # "keep the pipes from freezing"
        if w in _KEEP_FROM and "from" in window:
            after = ws[i + 2 + window.index("from") : i + 3 + window.index("from")]
            if after and after[0].endswith("ing") and len(after[0]) > 4:
                return True
    return False


def negating_words(ws: list[str]) -> bool:
    """Whether a negating verb or word ("avoid", "prevent", "stop", "fail", "opposite", "except", "instead",
    "rather than") or phrasal verb ("turn down", "rule out", "keep ... from doing") is said."""
    rather_than = any(w == "rather" and after == "than" for w, after in with_next(ws))
    return any(w in NEGATING_WORDS for w in ws) or rather_than or _phrasal_negator(ws)


# "aren'r", "don'y": "n't" mistyped (never a possessive or another contraction: "men's", "John'd", "Ian'm")
_MISTYPED_NT = re.compile(r"[a-z]+n'[a-ce-ln-ru-z]")


def negated(ws: list[str]) -> bool:
    """Odd number of negators ("not", "no", "without", "n't"...): two cancel out."""
    return sum(1 for w in ws if w in NEGATORS or w.endswith("n't") or _MISTYPED_NT.fullmatch(w)) % 2 == 1


def dates(ws: list[str]) -> set[str]:
    """Calendar words, singular ("Sundays" = "sunday")."""
    found = set()
    for w in ws:
        w = w.removesuffix("'s")  # "today's rate" is today's
        base = w[:-1] if w.endswith("s") and w[:-1] in DATE_WORDS else w
        if base in DATE_WORDS:
            found.add(base)
    return found


# English prefixes that negate the word they are put on ("illegal", "uninstall", "disadvantage").
NEGATING_PREFIXES = ("un", "in", "im", "il", "ir", "dis", "non")
_MIN_BASE = 4  # "in" + "to" is no negation: the word left without its prefix must be a real word


def singular(w: str) -> str:
    """Plural to singular, roughly ("miles" = "mile", "cities" = "city"), so counted things compare."""
    for suffix in ("ies", "es", "s"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3 and not w.endswith("ss"):
            return w[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return w


def prefix_negated(wa: list[str], wb: list[str]) -> bool:
    """One side says "unX" (or "inX", "disX"...) where the other says "X", and neither side says both.

    The negators of `negated` are words of their own; English also negates with a prefix, and the sentence
    model reads "legal" and "illegal" as near-synonyms. The base must be written on the other side, so
    "unlock" is only compared with "lock", never guessed from a dictionary.
    """
    sa, sb = {singular(w) for w in wa}, {singular(w) for w in wb}
    for one, other in ((sa, sb), (sb, sa)):
        for w in one - other:
            for prefix in NEGATING_PREFIXES:
                base = w[len(prefix) :]
                if w.startswith(prefix) and len(base) >= _MIN_BASE and base in other and base not in one:
                    return True
    return False


def _counted(ws: list[str]) -> dict[float, tuple[str, set[str]]]:
    """Per number (its first mention): the word right after it, what it counts ("5 km"), and the two
    words after it (a modifier may come between: "two Git branches")."""
    out: dict[float, tuple[str, set[str]]] = {}
    for i, w in enumerate(ws[:-1]):
        value = _value(w)
        if value is not None and _value(ws[i + 1]) is None:
            out.setdefault(value, (singular(ws[i + 1]), {singular(x) for x in ws[i + 1 : i + 3]}))
    return out


def counted_swapped(wa: list[str], wb: list[str]) -> bool:
    """The same number counts different things, and both things are named on both sides.

    "5 km to miles" and "5 miles to km" hold the same numbers and the same words, so neither the number
    check nor the sentence model tells them apart. Requiring both counted things on both sides keeps
    rewordings through: "How many miles is 5 km?" counts km as "Convert 5 km to miles" does.
    """
    ca, cb = _counted(wa), _counted(wb)
    sa, sb = {singular(w) for w in wa}, {singular(w) for w in wb}
    for value, (thing_a, near_a) in ca.items():
        if value not in cb:
            continue
        thing_b, near_b = cb[value]
        if thing_a not in near_b and thing_b not in near_a and thing_a in sb and thing_b in sa:
            return True
    return False


# A year (1800-2099) written alone: not a part of a date ("2023-05-01"), an amount ("$2000", "2,000") or a
# longer number.
_YEAR = re.compile(r"(?<![\d$£€.,/-])(?:1[89]|20)\d\d(?!\d|[.,/-]\d)")


def years(text: str) -> set[str]:
    """The years a question names: a year on one side only asks about another time ("as of 2010")."""
    return set(_YEAR.findall(text))


# "no" right before another determiner is never English's "no" ("weigh no the Moon"): "on" mistyped.
_ON_MISTYPED = re.compile(r"\bno(?=[ \t]+(?:the|a|an|my|your|his|her|our|their|its|this|that|these|those)\b)")


_RATIO = re.compile(r"\d\s*[/:]\s*\d")  # "80/20", "16:9": shares written without a percent sign
_PERCENT = re.compile(r"%|\bper ?cent\b|\bpct\b", re.I)


def percents(text: str) -> list[float]:
    """The numbers said as percentages ("50%", "50 percent", "fifty per cent"), sorted."""
    ws = words(_PERCENT.sub(" percent ", text))
    said = [_value(w) for w, after in with_next(ws) if after == "percent"]
    return sorted(v for v in said if v is not None)


# The operations of arithmetic: "767 - 96" and "767 * 96" ask different things, though the canonical key drops
# a spaced operator as punctuation and a sentence model reads them as one question. A sign counts as binary
# (spaced on both sides or on neither, by spaces only) between a number in digits or a bracket and another
# operand, or between two one-letter variables when spaced ("a + b"; only the letters algebra names unknowns
# with: "5V / 220R" and "g / 5gal" hold units). "-" and "/" with no spaces between numbers are loose ("~-",
# "~/"): ranges, dates and fractions as often ("0-9", "2024/25", "3/4"). Not signs: "-" and "/" with no
# spaces beside a letter (codes: "F-150", "y/o"), a sign before a number alone ("+1.75", "-5"), the dot of a
# hydrate ("CaCl2·2H2O"), an "x" or "by" (dimensions as often as products: "4x8", "4 by 8"). Said in words
# ("plus", "times", "divided by") an operation counts between a number and a number or variable ("three x
# plus seven"; "3 times a week" is none).
_SPOKEN_OPERATORS = {"plus": "+", "minus": "-", "times": "*", "multiplied by": "*", "divided by": "/"}
_SPOKEN_OPERATOR = re.compile(r"\b(multiplied by|divided by|plus|minus|times)\b")
_OPERATOR_SIGNS = {"−": "-", "–": "-", "×": "*", "÷": "/", "**": "^"}
_OPERATION_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+|\*\*|\x02[-+*/]|[-+*/^×÷−–()]")
_VARIABLES = frozenset("abcnxyz")


def _operand(token: str) -> str:
    """ "digits", "number" (a number word), "variable", "bracket" or "" (no operand)."""
    if token[0].isdigit():
        return "digits"
    if token in NUMBER_WORDS:
        return "number"
    if token in _VARIABLES:
        return "variable"
    return "bracket" if token in "()" else ""


def operations(text: str) -> list[str]:
    """The operators of arithmetic a text writes between operands, as a sorted multiset ("12 * 4", "12 × 4"
    and "twelve times four": ["*"]; "0-9": ["~-"], loose)."""
    text = _SPOKEN_OPERATOR.sub(lambda m: " \x02" + _SPOKEN_OPERATORS[m.group(1)] + " ", text.lower())
    tokens = list(_OPERATION_TOKEN.finditer(text))
    found = []
    for before, sign, after in zip(tokens, tokens[1:], tokens[2:], strict=False):
        left, right = _operand(before.group()), _operand(after.group())
        if sign.group().startswith("\x02"):  # said in words; "a" there is the article ("3 times a week")
            sides = {left, right} if "a" not in (before.group(), after.group()) else set()
            if sides <= {"digits", "number", "variable"} and sides & {"digits", "number"}:
                found.append(sign.group()[1])
            continue
        gaps = text[before.end() : sign.start()], text[sign.end() : after.start()]
        op = _OPERATOR_SIGNS.get(sign.group(), sign.group())
        if op not in "-+*/^" or not (left and right) or bool(gaps[0]) != bool(gaps[1]):
            continue
        if any(g and not g.isspace() for g in gaps):
            continue
        spaced = bool(gaps[0])
        if op in "-/" and not spaced and "variable" in (left, right):
            continue
        if op in "-/" and not spaced and left == right == "digits":
            found.append("~" + op)  # a range, date or fraction as often: "767-96" may be "767 - 96"
            continue
        if {"digits", "bracket"} & {left, right} or (spaced and left == right == "variable"):
            found.append(op)
    return sorted(found)


def operations_differ(oa: list[str], ob: list[str], same_numbers: bool) -> bool:
    """Other operations on both sides ("12 - 4" / "12 * 4"), or on one side of the same numbers ("12 - 4" /
    "12 4"), unless a loose sign there may be it ("767 - 96" / "767-96"); loose signs alone never differ."""
    clear_a, clear_b = [o for o in oa if o[0] != "~"], [o for o in ob if o[0] != "~"]
    if clear_a and clear_b:
        return clear_a != clear_b
    if not (clear_a or clear_b) or not same_numbers:
        return False
    one, other = (clear_a, ob) if clear_a else (clear_b, oa)
    return bool(set(one) - {o[1] for o in other if o[0] == "~"})


def read_aloud_equal(wa: list[str], wb: list[str], na: list[float], nb: list[float]) -> bool:
    """The same numbers once one side's are read as spoken ("one eighty" / "180")."""
    sa, sb = spoken_numbers(wa), spoken_numbers(wb)
    return sa == nb or na == sb or sa == sb


def on_mistyped(text: str) -> str:
    return _ON_MISTYPED.sub("on", text)


def veto(a: str, b: str) -> str:
    """Why `a` and `b` can't share an answer ("" when nothing objects); more vetoes: cache_service/vetoes.py.

    Numbers veto only when both sides name some and they differ ("5 km" / "10 km"), and so do the relations
    of arithmetic (= < > ≤ ≥ ≠, as a multiset: "3x + 7 = 22" / "3x + 7 > 22"); a number on one side alone
    is as often a rewording ("merge two branches" / "merge one branch into another", "a second ago" /
    "just now") as an added detail."""
    wa, wb = words(a), words(b)
    na, nb = numbers(wa), numbers(wb)
    if na and nb and na != nb and not read_aloud_equal(wa, wb, na, nb):
        return "numbers differ"
    if bool(years(a)) != bool(years(b)) and not (na and nb):
        return "a year on one side only"  # "How many time zones does Russia have (in 2012)?"
    # polarity, not the words that carry it: "so I don't get charged" / "to avoid charges", and "won't stop
    # calling" / "keeps calling" say the same; "avoid" or "not" on one side alone still differs
    if negated(wa) ^ negating_words(wa) != negated(wb) ^ negating_words(wb) or prefix_negated(wa, wb):
        return "negation differs"
    if counted_swapped(wa, wb):
        return "units swapped"
    if na == nb and percents(a) != percents(b) and not _RATIO.search(a + " " + b):
        return "units differ"  # "cells > 50" / "cells > 50%"
    ra, rb = sorted(_RELATIONS.findall(a)), sorted(_RELATIONS.findall(b))
    if ra and rb and ra != rb:
        return "relations differ"
    if operations_differ(operations(a), operations(b), na == nb):
        return "operations differ"
    return ""
