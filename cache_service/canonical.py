"""The canonical tier: one key for the ways people retype the same question, without an embedding model.

`canonical_keys(text)` maps a question to a small set of keys; two questions with a key in common are the
same question retyped. What it undoes, in this order:

1. Greetings, sign-offs and politeness wrappers at either end ("Hi there,", "Thanks in advance!", "Quick
   question:", "Could you tell me", "please"), from the general lists below, written for English chat and
   email at large (not from any evaluation data); a wrapper is only removed when at least two words remain.
2. Contractions, also typed without the apostrophe ("dont", "whats": cache_service/pair_checks.py).
3. Spelling errors in plain lower-case words, only where the correction is unambiguous
   (cache_service/spelling.py); capitalized words, names, numbers and codes are never touched.
4. Case, punctuation (kept inside numbers and codes: "3.5", "node.js", "C++", "$20", "50%") and spacing.
5. Clauses moved around a comma: "To open a joint account, what documents do I need?" also gets the key of
   "What documents do I need to open a joint account?". Clauses move whole (two or three of them); word
   order inside a clause is kept, so "Paris to London" never equals "London to Paris".

Nothing here removes a negation, a number or a name, so two questions with a common key also pass the
semantic tier's vetoes (cache_service/vetoes.py); the cache checks them anyway.
"""

from __future__ import annotations

import functools
import itertools
import re
import unicodedata
from collections.abc import Iterator

from cache_service import spelling
from cache_service.pair_checks import expand_contractions
from cache_service.phatic import (
    FUNCTION,
    audience_only,
    closing_asked_about,
    completes,
    opening_asked_about,
    strip_phatic,
    wrapper_clause,
)
from cache_service.typos import typo_edits

_GREETINGS = (
    "hi", "hello", "hey", "hiya", "heya", "howdy", "yo", "greetings", "good morning", "good afternoon",
    "good evening", "good day", "morning", "evening", "hi there", "hello there", "hey there", "hi all",
    "hello all", "hi everyone", "hello everyone", "hey everyone", "hi guys", "hey guys", "hello guys",
    "hi folks", "hey folks", "hi team", "hello team", "dear sir", "dear madam", "dear sir or madam",
    "dear sir/madam", "dear team", "dear support", "dear support team", "dear all", "to whom it may concern",
    "hope you are well", "hope you're well", "hope you are doing well", "i hope you are well",
    "i hope this finds you well", "hope this finds you well", "hey so", "ok so", "okay so", "so", "um", "uh",
    "hmm", "ok", "okay", "oh",
)  # fmt: skip
_LEAD_INS = (
    "please", "pls", "plz", "kindly", "quick question", "a quick question", "just a quick question",
    "question", "one question", "simple question", "i have a question", "i have a quick question",
    "sorry to bother you", "sorry to bother", "sorry", "excuse me", "help", "help me", "help please",
    "need help", "i need help", "i need some help", "can you help me", "could you help me",
    "can you help", "could you help", "can you please help me", "could you please help me",
    "can anyone help", "can someone help", "can somebody help", "i was wondering", "just wondering",
    "i am wondering", "i wonder", "i would like to know", "i'd like to know", "i want to know",
    "i wanted to know", "i need to know", "i would like to ask", "i want to ask", "i wanted to ask",
    "i would like to ask you", "can i ask", "may i ask", "can you tell me", "could you tell me",
    "can you please tell me", "could you please tell me", "would you tell me", "please tell me",
    "tell me", "do you know", "does anyone know", "does anybody know", "anyone know", "anybody know",
    "do you happen to know", "any idea", "any ideas", "btw", "by the way", "fyi", "just curious",
    "out of curiosity", "real quick", "quickly",
)  # fmt: skip
_SIGN_OFFS = (
    "thanks", "thank you", "thanks a lot", "thanks so much", "thank you so much", "thank you very much",
    "thanks very much", "many thanks", "thanks in advance", "thank you in advance", "thanks again",
    "thx", "thnx", "thanx", "ty", "tia", "cheers", "regards", "best regards", "kind regards",
    "warm regards", "all the best", "best wishes", "sincerely", "yours sincerely",
    "yours faithfully", "yours truly", "much appreciated", "appreciate it", "i appreciate it",
    "i would appreciate it", "i'd appreciate it", "appreciate any help", "any help appreciated",
    "any help is appreciated", "any help would be appreciated", "any help would be great",
    "thanks for your help", "thank you for your help", "thanks for the help", "thanks for any help",
    "have a nice day", "have a good day", "have a great day", "take care", "please", "pls", "plz",
    "asap", "as soon as possible", "please advise", "please help", "help please",
    "if you know", "if you can", "if possible", "if you could", "if anyone knows",
    "any ideas", "any idea", "any thoughts", "any advice", "any tips", "any suggestions", "lol",
    "thank u", "thanks u", "tnx", "urgent", "quick question", "just wondering",
    # punctuation spoken to a dictation app, left in as words
    "question mark", "exclamation mark", "exclamation point",
)  # fmt: skip


def _alternation(phrases: tuple[str, ...]) -> str:
    words = sorted({p.replace("'", "'?") for p in phrases}, key=len, reverse=True)
    return "|".join(w.replace(" ", r"\s+").replace("/", r"\s*/\s*") for w in words)


_SEP = r"[\s,.!:;\-–—)(]*"
_EMOJI = r"(?:[:;]-?[)(dp]|[\U0001F300-\U0001FAFF☀-➿])"
_OPENING = re.compile(rf"^(?:{_EMOJI}|(?:{_alternation(_GREETINGS + _LEAD_INS)})\b){_SEP}", re.I)
_CLOSING = re.compile(
    rf"{_SEP}(?:{_EMOJI}|\b(?:{_alternation(_SIGN_OFFS)})(?:[\s,]+[A-Z][a-z]+)?)[\s.!?,)(:;]*$",
    re.I,
)
# A word, number or code ("3.5", "node.js", "C++", "-7": a minus before a digit is kept), or a symbol.
_TOKEN = re.compile(r"(?:(?<!\w)-(?=\d))?\w+(?:[.'+#&@/\-]\w+)*[+#%]*|[$€£%+#&=<>]")
_SENTENCE_END = re.compile(r"[.!?]$")
_CLAUSE_SPLIT = re.compile(r"(?<!\d),|,(?!\d)|;|\s[–—]\s")  # not "3,000"
# "So that ...": a purpose clause moved to the front, not a filler "so"
_PURPOSE = re.compile(r"so\s+that\b", re.I)
MAX_CLAUSES = 3  # clauses taken in every order up to here
MAX_ROTATED = 6  # then in every rotation: clauses moved from one end to the other


def clause_orders(clauses: list) -> Iterator[tuple]:
    """The orders in which `clauses` may have been typed for the same question: every one for two or three,
    every rotation for up to MAX_ROTATED (a clause moved from an end, keeping at most six keys), else as
    written."""
    if len(clauses) <= MAX_CLAUSES:
        return itertools.permutations(clauses)
    if len(clauses) <= MAX_ROTATED:
        return (tuple(clauses[i:] + clauses[:i]) for i in range(len(clauses)))
    return iter([tuple(clauses)])


@functools.lru_cache(maxsize=16384)
def strip_wrappers(text: str) -> str:
    """The question without greetings, lead-ins and sign-offs at its ends (at least two words are kept): any
    clause or run of function and phatic words (cache_service/phatic.py), then those of the lists above.
    Whole clauses go first, so a list's phrase never leaves the rest of its clause behind ("Many" of "Many
    thanks in advance!", "mate," of "Hey mate,")."""
    text = " ".join(text.split())
    for _ in range(6):
        before = text
        text = strip_phatic(text)
        for pattern in (_CLOSING,) if _PURPOSE.match(text) else (_OPENING, _CLOSING):
            found = pattern.search(text)
            if found is None:
                continue
            if pattern is _CLOSING:
                asked = closing_asked_about(text[: found.start()], found.group())
            else:
                asked = opening_asked_about(text[found.end() :])
            if asked:  # the greeting or sign-off is what the question is about
                continue
            shorter = (text[: found.start()] + text[found.end() :]).strip()
            # a sign-off may not be what its clause asks about, nor a greeting all that there is to ask
            if pattern is _CLOSING:
                says_nothing = completes(text[: found.start()])
            else:
                says_nothing = _function_words_only(shorter)
            if len(shorter.split()) >= 2 and shorter != text and not says_nothing:
                text = shorter
        if text == before:
            break
    return text


def _function_words_only(text: str) -> bool:
    """Nothing but function words: what a greeting led into asks nothing without it."""
    return all(w in FUNCTION for w in _TOKEN.findall(text.lower()))


def _wrapper_only(clause: str) -> bool:
    """A clause that is a greeting, lead-in or sign-off and nothing else ("hello", "good evening"), met
    between other clauses once they move."""
    if not clause.strip(" ,.!?;:"):
        return False
    emptied = (pattern.sub("", clause, count=1).strip(" ,.!?;:") for pattern in (_OPENING, _CLOSING))
    return any(not rest for rest in emptied) or wrapper_clause(clause)


def case_says_nothing(text: str) -> bool:
    """Typed in capitals or with every word capitalized: case tells no name from a word."""
    alpha = [w for w in _TOKEN.findall(text) if w[:1].isalpha()]
    return len(alpha) >= 3 and sum(w[:1].isupper() for w in alpha) > 0.6 * len(alpha)


def _words(clause: str, first_of_text: bool, correct: bool, caseless: bool) -> list[str]:
    """Lower-case words of a clause, spelling corrected where safe: lower-case words (and a capital at the
    clause's start), none at all in a text whose case says nothing (its names look like words)."""
    out = []
    for i, token in enumerate(_TOKEN.findall(clause)):
        lower = token.lower()
        sentence_start = i == 0 and first_of_text
        plain = not caseless and (
            token.islower() or (sentence_start and token[:1].isupper() and token[1:].islower())
        )
        out.append(spelling.correct(lower) if correct and plain and len(token) > 1 else lower)
    return out


def canonical_words(
    text: str, correct: bool = True, expand: bool = True, strip: bool = True
) -> list[list[str]]:
    """The question's clauses (split at commas and semicolons outside numbers), each as its canonical
    words (without spelling correction when `correct` is false, contractions as typed when `expand` is
    false, wrappers kept when `strip` is false); empty clauses dropped."""
    text = unicodedata.normalize("NFKC", text)
    text = strip_wrappers(text) if strip else text
    text = expand_contractions(text) if expand else text.replace("’", "'")
    caseless = case_says_nothing(text)
    parts = [p.strip() for p in _CLAUSE_SPLIT.split(text)]
    if strip and 2 <= sum(1 for p in parts if p) <= MAX_ROTATED:
        # a clause moved to an end brings its wrapper with it ("For a dog groomer, tell me how ..."), and
        # one that only names the answer's audience goes, as it does at the end of the question
        parts = [strip_wrappers(p) for p in parts]
        parts = [p for p in parts if not audience_only(p) and not _wrapper_only(p)] or parts
    clauses = []
    for n, part in enumerate(parts):
        ws = _words(part, first_of_text=n == 0 or not clauses, correct=correct, caseless=caseless)
        if ws:
            clauses.append(ws)
    return clauses


def canonical_keys(text: str, correct: bool = True) -> frozenset[str]:
    """Every key of `text`: its clauses in each order they may have been typed in (clause_orders); in a
    message of several sentences, also a clause moved inside one sentence and a sentence moved to either
    end (_sentence_keys)."""
    return _keys(text, True, correct)


@functools.lru_cache(maxsize=16384)
def _keys(
    text: str, expand: bool, correct: bool = False, strip: bool = True, sentences: bool = True
) -> frozenset[str]:
    orders = clause_orders(canonical_words(text, correct, expand, strip))
    keys = {" ".join(w for clause in order for w in clause) for order in orders}
    return frozenset(keys | _sentence_keys(text, expand, correct, strip)) if sentences else frozenset(keys)


_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+")
MAX_SENTENCE_KEYS = 12


def _sentence_keys(text: str, expand: bool, correct: bool, strip: bool) -> set[str]:
    """In a message of several sentences, a clause moved inside one of them ("... I'm not sure how to
    apply. Step by step, could you walk me through it?"): that sentence's clauses in every order, the other
    sentences as written (the whole message's clauses are split at commas across sentences, so these
    orders are not among its own); and each sentence moved to the front or to the end ("How much sleep does
    a 12-year-old need? My son is 12 and ...")."""
    text = unicodedata.normalize("NFKC", text)
    sentences = [s for s in _SENTENCE_BREAK.split(strip_wrappers(text) if strip else text) if s.strip()]
    if len(sentences) < 2:
        return set()
    clauses = [canonical_words(s, correct, expand, strip=False) for s in sentences]
    written = [" ".join(w for clause in own for w in clause) for own in clauses]
    out: set[str] = set()
    for i, own in enumerate(clauses):
        if not 2 <= len(own) <= MAX_CLAUSES:
            continue
        before, after = written[:i], written[i + 1 :]
        moved = (" ".join(w for clause in order for w in clause) for order in itertools.permutations(own))
        out |= {" ".join(part for part in (*before, m, *after) if part) for m in moved}
        if len(out) >= MAX_SENTENCE_KEYS:
            break
    if len(written) <= MAX_ROTATED:  # one sentence moved to the front or to the end: the question put first
        for k, moved in enumerate(written):
            rest = written[:k] + written[k + 1 :]
            out |= {" ".join(part for part in order if part) for order in ([moved, *rest], [*rest, moved])}
    return out


def canonical_text(text: str) -> str:
    """The key of `text` with its clauses in the order written (logs, tests)."""
    return " ".join(w for clause in canonical_words(text) for w in clause)


MAX_TYPO_EDITS = 2  # letter edits over the whole question


def _typo_of(x: str, y: str, budget: int, aligned: bool = False) -> int:
    """Edits between two differing words when one can be a mistyping of the other (cache_service/typos.py:
    "conection" / "connection", "tl" / "to", never "on" / "of" nor "tsp" / "tbsp"), else budget + 1."""
    edits = typo_edits(x, y, aligned)
    return edits if edits is not None and edits <= budget else budget + 1


def typo_pair(x: str, y: str) -> bool:
    """Whether one of two words can be a mistyping of the other (see _typo_of)."""
    return _typo_of(x, y, MAX_TYPO_EDITS) <= MAX_TYPO_EDITS


def _word_orders(text: str) -> set[tuple[str, ...]]:
    """The text's words in each clause order, with contractions expanded and as typed (a typo inside a
    contraction, "What'ss", leaves it unexpanded on one side only), wrappers removed and kept (a typo in a
    wrapper, "Hey quick qquestion", leaves it on one side only)."""
    out = set()
    for expand in (True, False):
        for strip in (True, False):
            for key in _keys(text, expand, False, strip, sentences=False):  # pairs of keys are compared
                out.add(tuple(key.split(" ")))
    return out


def near_typo(a: str, b: str) -> bool:
    """Whether `a` and `b` differ only by a few mistyped letters in plain words (at most MAX_TYPO_EDITS over
    the question, same words otherwise, in any of their clause orders). The semantic tier accepts such a
    candidate below its cosine threshold; the vetoes still apply. Never in a text typed in capitals or
    title case, where a name ("USPS") looks like a word ("ups")."""
    if case_says_nothing(a) or case_says_nothing(b):
        return False
    for wa in _word_orders(a):
        for wb in _word_orders(b):
            if len(wa) != len(wb) or wa == wb:
                continue
            budget = MAX_TYPO_EDITS
            for x, y in zip(wa, wb, strict=True):
                if x != y:
                    budget -= _typo_of(x, y, budget, aligned=True)
                    if budget < 0:
                        break
            if budget >= 0:
                return True
    return False
