"""Greetings, thanks and politeness at a question's ends, recognised by word class rather than by phrase.

cache_service/canonical.py removes the wrappers of its own list ("Hi there,", "Thanks in advance!"); people
write endless others ("Good afternoon folks!", "Appreciate any pointers :)", "Sorry to bother you again,").
What they share is that they carry no content word: every word is a function word (articles, pronouns,
auxiliaries, prepositions) or a phatic one (greeting, thanking, apologising, asking), and none says what the
question is about. So:

- a leading or trailing sentence or clause (split at . ! ? : ; , dashes and brackets) whose words are all
  function or phatic words, at least one of them a strong phatic word (PHATIC), is dropped; a trailing one
  may end with the writer's name ("Thanks, Sam", "Cheers Sam");
- without punctuation, a run of such words at the start is dropped up to its last asking or phatic word
  ("could you tell me | how ...", "I was wondering | if ..."), and a run at the end from its first strong
  phatic word on ("... my router | please");
- never a negator, a question word, a number or a comparison or direction word (KEEP): "..., or not?",
  "Why?" and "Before or after?" are part of the question; and the question keeps at least MIN_CORE_WORDS
  words, one of them a content word.

The word classes are general English (closed classes and the vocabulary of greeting, thanking and asking),
written without looking at any evaluation data.
"""

from __future__ import annotations

import re

from cache_service.pair_checks import NEGATORS

# Function words of English (a closed class): articles, pronouns, auxiliaries, modals, prepositions,
# conjunctions, common adverbs of degree and discourse.
FUNCTION = frozenset(
    """a an the this that these those some any each every all both my your his her its our their me you
    he she it we they them us him i myself yourself ourselves is am are was were be been being do does did
    doing done have has had having can could will would shall should may might must to of in on at by for
    from with about into onto as and or but so if then because while there here just also too very really
    quite still again already anyway though even only much many lot lots bit little such one something
    anything everything another""".split()
)
# Strong phatic words: greeting, thanking, apologising, pleading, hedging a question. One of them makes a
# clause of function words a wrapper.
PHATIC = frozenset(
    """hi hello hey heya hiya howdy hallo greetings dear yo thanks thank thanx thx ty tia cheers
    appreciate appreciated appreciation grateful gratitude regards sincerely respectfully faithfully
    please pls plz kindly sorry apologies apologise apologize pardon excuse bother bothering wondering
    wondered wonder curious curiosity question questions quick quickly help helping assistance advice
    advise anyone anybody someone somebody everyone everybody folks guys hope hoping ok okay um uh hmm
    erm oh btw fyi lol haha bye goodbye worries grateful ta alright thankyou thnx thnks tyvm obliged
    sup hola aloha ciao xo xoxo ttyl urgent urgently asap y'all yall reply replies heyo thanking awaiting
    lmk gracias merci danke grazie obrigado ugh""".split()
) | frozenset(
    # interjections of chat, and forms of address (a question is never about them)
    "ey ay lmao lmfao rofl smh meh oof yikes welp sir madam ma'am maam".split()
)
# Weak phatic words: at home in a greeting or a sign-off ("good morning", "have a nice day", "thanks so
# much for your time"), but alone they may be the question's point.
WEAK = frozenset(
    """good great nice best kind warm lovely wonderful awesome amazing advance time day morning afternoon
    evening night weekend friend friends mate buddy sir madam team all truly yours wishes well doing
    having know tell ask asking asked wanted want like need mind possible answer answers reply response
    info information input thoughts ideas idea tips pointers suggestions support explain show let see
    simple silly dumb stupid random real seriously honestly basically actually probably maybe perhaps
    again welcome reading taking forward looking hear makes make sense post posting sure place new here
    bunch heaps bless chance briefly short wondered meaning always confused stuck ever guidance insight
    insights feedback clarify clarification understand figure trying tried appreciative cordially warmly
    soon respond responding replies message note interested keen eager puzzled lost beginner newbie noob
    total complete forum community group thread people peeps dude bro fam gang legend lifesaver hero
    kindness patience advance knows terms nutshell short brief briefly layman layman's plain few words
    honest long first lurker posting poster chance attention earliest query queries genuine expert experts
    respected yeah tho writing write waiting revert greatly highly deeply blessed muchas needful enquire
    inquire enquiring inquiring doubt doubts needed serious wishes bruh thats wanna message finds""".split()
)
_QUESTION_WORDS = frozenset("what which who whom whose when where why how whether".split())
# Words a wrapper never contains: they change the question ("..., or not?", "Why?", "Before or after?").
KEEP = (
    NEGATORS
    | _QUESTION_WORDS
    | frozenset(
        """before after above below up down more less most least than versus vs over under upper lower higher
        left right top bottom early late earlier later""".split()
    )
)
_COORDINATORS = frozenset("and or but".split())
_COPULAS = frozenset("is are was were am".split())
_SUBJECTS = frozenset("it this that they these those he she".split())
_CONJUNCTIONS = frozenset("but so and anyway well ok okay".split())  # left at the front by a dropped clause
# Where a leading run without punctuation may end: an asking or phatic word, and what follows it ("tell
# me", "help us", "question but").
_ASKING = frozenset(
    """hi hello hey heya hiya howdy greetings yo please pls plz kindly sorry apologies pardon excuse
    wondering wondered wonder curious question questions know tell ask asking explain show wanted hmm um
    uh erm oh btw fyi quick quickly curiosity bother bothering help hope hoping apologise apologize
    enquire inquire enquiring inquiring heyo hola hallo aloha sup ey ay""".split()
)
# Where a trailing run without punctuation may begin: thanking, pleading, laughing ("... please", "...
# thanks in advance"), never a word that can be the question's own ("okay", "help", "quick").
_CLOSING = frozenset(
    """thanks thank thanx thx ty tia cheers please pls plz kindly appreciate appreciated regards lol
    haha asap urgent urgently thankyou thnx thnks tyvm anyone anybody someone somebody guys folks
    everyone btw fyi bye hmm sincerely respectfully grateful obliged worries sorry apologies hope hoping
    wondering curious xo xoxo ttyl ciao ta excuse pardon gratitude appreciation chance something anything
    whatever lmk bro dude mate sir madam tho bruh wishes ugh lmao lmfao rofl smh meh oof yikes ma'am
    maam""".split()
)
_MANNER = frozenset("terms nutshell short brief layman layman's simple plain few words".split())
# Whom the answer is for, when it changes only its wording ("... for a beginner"): after "for" at the end.
_AUDIENCE = frozenset("beginner beginners newbie newbies noob noobs dummies layman laymen".split())
# "... so much", "... or something", "... by any chance", "... kind regards", "... I would appreciate it"
_BEFORE_CLOSING = frozenset(
    "any some so very really much many a an the or by kind best warm warmest would i i'd we just".split()
)
# Discourse markers: a leading clause of nothing else says nothing ("So basically, ...", "Well, actually,")
_DISCOURSE = frozenset(
    "so well ok okay basically honestly seriously actually anyway anyways alright um uh".split()
)
# Asked for after "any" only ("... any ideas?"): alone they can be the question ("What should I advise?").
_ASKED_FOR = frozenset("ideas idea thoughts tips suggestions advice help pointers input".split())
# After an asking or greeting word: whom it addresses ("help me", "hi bro") or what ("quick one").
_OBJECTS = frozenset(
    """me us you all everyone everybody folks guys team there friends people yall y'all one bro dude mate
    buddy fam sir madam""".split()
)
# The time of day in a greeting ("morning all", "good evening folks"): a leading run of function and phatic
# words with one of them ends where the question starts with a capital letter ("morning all Who pays ...").
_TIME_OF_DAY = frozenset("morning afternoon evening day night".split())
# Closers that are indefinite pronouns ("... or something", "can someone"): right after a content word they
# are its object ("invite someone", "return something") and stay; "anyone" at the end is an address.
_PRONOUN_CLOSING = frozenset("someone somebody something anything whatever".split())
# After a preposition any of them is an object ("declined for everyone", "talk to anyone").
_ADDRESSED = frozenset("anyone anybody everyone everybody".split())
_PREPOSITIONS = frozenset("for to with from about by of on at in into onto".split())
# Whose question an asking word opens: the writer's or the reader's ("I wanted to ask", "can you tell me"),
# never a third party's ("they wanted me to move my money", "he asked me to sign").
_THIRD_PERSON = frozenset("he she they it his her their its him them".split())
# "If ..." at the end is a condition on answering ("... if possible", "... if you know") only with these
# after it; "... if he is genuine" is the question's.
_ANSWER_CONDITION = frozenset("possible poss you u anyone anybody someone somebody so not any".split())
# "ok" after a copula is what is asked ("is it okay", "is 5 hours OK"), not a filler.
_PREDICATE = frozenset("ok okay alright fine sorry".split())
_COPULA = frozenset("is it be are was were am seem seems it's that's look looks feel feels".split())
# "..., okay?" as a tag at the very end of a question that does not itself ask yes or no ("What's the top
# speed okay?"); after an auxiliary opening ("Is my posture okay?") it is what is asked.
_TAG = frozenset("ok okay alright".split())
_YES_NO = frozenset("is are was were am do does did can could will would should shall may might must".split())
MIN_CORE_WORDS = 3
_ELONGATED = re.compile(r"(.)\1{2,}")  # "heyyy", "pleeease", "sooo"

_QUOTE = re.compile(r"['\"‘’“”]\B|\B['\"‘’“”]")  # a quotation mark (not an apostrophe inside a word)
_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)*|\d+(?:[.,]\d+)*")
# Sentence and clause ends (a point or comma inside a number is none), dashes between spaces, brackets.
_SENTENCE_END = re.compile(r"[.!?:\n]")  # a clause standing alone as a sentence ("Hi, | newbie here. | ...")
_LEAD_IN_END = re.compile(r"[!:]")  # "Evening all! ...", "Asking for a friend: ..."
_BOUNDARY = re.compile(r"[!?;:\n()]+|(?<!\d)[.,]|[.,](?!\d)|\s[-–—]+\s|\.\.\.")


def _normal(word: str) -> str:
    """The word in lower case; one typed with a letter held ("heyyy") as the listed word it stretches."""
    w = word.lower().replace("’", "'")
    if w not in PHATIC and w not in FUNCTION and w not in WEAK and _ELONGATED.search(w):
        for short in (_ELONGATED.sub(r"\1", w), _ELONGATED.sub(r"\1\1", w)):
            if short in PHATIC or short in FUNCTION or short in WEAK:
                return short
    return w


def _word_class(word: str) -> str:
    w = _normal(word)
    if w in NEGATORS or w.endswith("n't"):
        return "negator"
    if w in KEEP or w[:1].isdigit() or w.partition("'")[0] in KEEP:  # "what's", "how'd" ask too
        return "keep"
    if w in PHATIC:
        return "strong"
    if w in FUNCTION or w in WEAK or w.endswith(("'s", "'m", "'re", "'ve", "'d", "'ll")):
        return "weak"
    return "content"


def _in_context(words: list[str], classes: list[str]) -> list[str]:
    """Word classes corrected by the word before: "ok" after a copula is the question's predicate."""
    return [
        "content" if i > 0 and w.lower() in _PREDICATE and words[i - 1].lower() in _COPULA else c
        for i, (w, c) in enumerate(zip(words, classes, strict=True))
    ]


def _droppable(words: list[str], trailing: bool, quoted: bool = False, next_to_wrapper: bool = False) -> bool:
    """A clause of function and phatic words with a strong phatic word, or with none when it is a sentence
    of its own next to a clause already dropped as a wrapper ("Hi, | newbie here.", "? Let me know, |
    thanks!") or a leading exclamation or lead-in ("Evening all! ...", "Asking for a friend: ..."). A name
    after its first word is the writer's or the reader's ("Hi John", "Thanks, Sam"); a negator is part of a
    phatic phrase ("no worries if not", "sorry if this isn't clear") when strong phatic words are at least as
    many."""
    if not words:
        return True
    if quoted:
        return False  # a quotation is what is asked about ("... end an email with 'Best regards'?")
    classes = _in_context(
        words,
        [
            "weak" if i > 0 and w[:1].isupper() and _word_class(w) == "content" else _word_class(w)
            for i, w in enumerate(words)
        ],
    )
    strong, negators = classes.count("strong"), classes.count("negator")
    negation_ok = negators <= strong or negators % 2 == 0  # "no worries if not": two cancel out
    if next_to_wrapper and not negators:  # a name here is the question's ("Hi! | In Monopoly, ...")
        return all(_word_class(w) in ("strong", "weak") for w in words)
    return strong > 0 and negation_ok and all(c in ("strong", "weak", "negator") for c in classes)


def completes(before: str) -> bool:
    """A word right after an unfinished question, an auxiliary opening a clause of function words alone ("Is
    it | urgent?", "..., is it | asap", "... and is there | anything we should do?"), is its complement,
    not a sign-off: without it nothing is asked. A question word makes the clause a question already ("how
    much is it | asap"), and a clause that asks nothing leaves the sign-off one ("... and on | Have a great
    day!")."""
    words = [w.lower() for w in _WORD.findall(_BOUNDARY.split(before)[-1])]
    joined = [i for i, w in enumerate(words) if w in _COORDINATORS]
    clause = words[joined[-1] + 1 :] if joined else words
    return bool(clause) and clause[0] in _YES_NO and all(w in FUNCTION for w in clause)


def _copula_question(words: list[str]) -> bool:
    """ "is it urgent", "are they ok": a copula and its subject ask about the word after them."""
    lowered = [w.lower() for w in words]
    return len(lowered) >= 3 and lowered[0] in _COPULAS and lowered[1] in _SUBJECTS


def _asks_of_a_statement(words: list[str], before: str) -> bool:
    """A trailing "is it urgent?" after a statement ("my boiler is broken, | is it urgent?") is the question
    itself. After a question it is only a tag on it ("Can I bring my dog, | is that ok?")."""
    if not _copula_question(words):
        return False
    head = [w.lower() for w in _WORD.findall(before)]
    asked = "?" in before or bool(head) and (head[0] in _YES_NO or head[0] in _QUESTION_WORDS)
    return not asked


def _is_signature(words: list[str]) -> bool:
    return 1 <= len(words) <= 2 and all(w[:1].isupper() and w[1:].islower() for w in words)


def _core_ok(text: str) -> bool:
    words = _WORD.findall(text)
    return len(words) >= MIN_CORE_WORDS and any(_word_class(w) in ("content", "keep") for w in words)


def _segments(text: str) -> list[tuple[int, int]]:
    """(start, end) of the text's clauses, boundaries excluded."""
    out, start = [], 0
    for m in _BOUNDARY.finditer(text):
        out.append((start, m.start()))
        start = m.end()
    out.append((start, len(text)))
    return out


def _strip_clauses(text: str) -> str:
    first_end = _SENTENCE_END.search(text)
    if first_end:  # a first sentence of wrapper words alone ("Long time lurker, first time poster.")
        head, rest = text[: first_end.start()], text[first_end.end() :]
        words = _WORD.findall(head)
        plain = len(words) >= 2 and not _QUOTE.search(head)
        if plain and all(_word_class(w) in ("strong", "weak") for w in words) and _core_ok(rest):
            text = rest.strip()
    segments = _segments(text)
    lo, hi = 0, len(segments)
    after_wrapper = False  # a clause with words was dropped at this end: its neighbour needs no strong word
    while lo < hi - 1:
        s, e = segments[lo]
        rest = text[segments[lo + 1][0] :]
        quoted = bool(_QUOTE.search(text[s:e]))
        words = _WORD.findall(text[s:e])
        boundary = text[e : segments[lo + 1][0]]
        alone = bool(_LEAD_IN_END.search(boundary)) or after_wrapper and bool(_SENTENCE_END.search(boundary))
        alone = alone or bool(words) and all(w.lower() in _DISCOURSE for w in words)
        # a whole sentence before the question ("First time poster here.", "Long time lurker.")
        alone = alone or len(words) >= 2 and bool(_SENTENCE_END.search(boundary))
        if not _droppable(words, False, quoted, alone) or not _core_ok(rest):
            break
        after_wrapper = after_wrapper or bool(words)
        lo += 1
    after_wrapper = False
    while hi - 1 > lo:
        s, e = segments[hi - 1]
        words = _WORD.findall(text[s:e])
        drop = 1
        between = text[segments[hi - 2][1] : s]
        # a sentence after the question's own mark that says nothing ("...? Have a great day!", "...? Best,")
        after_question = "?" in between and (len(words) > 1 or [_normal(w) for w in words] == ["best"])
        alone = after_question or after_wrapper and bool(_SENTENCE_END.search(between))
        alone = alone or bool(words) and all(w.lower() in _DISCOURSE for w in words)  # "..., honestly?"
        if _asks_of_a_statement(words, text[segments[lo][0] : s]):
            break
        if _is_signature(words) and hi - 2 > lo:
            before = _WORD.findall(text[segments[hi - 2][0] : segments[hi - 2][1]])
            if before and _droppable(before, True, bool(_QUOTE.search(text[segments[hi - 2][0] : s]))):
                drop = 2
        elif not _droppable(words, True, bool(_QUOTE.search(text[s:e])), alone):
            break
        core = text[segments[lo][0] : segments[hi - 1 - drop][1]] if hi - drop > lo else ""
        if not _core_ok(core):
            break
        after_wrapper = after_wrapper or bool(words)
        hi -= drop
    if lo == 0 and hi == len(segments):
        return text
    core = text[segments[lo][0] : segments[hi - 1][1]].strip()
    if lo > 0:
        first, _, rest = core.partition(" ")
        if first.lower() in _CONJUNCTIONS and _core_ok(rest):
            core = rest
    return core


def _run_classes(matches: list[re.Match[str]]) -> list[str]:
    """Word classes in a run; a function word in capitals inside the text is a name ("in the US", "IT"),
    one with a capital first letter starts an unpunctuated sentence ("... flashing Would appreciate any
    help")."""
    classes = [
        "content"
        if i > 0 and m.group() != "I" and m.group().isupper() and m.group().lower() in FUNCTION
        else _word_class(m.group())
        for i, m in enumerate(matches)
    ]
    return _in_context([m.group() for m in matches], classes)


def _writer_knows(matches: list[re.Match[str]], i: int) -> bool:
    """The leading run so far is "if I (we) ... know": a condition on the writer's side, which the question
    depends on, unlike the reader's knowing ("If anyone knows, ...", "If you know, ...")."""
    if matches[i].group().lower() != "know" or matches[0].group().lower() != "if":
        return False
    return any(m.group().lower() in ("i", "we") for m in matches[1:i])


def _strip_runs(text: str) -> str:
    """Leading and trailing runs of function and phatic words without punctuation around them."""
    matches = list(_WORD.finditer(text))
    classes = _run_classes(matches)
    cut = -1  # the last word of the leading run to drop
    greeted = False  # the run so far has a greeting, thanks or a time of day in it
    purpose = bool(matches) and matches[0].group().lower() == "to"  # "To know the rules, ...": content
    for i, (m, c) in enumerate(zip(matches, classes, strict=True)):
        if purpose:
            break
        if greeted and c in ("strong", "weak", "keep") and m.group()[:1].isupper() and m.group() != "I":
            cut = i - 1  # an unpunctuated sentence starts here: "hey there What's ...", "morning all Who ..."
            break
        greeted = greeted or c == "strong" or _normal(m.group()) in _TIME_OF_DAY
        following = matches[i + 1].group() if i + 1 < len(matches) else ""
        addressee = (  # a name right after a greeting, the question going on in lower case
            0 <= cut == i - 1
            and _normal(matches[cut].group()) in PHATIC
            and m.group().lower() not in FUNCTION
            and m.group()[:1].isupper()
            and c not in ("keep", "negator")
            and (not following or following[:1].islower())
        )
        if c not in ("strong", "weak") and not addressee:  # "Hi Sarah how do I ..."
            break
        if addressee:
            cut = i
            continue
        ask_next = i + 1 < len(matches) and _word_class(matches[i + 1].group()) == "keep"
        if m.group().lower() in _THIRD_PERSON:
            break  # someone else's asking is the question's ("they wanted me to ...")
        if _writer_knows(matches, i):
            break  # "If I know their name, should I ...": the writer's condition, not asking the reader
        if _normal(m.group()) in _ASKING or m.group().lower() == "but" and (cut >= 0 or ask_next):
            cut = i  # "sorry if ... but", "might be a silly one but what ..."
        elif cut == i - 1 and _normal(m.group()) in _OBJECTS | _CONJUNCTIONS and cut >= 0:
            cut = i
    if (
        cut >= 0
        and _core_ok(text[matches[cut].end() :])
        and not _QUOTE.search(text[: matches[cut].end() + 1])
        and not opening_asked_about(text[matches[cut].end() :])
    ):
        text = text[matches[cut].end() :].lstrip(" ,:;-")
        matches = list(_WORD.finditer(text))
        classes = _run_classes(matches)
    start = None  # the first word of the trailing run to drop
    run_start = None  # the first word of the trailing run of function and phatic words
    for i in range(len(matches) - 1, -1, -1):
        if classes[i] not in ("strong", "weak"):
            break
        run_start = i
        word = _normal(matches[i].group())
        # a capitalized word ("Any"), not one in capitals ("OK", "I")
        sentence = i > 0 and matches[i].group()[:1].isupper() and matches[i].group()[1:].islower()
        if (
            sentence
            and matches[i - 1].group()[:1].islower()
            and "strong" in classes[i:]
            and not _copula_question([m.group() for m in matches[i:]])  # "... broken Is it urgent"
        ):
            start = i  # an unpunctuated sentence of its own: "... my throat Any help would be appreciated"
        elif (
            word in _PRONOUN_CLOSING | _ADDRESSED
            and i > 0
            and (
                matches[i - 1].group().lower() in _PREPOSITIONS
                or word in _PRONOUN_CLOSING
                and classes[i - 1] == "content"
            )
        ):
            continue
        elif word in _TAG and classes[i] != "content" and i == len(matches) - 1:
            clause = _BOUNDARY.split(text[: matches[i].start()])[-1].split()  # the tag's own clause
            if clause and clause[0].lower() not in _YES_NO:
                start = i
        elif word in _CLOSING or (word in _ASKED_FOR and i > 0 and matches[i - 1].group().lower() == "any"):
            if not completes(text[: matches[i].start()]):
                start = i
    while start is not None and start > 0 and matches[start - 1].group().lower() in _BEFORE_CLOSING:
        start -= 1
    if (
        start is not None
        and start > 0
        and closing_asked_about(text[: matches[start].start()], text[matches[start].start() :])
    ):
        start = None
    run = [m.group().lower() for m in matches[run_start:]] if run_start is not None else []
    for i, word in enumerate(run):
        # a condition on answering ("... if possible", "... if you know") or the manner of the answer ("...
        # in simple terms"), of function and phatic words only
        manner = word == "in" and any(w in _MANNER for w in run[i + 1 :])
        audience = word == "for" and any(w in _AUDIENCE for w in run[i + 1 :])
        condition = word == "if" and i + 1 < len(run) and run[i + 1] in _ANSWER_CONDITION
        if condition or manner or audience:
            start = run_start + i if start is None else min(start, run_start + i)
            break
    quoted = start is not None and _QUOTE.search(text[max(matches[start].start() - 1, 0) :])
    if start is not None and not quoted and _core_ok(text[: matches[start].start()]):
        tail = text[matches[-1].end() :]
        text = text[: matches[start].start()].rstrip(" ,:;-") + tail.strip(" ,:;-")
    return text


# The words of a letter's closing ("Kind regards", "Yours faithfully", "Cheers"): what a question about how to
# close a letter names, unlike thanks or wishes to the reader ("thanks so much", "have a great day").
_VALEDICTIONS = frozenset(
    "regards wishes sincerely faithfully truly cordially respectfully cheers best yours".split()
)
# Verbs of saying, writing or singing: after them, "... reply to thanks", "... end a text with xoxo", "is it
# polite to say sorry first", "who sang Hello" name the words the question is about.
_SPEAKING = frozenset(
    """say saying said reply replying respond responding answer answering write writing end ending sign
    signing close closing open opening start starting begin greet greeting translate spell pronounce call
    calling address sing sang sung""".split()
)
_MEANING = frozenset("mean means meaning".split())
_DETERMINERS = frozenset("a an the my your our their his her".split())  # not "this": "help with this thanks"
_PLEADING = frozenset("please pls plz kindly".split())
_PERSONS = frozenset("me you him her us them".split())  # "should i call him sir"


# Words that join a greeting or thanks to the rest as its subject: "Hello in Japanese?", "please vs kindly
# in emails", "thanks meaning in slang" ask about the words ("Thanks in advance, ..." does not).
_JOINING = frozenset("in vs versus or and meaning means mean translation translated".split())


def opening_asked_about(after: str) -> bool:
    """The greeting or thanks just before `after` is what the question asks about (see _JOINING): joined to
    a clause that asks nothing itself ("Hi in excel how do i sum a column" greets)."""
    clause = _WORD.findall(_BOUNDARY.split(after, maxsplit=1)[0])
    words = [w.lower() for w in clause[:2]]
    if not words or words[0] not in _JOINING or words == ["in", "advance"]:
        return False
    return all(_word_class(w) != "keep" for w in clause[1:])


def closing_asked_about(before: str, closing: str) -> bool:
    """Words of a sign-off that are what the question asks about, not the writer's own: after a verb of
    saying or writing ("is it polite to say sorry first", "should i call him sir", "how do i reply to
    thanks"), after a preposition a letter's closing or any when such a verb came before ("... end an email
    with Kind regards?", "... end a text to my mum with xoxo"), after a determiner ("reply to a thank you
    email"), or what they mean ("what does cheers mean"). Thanks after a stranded preposition otherwise go
    ("... cooked to thanks so much"), and a pleading word always does ("What is Python for please?")."""
    words = [w.lower() for w in _WORD.findall(before)]
    said = [_normal(w) for w in _WORD.findall(closing)]
    if not words or not said or said[0] in _PLEADING:
        return False
    spoken = words[-1] in _SPEAKING or len(words) > 1 and words[-2] in _SPEAKING and words[-1] in _PERSONS
    if spoken or _MEANING.intersection(said) or words[-1] in _DETERMINERS:
        return True
    return words[-1] in _PREPOSITIONS and bool(
        _VALEDICTIONS.intersection(said) or _SPEAKING.intersection(words)
    )


def wrapper_clause(clause: str) -> bool:
    """A clause of wrapper words alone, with a strong phatic word ("hello", "thanks so much"), and not a
    question of its own ("is it urgent": met here once a tag on a question has already gone)."""
    words = _WORD.findall(clause)
    return (
        bool(words) and not _QUOTE.search(clause) and _droppable(words, False) and not _copula_question(words)
    )


def audience_only(clause: str) -> bool:
    """A clause that only says whom the answer is for ("For a beginner", "for total newbies"): the
    trailing run's rule above, for a clause moved to the front."""
    words = [w.lower() for w in _WORD.findall(clause)]
    return (
        len(words) >= 2
        and words[0] == "for"
        and any(w in _AUDIENCE for w in words)
        and all(w in _AUDIENCE or w in FUNCTION or w in WEAK for w in words)
    )


def strip_phatic(text: str) -> str:
    """`text` without greetings, thanks and politeness at its ends (see the module's docstring)."""
    for _ in range(4):
        before = text
        text = _strip_runs(_strip_clauses(text))
        if text == before:
            break
    return text
