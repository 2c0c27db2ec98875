"""A stored question inside a longer message, the rest of it framing that says nothing about the question:
"Hey, tired mum here, Which planet is closest to the sun? Thanks a lot, Raj".

The wrapper lists of cache_service/canonical.py and the word classes of cache_service/phatic.py recognise
framing by its words; people frame questions with sentences of their own ("I've been going round in
circles with this", "Explain it to me like I'm a child:"). Here the test is structural instead. The message
is cut into segments at sentence and clause marks (. ! ? : ; , and dashes, each followed by a space); a run
of whole segments whose canonical key is the stored question's is that question, and every other segment
must be framing:

- no word that can change what is asked: negators, question words, comparison and direction words
  (phatic.KEEP), after contractions are expanded ("if you don't mind" is lost to this rule), except a
  negator of the writer's not knowing or of a hurry ("I can't work out", "no idea", "no rush");
- no number, and no capitalized word past its segment's first (a name or a place: "I live in Canada");
- not opening with a preposition or a subordinating conjunction: "For someone with braces, is ...?" and
  "If I have rosacea, can I ...?" are a clause of the question (moved to its front), not framing;
- no content word shared with the question, plural and verb endings aside ("My dog is a puppy" beside "Can
  dogs eat grapes?" is context, not framing);
- a segment asking something ("Any ideas?") only of function and phatic words;
- at most MAX_FRAMING_WORDS words in all.

A lead-in typed without a mark ("My wife wants to know which ...", "so basically how ...") is cut off before
the question word or auxiliary that opens the question, and must be framing too. After the question, within
its sentence, only a tag of chat, greeting or pleading words may go ("... innit?", "... tbh", "... dear?");
anything else added there ("... on highways in Texas?", "... quickly?") keeps the run from being the stored
question.

The cache tries this on the semantic tier's candidates (cosine at least its floor) that the threshold or a
veto turned down; the vetoes then apply to the run found, not to the whole message.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

from cache_service.canonical import canonical_keys
from cache_service.pair_checks import NEGATORS, expand_contractions
from cache_service.phatic import FUNCTION, KEEP, PHATIC, WEAK

MAX_FRAMING_WORDS = 24  # words outside the question, all segments together
MAX_SEGMENTS = 10  # longer messages are not searched (the runs grow as the square)
# A run longer than the stored question by more than this cannot share its canonical key (the key drops
# wrapper words, never this many), so its key is not computed.
MAX_RUN_EXTRA_WORDS = 8
MAX_LEAD_IN_WORDS = 8  # words of a lead-in typed without a mark before the question ("can u tell me ...")
MAX_TAG_WORDS = 3  # words of a tag typed without a mark after the question ("... pretty please")
# Chat abbreviations and tags of general English chat: like the phatic words, they ask nothing.
CHAT_TAGS = frozenset(
    "tbh idk imo imho ngl innit fr lol lmao omg btw fyi afaik iirc tia tysm thx ty pls plz".split()
)
# Phatic words that can also qualify what is asked ("How do I lose weight quickly?"): never a tag.
_QUALIFYING = frozenset("quick quickly asap urgent urgently help helping question questions".split())
_TAG_WORDS = (PHATIC | WEAK | CHAT_TAGS) - _QUALIFYING
# What a negator in framing may be about: the writer's not knowing, or no hurry (_harmless_negator).
_UNKNOWING = frozenset("know sure idea clue understand remember figure work find".split())
_UNHURRIED = frozenset("rush hurry worries worry pressure problem judgement judgment offense offence".split())
# Where a question may begin after a lead-in: a question word or an auxiliary that opens a yes/no question.
QUESTION_STARTS = frozenset(
    """what which who whom whose when where why how is are was were do does did can could will would should
    shall may might must am has have had""".split()
)
_SEGMENT_END = re.compile(r"(?<=[.!?:;,])\s+|\s+[-–—]+\s+")
_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)*")
_DIGIT = re.compile(r"\d")
_FRAMING_WORDS = FUNCTION | PHATIC | WEAK
_ENDINGS = ("ing", "ies", "es", "ed", "s")
# Words that open a clause belonging to the question: a condition, a purpose, a time, a circumstance.
_CLAUSE_OPENERS = frozenset(
    """if for to when whenever after before without while because since unless until once during with as in
    on at by from given assuming considering like than via per""".split()
)


def _stem(word: str) -> str:
    """A crude stem for comparing content words: lower case, one plural or verb ending off."""
    w = word.lower().removesuffix("'s")
    for end in _ENDINGS:
        if w.endswith(end) and len(w) - len(end) >= 3:
            return w[: -len(end)]
    return w


def _content_stems(text: str) -> set[str]:
    return {
        _stem(w)
        for w in _WORD.findall(expand_contractions(text))
        if w.lower() not in _FRAMING_WORDS and len(w) > 2
    }


def segments(message: str) -> list[str]:
    """The message cut at sentence and clause marks, each segment with its own mark."""
    return [s for s in _SEGMENT_END.split(message.strip()) if s]


def _harmless_negator(lowered: list[str], i: int) -> bool:
    """A negator that only says the writer does not know ("I can't work out", "no idea", "not sure") or
    that there is no hurry ("no rush", "no worries"): it negates the asking, never the question."""
    return lowered[i] in NEGATORS and any(w in _UNKNOWING | _UNHURRIED for w in lowered[i + 1 : i + 3])


def is_framing(segment: str, question_stems: set[str]) -> bool:
    """Whether a segment outside the question leaves it unchanged (the rules in the module's docstring)."""
    if _DIGIT.search(segment):
        return False
    words = _WORD.findall(expand_contractions(segment))
    lowered = [w.lower() for w in words]
    kept = [w for i, w in enumerate(lowered) if w in KEEP and not _harmless_negator(lowered, i)]
    if not lowered or lowered[0] in _CLAUSE_OPENERS or kept:
        return False
    if any(w[:1].isupper() and w not in ("I", "I'm", "I've", "I'd", "I'll") for w in words[1:]):
        return False
    if segment.rstrip().endswith("?") and not all(w in _FRAMING_WORDS for w in lowered):
        return False
    return not (_content_stems(segment) & question_stems)


@functools.lru_cache(maxsize=4096)
def _runs(message: str) -> tuple[tuple[int, int], ...]:
    """Every run of whole segments [i, j) of the message, shortest first (a run that takes in a framing
    clause the canonical key drops, "Sorry if this is silly, can dogs ...?", would bring that clause to the
    vetoes)."""
    n = len(segments(message))
    if not 1 <= n <= MAX_SEGMENTS:
        return ()
    runs = ((i, j) for i in range(n) for j in range(i + 1, n + 1))
    return tuple(sorted(runs, key=lambda run: run[1] - run[0]))


def is_tag(words: list[str]) -> bool:
    """Whether the last words of a question, typed without a mark before them, are a tag that asks nothing
    ("... innit?", "... tbh", "... dear?", "... pretty please"): greeting, thanking, pleading or chat words
    only, none that could qualify the question ("quickly", "right", "no")."""
    lowered = [w.lower() for w in words]
    return bool(lowered) and all(
        _harmless_negator(lowered, i) or (w in _TAG_WORDS | _UNHURRIED and w not in KEEP)
        for i, w in enumerate(lowered)
    )


def _readings(parts: list[str], i: int, j: int) -> Iterator[tuple[str, list[str]]]:
    """(the question, the framing around it) for the run [i, j): the run as it is (never the whole message);
    with a lead-in of its first segment cut off before a question word ("My wife wants to know | which ...",
    "so basically | how ..."); and either with a tag of its last segment cut off ("... | innit?")."""
    rest = parts[:i] + parts[j:]
    starts = [(parts[i], [])]
    for m in list(_WORD.finditer(parts[i]))[1 : MAX_LEAD_IN_WORDS + 1]:
        if m.group().lower() in QUESTION_STARTS:
            starts.append((parts[i][m.start() :], [parts[i][: m.start()]]))
    for first, lead_in in starts:
        body = " ".join([first, *parts[i + 1 : j]])
        if lead_in or j - i < len(parts):
            yield body, [*rest, *lead_in]
        words = list(_WORD.finditer(body))
        for n in range(1, min(MAX_TAG_WORDS, len(words) - 1) + 1):
            if is_tag([m.group() for m in words[-n:]]):
                yield body[: words[-n].start()].rstrip(" ,") + body[words[-1].end() :], [*rest, *lead_in]


def framed_question(message: str, stored: str) -> str | None:
    """The run of `message` that is `stored` retyped, when everything else in it is framing; else None.
    A run's canonical keys (most of a millisecond) are only computed when its words hold every content word
    of `stored` and are not too many for its key."""
    runs = _runs(message)
    if not runs:
        return None
    wanted = canonical_keys(stored)
    parts = segments(message)
    question_stems = _content_stems(stored)
    stems = [_content_stems(p) for p in parts]
    most = len(_WORD.findall(stored)) + MAX_RUN_EXTRA_WORDS
    for i, j in runs:
        if not question_stems <= set().union(*stems[i:j]):
            continue
        for question, rest in _readings(parts, i, j):
            if len(_WORD.findall(question)) > most:
                continue
            if sum(len(_WORD.findall(p)) for p in rest) > MAX_FRAMING_WORDS:
                continue
            if not canonical_keys(question) & wanted:
                continue
            if all(is_framing(p, question_stems) for p in rest):
                return question
    return None
