"""The same words written another way: what two questions spell differently without saying anything
different ("7pm" / "7 pm", "Wi-Fi" / "wifi", "6-month-old" / "6 months old", "10kg" / "10 kilograms",
"40°F" / "40 degrees Fahrenheit", "3rd" / "third", "US" / "United States" / "America", "kids iPhone" /
"kid's iPhone", "thru" / "through").

The vetoes (cache_service/vetoes.py) refuse a name on one side only and a content word changed in an
otherwise identical question; a word respelled on the other side is neither. Everything here is general
English (units of measure, number words, standard short names, chat spellings and clipped words, acronyms,
possessives), not read from any evaluation data. A number keeps its unit ("10kg" / "10 km" stay apart), and
a plural is only dropped after a number ("a tablespoon" / "4 tablespoons" keep their difference) or from a
name ("Sundays" / "Sunday").
"""

from __future__ import annotations

import functools
import re
import unicodedata

from cache_service.canonical import case_says_nothing
from cache_service.pair_checks import NUMBER_WORDS, ORDINAL_WORDS

_TOKEN = re.compile(r"[\w]+(?:[.'+#&@/\-][\w]+)*")
_SENTENCE_BREAK = re.compile(r"[.!?:;\n\"(]")


def tokens(text: str) -> list[tuple[str, bool]]:
    """(word, starts a sentence) for each word of `text`."""
    out = []
    end = 0
    for m in _TOKEN.finditer(text):
        out.append((m.group(), end == 0 or bool(_SENTENCE_BREAK.search(text[end : m.start()]))))
        end = m.end()
    return out


def plain(word: str) -> str:
    """Lower case, without the possessive (also mistyped: "Kant'ss")."""
    return re.sub(r"'s+$", "", word.lower())


def _possessives(text: str) -> dict[str, set[str]]:
    """The words typed with a possessive "'s" ("kid's") by how they read typed without the apostrophe
    ("kids"), with their own forms ("kid's", "kid")."""
    out: dict[str, set[str]] = {}
    for w, _ in tokens(text):
        w = w.lower()
        if w.endswith("'s"):
            out.setdefault(w[:-2] + "s", set()).update({w, w[:-2]})
    return out


# Units of measure as written after a number, spelled out or in the plural -> one short form.
_UNITS = (
    ("kg", "kilogram kilograms kilo kilos kgs"), ("g", "gram grams gm gms"), ("mg", "milligram milligrams"),
    ("lb", "pound pounds lbs"), ("oz", "ounce ounces"),
    ("km", "kilometer kilometers kilometre kilometres kms"),
    ("m", "meter meters metre metres"), ("cm", "centimeter centimeters centimetre centimetres"),
    ("mm", "millimeter millimeters millimetre millimetres"), ("mi", "mile miles"), ("ft", "foot feet"),
    ("inch", "inches"), ("yd", "yard yards"), ("l", "liter liters litre litres"),
    ("ml", "milliliter milliliters millilitre millilitres"), ("gal", "gallon gallons"),
    ("w", "watt watts"), ("kw", "kilowatt kilowatts"), ("v", "volt volts"),
    ("gb", "gigabyte gigabytes gig gigs"), ("mb", "megabyte megabytes meg megs"),
    ("tb", "terabyte terabytes"),
    ("ghz", "gigahertz"), ("mhz", "megahertz"), ("hz", "hertz"),
    ("f", "fahrenheit"), ("c", "celsius centigrade"),
    ("h", "hour hours hr hrs"), ("min", "minute minutes mins"), ("s", "second seconds sec secs"),
    ("d", "day days"), ("wk", "week weeks wks"), ("mo", "month months mos"), ("yr", "year years yrs"),
    ("yrold", "yo"), ("000", "thousand"), ("", "degree degrees percent per-cent"),
)  # fmt: skip
UNITS: dict[str, str] = {long: short for short, longs in _UNITS for long in longs.split()}
_ORDINAL_ENDINGS = {1: "st", 2: "nd", 3: "rd"}
# The same place or thing under a standard short name, and a word in its chat spelling or clipped, in general
# English use; an acronym of the other side's words ("United States", "New York") is matched without a table.
_SAME_NAMES = (
    ("us", "usa u.s u.s.a america american americans"),
    ("uk", "britain british"),
    ("js", "javascript"),
    ("ts", "typescript"),
    ("postgres", "postgresql"),
    ("ok", "okay"),
    # chat spellings and clipped words of general English
    ("thru", "through"), ("tho", "though"), ("altho", "although"), ("u", "you"), ("ur", "your"),
    ("pls", "please"), ("plz", "please"), ("cuz", "because"), ("coz", "because"), ("bc", "because"),
    ("ppl", "people"), ("msg", "message"), ("abt", "about"), ("bday", "birthday"), ("thx", "thanks"),
    ("temp", "temperature"), ("info", "information"), ("pic", "picture photo"), ("pics", "pictures photos"),
    ("fridge", "refrigerator"), ("approx", "approximately"), ("max", "maximum"),
)  # fmt: skip
# More clipped words, chat and notes spellings, British and American forms and library short names, matched
# word to word only: never as the initials of the other side's words ("pd" is not "polars drop").
_CLIPPED = (
    ("hr", "hour"), ("hrs", "hours"), ("min", "minute"), ("mins", "minutes"), ("sec", "second"),
    ("secs", "seconds"), ("calc", "calculate calculation"), ("col", "column"), ("cols", "columns"),
    ("conc", "concentration"), ("soln", "solution"), ("std", "standard"), ("vs", "versus"),
    ("b4", "before"), ("rn", "now"), ("wanna", "want"), ("gonna", "going"), ("tbh", "honest"),
    ("ty", "thanks"), ("cause", "because"), ("mum", "mom"), ("whilst", "while"), ("amongst", "among"),
    ("deg", "degree degrees"), ("yt", "youtube"), ("np", "numpy"), ("pd", "pandas"),
    ("sklearn", "scikit-learn"), ("mobo", "motherboard"), ("vol", "volume"), ("vols", "volumes"),
)  # fmt: skip


def _both_ways(table: tuple[tuple[str, str], ...]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for short, longs in table:
        for long in longs.split():
            out.setdefault(short, set()).add(long)
            out.setdefault(long, set()).add(short)
    return out


SAME_NAMES = _both_ways(_SAME_NAMES)
CLIPPED = _both_ways(_CLIPPED)
NOT_NAMES = frozenset({"ok"})  # "OK" typed in capitals is a word of assent, not a name
_ACRONYM_GLUE = frozenset({"of", "and", "the"})
_NUMBER_AND_UNIT = re.compile(r"(\d+)([a-z]+)")


def _number_word(part: str) -> str:
    if part in NUMBER_WORDS:
        return str(int(NUMBER_WORDS[part]))
    if part in ORDINAL_WORDS:
        n = int(ORDINAL_WORDS[part])
        return f"{n}{_ORDINAL_ENDINGS.get(n, 'th')}"
    return part


def _pieces(words: list[str]) -> list[str]:
    """Each word as one string without hyphens or dots, number words in digits ("one" only inside a
    compound), and a unit after a number in its short form: "6-month-old" -> "6moold", "10 kilograms" ->
    "10" "kg", "80k" -> "80000", "0 to 9" -> "0" "" "9"."""
    out = []
    after_number = False
    for i, word in enumerate(words):
        ahead = words[i + 1] if i + 1 < len(words) else ""
        if word == "to" and after_number and ahead[:1].isdigit():  # "0 to 9" = "0-9"
            out.append("")
            continue
        parts = []
        compound = "-" in word
        for part in unicodedata.normalize("NFKC", word).replace(".", "").split("-"):
            part = "1" if compound and part == "one" else _number_word(part)  # "one-hour" = "1-hour"
            m = _NUMBER_AND_UNIT.fullmatch(part)
            if m and m.group(2) not in _ORDINAL_ENDINGS.values() and m.group(2) != "th":
                part = m.group(1) + ("000" if m.group(2) == "k" else UNITS.get(m.group(2), m.group(2)))
            elif after_number and part in UNITS:
                part = UNITS[part]
            if part:
                after_number = part[-1].isdigit()
            parts.append(part)
        out.append("".join(parts))
    return out


@functools.lru_cache(maxsize=4096)  # a question meets several candidates
def _runs(text: str) -> dict[str, set[str]]:
    """Every run of up to four consecutive words of `text` written as one (`_pieces`), with its words."""
    ws = [plain(w) for w, _ in tokens(text)]
    pieces = _pieces(ws)
    out: dict[str, set[str]] = {}
    for i in range(len(ws)):
        for j in range(i + 1, min(i + 5, len(ws) + 1)):
            key = "".join(pieces[i:j])
            if key:
                out.setdefault(key, set()).update(ws[i:j])
    return out


@functools.lru_cache(maxsize=4096)
def _acronyms(text: str) -> dict[str, set[str]]:
    """Initials of runs of two to five content words ("United States" -> "us", "United States of America"
    -> "usa", "machine learning" -> "ml"), with the words they stand for: capitalized words, or lower-case
    words of three letters or more, never a word in capitals ("UK savings" stands for nothing)."""
    from cache_service.vetoes import FUNCTION_WORDS

    typed = [w for w, _ in tokens(text)]
    cased = any(c.isupper() for c in text) and not case_says_nothing(text)
    ws = [plain(w) for w in typed]
    out: dict[str, set[str]] = {}
    for i, first in enumerate(ws):
        if first in FUNCTION_WORDS:
            continue
        run: list[str] = []
        for t, w in zip(typed[i : i + 7], ws[i : i + 7], strict=True):
            if w in _ACRONYM_GLUE and run:
                continue
            spelled_out = t[1:].islower() and (t[:1].isupper() or len(w) >= 3) if cased else len(w) >= 3
            if w in FUNCTION_WORDS or not w.isalpha() or not spelled_out:
                break
            run.append(w)
            if len(run) >= 2:
                out.setdefault("".join(x[0] for x in run), set()).update(run)
    return out


def respelled(a: str, b: str) -> frozenset[str]:
    """The words (lower case) of either question that the other writes another way: runs of words equal
    once written as one (`_pieces`), a standard short name or chat spelling ("US" / "America", "thru" /
    "through"), an acronym of words the other spells out ("US" / "United States"), or a possessive typed
    without its apostrophe ("kids" / "kid's")."""
    return _respelled(*sorted((a, b)))  # symmetric: the names veto asks both ways, the detail veto once


@functools.lru_cache(maxsize=4096)
def _respelled(a: str, b: str) -> frozenset[str]:
    out: set[str] = set()
    wa, wb = {plain(w) for w, _ in tokens(a)}, {plain(w) for w, _ in tokens(b)}
    for x, y, other in ((wa, wb, b), (wb, wa, a)):  # "kids iPhone" / "kid's iPhone"
        possessives = _possessives(other)
        for w in x - y:
            if w in possessives:
                out |= {w} | possessives[w]
    runs_a, runs_b = _runs(a), _runs(b)
    for key in runs_a.keys() & runs_b.keys():
        out |= runs_a[key] | runs_b[key]
    for x, y, other_acronyms in ((wa, wb, _acronyms(b)), (wb, wa, _acronyms(a))):
        for w in x:
            other_spellings = SAME_NAMES.get(w, set()) | CLIPPED.get(w, set())
            if other_spellings & y:
                out |= {w} | (other_spellings & y)
            for acronym, spelled in other_acronyms.items():  # "US" or "America" / "United States"
                if w == acronym or w in SAME_NAMES.get(acronym, ()):
                    out |= {w} | spelled
    return frozenset(out)


def singular_name(name: str) -> str:
    """A name without a plural "s" ("Sundays", "Americans"): for names only, where the plural counts
    nothing."""
    if len(name) >= 4 and name.endswith("s") and not name.endswith("ss") and name[-2].isalpha():
        return name[:-1]
    return name
