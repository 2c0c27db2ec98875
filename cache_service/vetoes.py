"""General vetoes on a candidate hit: differences that change the answer in any text, whatever the
embedding says.

A sentence model puts "turn on 2FA" beside "turn off 2FA" and "capital of Austria" beside "capital of
Australia". These checks read closed classes of English and the shape of names, not words picked from any
evaluation set:

- numbers, units' values, arithmetic relations and negation on one side only (cache_service/pair_checks.py);
- calendar words (months, weekdays, seasons, "today"/"tomorrow") that differ;
- names, brands, places and codes: a capitalized word inside a sentence, a word with a capital inside it
  ("iPhone", "macOS") or a word with letters and digits ("PS5", "E24") on one side that the other side does
  not have (a greeting's or sign-off's name is removed first);
- comparison and direction words: one side says "more" where the other says "less", "upload" where the
  other says "download", "before" where the other says "after" (OPPOSITES);
- the same names or numbers in another order around a direction word ("Paris to London" / "London to
  Paris", "5 km to miles" / "5 miles to km"), or in a question of the same words ("a 65W charger for a
  90W laptop" / "a 90W charger for a 65W laptop");
- a detail changed in an otherwise identical question: sharing most content words, one side adds, drops
  or swaps one ("change a flat tire" / "... on a bicycle"): traps are minimal edits, rewordings are not.

They run on both tiers (canonical and semantic) and cost a few regular expressions per candidate.
"""

from __future__ import annotations

import re

from cache_service.canonical import (
    canonical_keys,
    case_says_nothing,
    clause_orders,
    near_typo,
    strip_wrappers,
)
from cache_service.pair_checks import (
    NEGATORS,
    NUMBER_WORDS,
    ORDINAL_WORDS,
    dates,
    expand_contractions,
    numbers,
    on_mistyped,
    read_aloud_equal,
    with_next,
    words,
)
from cache_service.pair_checks import veto as number_negation_veto
from cache_service.respelling import NOT_NAMES, respelled, singular_name
from cache_service.respelling import plain as _plain
from cache_service.respelling import tokens as _tokens

_OPPOSITE_PAIRS = (
    "more less", "more fewer", "most least", "higher lower", "highest lowest", "bigger smaller",
    "larger smaller", "biggest smallest", "largest smallest", "longer shorter", "longest shortest",
    "faster slower", "fastest slowest", "cheaper pricier", "better worse", "best worst", "before after",
    "earlier later", "early late", "above below", "over under", "up down", "upload download",
    "uploading downloading", "increase decrease", "increase reduce", "raise lower", "import export",
    "buy sell", "buying selling", "enable disable", "enabled disabled", "on off", "open close",
    "min max", "minimum maximum", "first last", "add remove", "install uninstall", "encrypt decrypt",
    "compress decompress", "send receive", "sending receiving", "lend borrow", "push pull", "win lose",
    "gain lose", "hot cold", "warm cool", "heat cool", "north south", "east west", "left right",
    "inside outside", "indoor outdoor", "indoors outdoors", "top bottom", "front back", "forward backward",
    "plus minus", "add subtract", "multiply divide", "start stop", "begin end", "start end", "arrive leave",
    "read write", "reading writing", "keep remove", "keep delete",
    "arrival departure", "inbound outbound", "incoming outgoing", "input output", "import export",
    "deposit withdraw", "credit debit", "income expense", "profit loss", "rise fall", "wet dry",
    "light heavy", "light dark", "old new", "older newer", "oldest newest", "young old", "younger older",
    "easy hard", "easier harder", "easiest hardest", "safe dangerous", "legal illegal", "male female",
    "men women", "boy girl", "day night", "morning evening", "summer winter", "spring autumn",
    "weekday weekend", "public private", "positive negative", "odd even", "true false",
    "allow block", "accept decline", "accept reject", "join leave", "hire fire", "pros cons",
    "advantages disadvantages", "benefits risks", "lock unlock", "mute unmute", "follow unfollow",
    "subscribe unsubscribe", "connect disconnect", "mount unmount", "zip unzip", "pack unpack",
    "freeze thaw", "maximize minimize", "expand collapse", "show hide", "visible hidden",
    "online offline", "inhale exhale", "import export", "ascending descending", "asc desc",
    "upper lower", "uppercase lowercase", "horizontal vertical", "vertically horizontally",
    "horizontally vertically", "rows columns", "row column",
    "good bad", "asleep awake", "sleep wake", "include exclude", "including excluding", "same different",
    "similar different", "similarities differences", "love hate", "like dislike", "remember forget",
    "pass fail", "cheap expensive", "strong weak", "fast slow", "rich poor", "full empty", "thick thin",
    "wide narrow", "deep shallow", "loud quiet", "tight loose", "high low", "big small", "long short",
    "past future", "alive dead", "enter exit", "entrance exit", "teach learn",
    "attack defend", "natural artificial", "natural synthetic", "manual automatic", "always never",
    "inside outdoors", "inside outdoor", "indoors outside", "indoor outside",
)  # fmt: skip
OPPOSITES: dict[str, set[str]] = {}
for _pair in _OPPOSITE_PAIRS:
    _x, _y = _pair.split()
    OPPOSITES.setdefault(_x, set()).add(_y)
    OPPOSITES.setdefault(_y, set()).add(_x)
DIRECTION_WORDS = frozenset("to from into in than vs versus per over against".split())


_ORDINAL = re.compile(r"\d+(?:st|nd|rd|th)", re.I)


def _is_name(word: str, sentence_start: bool) -> bool:
    if _ORDINAL.fullmatch(word):
        return False  # "15th", "1st": a number, which the numbers veto reads ("15th March" / "15 March")
    if any(c.isdigit() for c in word) and any(c.isalpha() for c in word):
        return True  # a code or model: "PS5", "E24", "iOS17"
    if word[1:] != word[1:].lower() and any(c.isupper() for c in word[1:]):
        return True  # "iPhone", "macOS", "USB", "NASA"
    return word[:1].isupper() and not sentence_start and word != "I" and not word.startswith("I'")


def names(text: str) -> set[str]:
    """The names, brands, places and codes of a question (lower case, possessive 's removed). In a text
    typed in capitals or with every word capitalized, case says nothing: only codes ("PS5") count."""
    tokens = _tokens(text)
    if case_says_nothing(text):
        return {_plain(w) for w, _ in tokens if any(c.isdigit() for c in w) and any(c.isalpha() for c in w)}
    return {_plain(w) for w, start in tokens if _is_name(w, start)}


def _first_word(text: str) -> str:
    tokens = _tokens(text)
    return _plain(tokens[0][0]) if tokens else ""


def _unmatched_names(text: str, found: set[str], other_words: set[str], other: str) -> set[str]:
    """The names of `text` that the other side does not have, in any spelling (`respelled`). A text's
    first word with a stray capital ("HHow", "hWat") is a mistyped first word when the other's first word
    is that word; a lower-case compound with a number ("2-iinch", "4-yeear-old") is a mistyped one when the
    other side has it."""
    from cache_service.canonical import typo_pair

    out = found - other_words - NOT_NAMES - respelled(text, other)
    singulars = {singular_name(w) for w in other_words}
    out = {n for n in out if singular_name(n) not in singulars}
    first = _first_word(text)
    if first in out and typo_pair(first, _first_word(other)):
        out.discard(first)
    for name in [n for n in out if "-" in n and n in text and any(c.isdigit() for c in n)]:
        if any(typo_pair(name, w) for w in other_words):
            out.discard(name)

    def retyped(name: str, word: str) -> bool:
        return _retyped_code(name, word) and not (_in_capitals(name, text) and _in_capitals(word, other))

    return {n for n in out if not any(retyped(n, w) for w in other_words)}


def _in_capitals(word: str, text: str) -> bool:
    """`word` is typed in capitals in `text`: an acronym, whose letters in another order make another one
    ("ADC" / "DAC"), not a mistyping."""
    return any(_plain(t) == word and t.isalpha() and t.isupper() for t, _ in _tokens(text))


def _retyped_code(x: str, y: str) -> bool:
    """A code or name typed with two letters swapped or one doubled ("25ht" / "25th", "3dd" / "3d",
    "node.jss" / "node.js"): never another letter or digit, which makes another code ("10kg" / "10km")."""
    if len(x) < 2 or abs(len(x) - len(y)) > 1 or x == y:
        return False
    if len(x) == len(y):
        diffs = [i for i in range(len(x)) if x[i] != y[i]]
        return (
            len(diffs) == 2
            and diffs[1] == diffs[0] + 1
            and x[diffs[0]] == y[diffs[1]]
            and x[diffs[1]] == y[diffs[0]]
        )
    longer, shorter = (x, y) if len(x) > len(y) else (y, x)
    for i in range(1, len(longer)):
        if longer[i] == longer[i - 1] and longer[:i] + longer[i + 1 :] == shorter:
            return True
    return False


_CLAUSE = re.compile(r"(?<!\d),|,(?!\d)|;")
_SENTENCE = re.compile(r"[.?!]+(?=\s|$)")


def _anchor_orders(text: str, anchors: set[str], sentences: bool = False) -> set[tuple[str, ...]]:
    """The order the anchors come in, for every order of the text's clauses (of its sentences, with
    `sentences`): a clause moved around a comma keeps its meaning; a word moved inside a clause may not."""
    parts = (_SENTENCE if sentences else _CLAUSE).split(text)
    clauses = [[w for w in (_plain(t) for t, _ in _tokens(c)) if w in anchors] for c in parts]
    orders = clause_orders(clauses)
    return {tuple(dict.fromkeys(w for clause in order for w in clause)) for order in orders}


_INFLECTIONS = (("ied", "y"), ("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", ""), ("d", ""))


def _base(word: str) -> str:
    """A verb or noun without its inflection, roughly ("increased" = "increase", "uploads" = "upload")."""
    for suffix, back in _INFLECTIONS:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            stem = word[: -len(suffix)] + back
            if stem in OPPOSITES:
                return stem
            if stem + "e" in OPPOSITES:
                return stem + "e"
    return word


def _same_content_words(a: str, b: str) -> bool:
    """The same content words, as a multiset: names or numbers in another order are then swapped ("a 65W
    charger if it came with a 90W one" / the other way round), with or without a direction word."""
    ca = sorted(_plain(w) for w, _ in _tokens(a) if w.lower() not in FUNCTION_WORDS)
    return ca == sorted(_plain(w) for w, _ in _tokens(b) if w.lower() not in FUNCTION_WORDS)


def _to_mistyped(a: str, b: str) -> bool:
    """ "too" where the other side has "to" in the same place ("wait too swim"), or mistyped itself ("ttoo
    much"): a typo, not an excess."""
    from cache_service.canonical import canonical_words, typo_pair

    wa = [w for clause in canonical_words(a, correct=False) for w in clause]
    wb = [w for clause in canonical_words(b, correct=False) for w in clause]
    pairs = zip(wa, wb, strict=True) if len(wa) == len(wb) else iter(())
    if any({x, y} == {"to", "too"} for x, y in pairs):
        return True
    one, other = (wa, wb) if "too" in wa else (wb, wa)
    return any(typo_pair("too", w) for w in other if w not in one)


def direction_veto(a: str, b: str) -> str:
    """Opposite comparison or direction words, or the same names/numbers in another order around a
    direction word."""
    wa, wb = {_plain(w) for w, _ in _tokens(a)}, {_plain(w) for w, _ in _tokens(b)}
    sa, sb = {_base(w) for w in wa}, {_base(w) for w in wb}
    for w in wa - wb:
        if OPPOSITES.get(w, set()) & wb or OPPOSITES.get(_base(w), set()) & (sb - sa):
            return f"opposite words ({w})"
    if ("too" in wa) != ("too" in wb) and not _to_mistyped(a, b):
        return "excess on one side"  # "how much water ..." / "how much water is too much ..."
    if (wa | wb) & DIRECTION_WORDS or _same_content_words(a, b):
        anchors = (names(a) & names(b)) | {w for w in wa & wb if w[:1].isdigit()}
        if len(anchors) >= 2 and not _anchor_orders(a, anchors) & _anchor_orders(b, anchors):
            if not _clause_moved(a, b):
                return "direction differs"
    if (wa | wb) & DIRECTION_WORDS and _same_words(a, b):
        # the same words rearranged around "than", "to", "from" inside a sentence: "my choice rather than my
        # employer's requirement" / "my employer's requirement rather than my choice" (sentences and
        # clauses may move)
        anchors = {w for w in wa & wb if w not in FUNCTION_WORDS}
        moved = any(_anchor_orders(a, anchors, by) & _anchor_orders(b, anchors, by) for by in (False, True))
        if len(anchors) >= 2 and not moved and not _clause_moved(a, b):
            return "direction differs"
    return ""


def _clause_moved(a: str, b: str) -> bool:
    """The same words in the same clauses, a clause moved (canonical keys in common): no word changed place
    inside its clause."""
    return bool(canonical_keys(a, correct=False) & canonical_keys(b, correct=False))


def _same_words(a: str, b: str) -> bool:
    return sorted(_plain(w) for w, _ in _tokens(a)) == sorted(_plain(w) for w, _ in _tokens(b))


# Words that join two things without ranking them: "red vs brown" asks what "brown vs red" asks.
SYMMETRIC = frozenset("and or vs versus & + between".split())


def _traded(x: list[str], y: list[str]) -> tuple[int, int] | None:
    """The two places where `x` and `y`, word for word the same otherwise, hold each other's words."""
    if len(x) != len(y):
        return None
    diffs = [i for i, (u, v) in enumerate(zip(x, y, strict=True)) if u != v]
    if len(diffs) != 2 or (x[diffs[0]], x[diffs[1]]) != (y[diffs[1]], y[diffs[0]]):
        return None
    return diffs[0], diffs[1]


def order_veto(a: str, b: str) -> str:
    """The same question word for word but for two content words that traded places: who does what to
    whom changed ("turn my pink hydrangea blue" / "... blue hydrangea pink", "baking soda instead of baking
    powder" / the other way round, "slow on wifi, fine on ethernet" / the other way round). Two things joined
    by "and", "or" or "vs" may trade places; a clause may move (canonical keys)."""
    from cache_service.canonical import canonical_words

    wa = [w for clause in canonical_words(a, correct=False) for w in clause]
    wb = [w for clause in canonical_words(b, correct=False) for w in clause]
    places = _traded(wa, wb)
    if places is None or not _content([wa[places[0]], wa[places[1]]]) == {wa[places[0]], wa[places[1]]}:
        return ""
    if SYMMETRIC.intersection(wa[places[0] + 1 : places[1]]):
        return ""
    return "order differs"


def veto(a: str, b: str) -> str:
    """Why `a` and `b` (two user turns) can't share an answer, "" when nothing objects."""
    # Two questions a few mistyped letters apart (canonical.near_typo: numbers and function words other
    # than typos equal) have the same negators and calendar words, mistyped ("withhout", "smmer").
    typos_only = near_typo(a, b)
    a, b = (
        on_mistyped(strip_wrappers(expand_contractions(a))),
        on_mistyped(strip_wrappers(expand_contractions(b))),
    )
    reason = number_negation_veto(a, b)
    if reason == "units swapped" and _clause_moved(a, b):
        reason = ""  # "is 16gb enough or do i need 32?? mostly ..." / "or do i need 32, is 16gb enough?? ..."
    if reason and not (typos_only and reason == "negation differs"):
        return reason
    da, db = dates(words(a)), dates(words(b))
    if da != db and not typos_only:
        return "dates differ"
    na, nb = names(a), names(b)
    la, lb = {_plain(w) for w, _ in _tokens(a)}, {_plain(w) for w, _ in _tokens(b)}
    if _unmatched_names(a, na, lb, b) or _unmatched_names(b, nb, la, a):
        return "names differ"
    if not typos_only and negation_moved(a, b):
        return "negation differs"
    return direction_veto(a, b) or order_veto(a, b) or ("" if typos_only else detail_veto(a, b))


# Words a negator reaches across to what it negates ("does not even hum", "without a lot of carbs", "do not
# want to lose", "without using bleach").
_NEGATION_GAP = frozenset(
    """even really a an the any be been have to at all ever yet just lot lots of much many too enough
    want wanna need try trying using use""".split()
)


_ARTICLES = frozenset("a an the".split())


def _negations(text: str) -> tuple[set[str], set[str], set[str]]:
    """What the negators ("not", "no", "without", "never") are put on: the stems of the first content word
    after each, past a few small words ("does not even hum"); of every word they reach, up to the end of
    the phrase ("without drainage holes", "do not own a stud finder"); and of the content words said
    plainly."""
    ws = words(text)
    heads, reached = set(), set()
    for i, w in enumerate(ws):
        if w in NEGATORS:
            j = i + 1
            while j < len(ws) and ws[j] in _NEGATION_GAP:
                j += 1
            if j < len(ws) and _content([ws[j]]):
                heads.add(j)
            while j < len(ws) and (_content([ws[j]]) or ws[j] in _ARTICLES):
                reached.add(j)
                j += 1
    said = {j for j, w in enumerate(ws) if j not in reached and _content([w])}

    def stems(at: set[int]) -> set[str]:
        return {stem for j in at for stem in _stems(ws[j])}

    return stems(heads), stems(reached), stems(said)


def negation_moved(a: str, b: str) -> bool:
    """Both sides negate, but not the same words, and what one negates first the other says plainly: "hums
    but will not spin" / "does not hum at all" (one negation each, so the count of negators agrees)."""
    head_a, neg_a, said_a = _negations(a)
    head_b, neg_b, said_b = _negations(b)
    if not (head_a and head_b) or neg_a & neg_b:
        return False
    return bool((head_a - said_a) & said_b or (head_b - said_b) & said_a)


# English function words (articles, pronouns, auxiliaries, prepositions, question words, conjunctions,
# politeness, the verbs of asking: "tell me", "I want to know"); every other word is a content word.
FUNCTION_WORDS = frozenset(
    """a an the this that these those some any each every all both either neither i me my mine myself
    you your yours yourself we us our ours he him his she her hers it its they them their theirs one
    is am are was were be been being do does did done have has had having can could will would shall
    should may might must need to of in on at by for from with about into onto over under as than
    and or but so if then because while when where what which who whom whose why how there here just
    also too very really please thanks thank hi hello hey get got go going make way there's it's
    not tell show explain know want like wonder wondering""".split()
)
# Words that carry the writer's stance or the rhythm of speech, not the question: interjections and chat
# acronyms of them, fillers, and adverbs of emphasis, candour or hedging ("is it sooo bad", "literally no
# experience", "how long does it normally take", "roughly"). A closed class of English, not taken from any
# evaluation set; "only", "still", "even", "already" and "always" stay content words (they change the scope).
STANCE_WORDS = frozenset(
    """um umm uh uhm er erm hmm oh ah wow lol lmao lmfao rofl omg wtf ngl tbh imo imho idk fr btw
    literally honestly basically actually truly totally absolutely seriously genuinely kinda sorta
    definitely certainly surely anyway anyways probably maybe perhaps possibly roughly approximately approx
    normally usually typically generally""".split()
)
# Closed-class words FUNCTION_WORDS leaves out (reflexive pronouns, an unexpanded "'d", prepositions and
# conjunctions that link rather than count, place or time: "via" / "through", "instead of" / "rather than"):
# a question that differs only by one of them asks nothing new, so the detail veto does not count them, but
# they stay content words elsewhere (MIN_SHARED was chosen with them counted). Not the indefinite pronouns
# ("everyone" / "anyone" is a scope) nor "per" ("drops per mL" / "drops in 5 mL"); "-body" and "-one" are
# one word (_SAME_PRONOUN).
LINKING_WORDS = frozenset(
    """yourselves himself herself itself ourselves themselves i'd you'd he'd she'd we'd they'd it'd that'd
    doing via through throughout within during upon among amongst toward towards despite although though
    whether whilst instead rather""".split()
)
_SAME_PRONOUN = {"somebody": "someone", "anybody": "anyone", "everybody": "everyone"}
# The share of content words (Jaccard) two questions must have in common for a one-sided word to be a
# changed detail rather than a rewording; chosen on the tune split (0.2, 0.35, 0.5 tried).
MIN_SHARED = 0.35


def _content(words: list[str]) -> set[str]:
    """The content words: no function word, and no number ("20%", "15 %" included: the numbers veto reads
    them)."""
    words = [w.removesuffix("'s") for w in words]
    return {
        w
        for w in words
        if w not in FUNCTION_WORDS and w != "%" and not w.replace(".", "").rstrip("%").isdigit()
    }


def _one_word_swapped(wa: list[str], wb: list[str]) -> tuple[str, str] | None:
    """The two content words, when the questions are word for word the same but for one content word."""
    if len(wa) != len(wb):
        return None
    diffs = [(x, y) for x, y in zip(wa, wb, strict=True) if x != y]
    if len(diffs) != 1 or not all(_content([w]) for w in diffs[0]):
        return None
    return diffs[0]


def _aligned_pairs(a: str, b: str) -> set[str]:
    """The words of either question that are an aligned typo of the other's word in the same place
    (cache_service/typos.aligned_typo), when the two are word for word the same but for at most two words."""
    from cache_service.canonical import canonical_words
    from cache_service.typos import aligned_typo

    wa = [w for clause in canonical_words(a, correct=False) for w in clause]
    wb = [w for clause in canonical_words(b, correct=False) for w in clause]
    if len(wa) != len(wb):
        return set()
    diffs = [(x, y) for x, y in zip(wa, wb, strict=True) if x != y]
    if len(diffs) > 2:
        return set()
    return {w for x, y in diffs if aligned_typo(x, y) for w in (x, y)}


_STRETCHED = re.compile(r"([a-z])\1{2,}")


def _stretched_forms(word: str) -> set[str]:
    """A word typed with a letter held down ("sooo", "helppp", "wtfff"): the run as one letter and as two
    (a word without such a run: itself)."""
    return {word, _STRETCHED.sub(r"\1", word), _STRETCHED.sub(r"\1\1", word)}


def _typed_for(x: str, y: str) -> bool:
    """Whether one word can be the other mistyped (typos.py), a code typed with a doubled or swapped
    letter, or either typed with a letter held down ("sooo" / "so")."""
    from cache_service.canonical import typo_pair
    from cache_service.typos import real_word_typo

    if (_STRETCHED.search(x) or _STRETCHED.search(y)) and _stretched_forms(x) & _stretched_forms(y):
        return True
    return typo_pair(x, y) or real_word_typo(x, y) or _retyped_code(x, y)


_SUFFIXES = (
    ("ies", "y"),
    ("es", ""),
    ("s", ""),
    ("ing", ""),
    ("ing", "e"),
    ("ed", ""),
    ("ed", "e"),
    ("d", ""),
)


def _stems(word: str) -> set[str]:
    """The word without a regular inflection (plural, third person, -ing, -ed), each way it may undo
    ("supplies" -> "supply", "declaring" -> "declar", "declare"; "stopped" -> "stop")."""
    out = {word}
    for suffix, back in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            stem = word[: -len(suffix)] + back
            out.add(stem)
            if not back and len(stem) >= 4 and stem[-1] == stem[-2] and stem[-1] not in "aeiouls":
                out.add(stem[:-1])  # "stopped" -> "stop"
    return out


def _inflected(x: str, y: str) -> bool:
    """One word is the other with a regular inflection ("supplier" / "suppliers", "shows" / "showing")."""
    return x != y and x.isalpha() and y.isalpha() and bool(_stems(x) & _stems(y))


# Symbols typed for words: a symbol on one side stands for any of these on the other ("$15" / "15
# dollars", "4070 + ryzen" / "4070 and ryzen", "> 50" / "greater than 50", "~60" / "about 60").
_SYMBOL_WORDS = {
    "&": {"and"}, "+": {"and", "plus"}, "$": {"dollar", "dollars", "bucks", "usd"},
    "£": {"pound", "pounds", "quid", "gbp"}, "€": {"euro", "euros", "eur"}, "@": {"at"},
    ">": {"greater", "more", "above", "over"}, "<": {"less", "fewer", "below", "under"},
    "=": {"equals", "equal", "is"}, "~": {"about", "approximately", "approx", "around", "roughly"},
    "°": {"degree", "degrees", "deg"}, "%": {"percent", "percentage"},
}  # fmt: skip
_UNTOKENIZED = "°~"  # symbols the canonical words leave out, looked for in the text as typed


def _symbols_spelled(a: str, b: str, words_a: list[str], words_b: list[str]) -> set[str]:
    """The symbols of either side that the other writes as a word, and those words ("°" and "~" are
    looked for in the text as typed: they are no words of their own)."""
    out: set[str] = set()
    for x, y, text_x, text_y in ((set(words_a), set(words_b), a, b), (set(words_b), set(words_a), b, a)):
        for symbol, spelled in _SYMBOL_WORDS.items():
            typed = symbol in x or (symbol in _UNTOKENIZED and symbol in text_x)
            if typed and symbol not in y and symbol not in text_y and spelled & y:
                out |= {symbol} | (spelled & y)
    return out


QUANTIFIERS = frozenset("any all every each only just both either some most".split())
# Words that count without a number ("stop apps updating" / "stop just one app updating")
COUNT_WORDS = frozenset("one single each every all both multiple several many few any".split())


def _count_words(ws: list[str]) -> set[str]:
    """The count words said, but for "one" read aloud as the first part of a number ("one eighty")."""
    return {
        w
        for w, after in with_next(ws)
        if w in COUNT_WORDS and not (w == "one" and (after in NUMBER_WORDS or after == "oh"))
    }


def _quantifier_added(longer: list[str], shorter: list[str]) -> bool:
    """`longer` is `shorter` word for word with one quantifier put in: the scope is the point. "any" after
    a negator (up to three words before) says nothing more ("without using any chemicals")."""
    if len(longer) != len(shorter) + 1:
        return False
    for i, w in enumerate(longer):
        if w != (shorter[i] if i < len(shorter) else None):
            negated_any = w == "any" and bool(NEGATORS.intersection(longer[max(0, i - 3) : i]))
            return w in QUANTIFIERS and not negated_any and longer[:i] + longer[i + 1 :] == shorter
    return False


FRAME_SHARE = 0.6


def _same_frame(wa: list[str], wb: list[str]) -> bool:
    """The two questions open and close with the same words, which cover most of the shorter one: only
    the part between them differs ("how do i get my toddler to | sleep through the night" / "| eat
    vegetables"), so a content word changed there is the point, however few content words they share
    (one at least: "is it | suitable | for him" / "| appropriate |" share no topic, only function words)."""
    shorter = min(len(wa), len(wb))
    if shorter < 4:
        return False
    prefix = 0
    while prefix < shorter and wa[prefix] == wb[prefix]:
        prefix += 1
    suffix = 0
    while suffix < shorter - prefix and wa[-1 - suffix] == wb[-1 - suffix]:
        suffix += 1
    return prefix + suffix >= FRAME_SHARE * shorter


def detail_veto(a: str, b: str) -> str:
    """Nearly the same question with a content word added, dropped or swapped ("change a flat tire" /
    "... on a bicycle", "a marathon in miles" / "... in kilometers"; a question word for word the same but
    for one content word, however short, with another one in common; a changed middle between the same
    opening and closing words, `_same_frame`): the difference is the point. A rewording changes most of
    the words and is left to the embedding; a mistyped word, a word of stance, a symbol spelled out or, with
    the same numbers, another form of a word is not a difference (canonical.near_typo, STANCE_WORDS,
    _SYMBOL_WORDS, _inflected)."""
    from cache_service.canonical import canonical_words
    from cache_service.typos import aligned_typo

    wa = [_SAME_PRONOUN.get(w, w) for clause in canonical_words(a, correct=False) for w in clause]
    wb = [_SAME_PRONOUN.get(w, w) for clause in canonical_words(b, correct=False) for w in clause]
    same = respelled(a, b)
    # said without saying anything new: a word of stance on either side, a symbol the other side spells
    unsaid = STANCE_WORDS | LINKING_WORDS | _symbols_spelled(a, b, wa, wb)
    # With the same numbers on both sides, a number in words ("ten thousand") and a plural or another form
    # of the same word ("switch supplier" / "switch suppliers") say nothing new; with other numbers they
    # may ("a tablespoon" / "4 tablespoons").
    counted_a, counted_b = _count_words(wa), _count_words(wb)
    plain_a, plain_b = words(a), words(b)
    na, nb = numbers(plain_a), numbers(plain_b)
    same_numbers = (na == nb or read_aloud_equal(plain_a, plain_b, na, nb)) and counted_a == counted_b
    if same_numbers:
        unsaid |= {w for w in wa + wb if w in NUMBER_WORDS or w in ORDINAL_WORDS or _ORDINAL.fullmatch(w)}
    ca, cb = _content(wa), _content(wb)
    only_a, only_b = ca - cb - same, cb - ca - same
    swapped = _one_word_swapped(wa, wb)
    swapped = None if swapped and set(swapped) <= same else swapped
    explained = swapped and (
        _typed_for(*swapped)
        or aligned_typo(*swapped)
        or set(swapped) <= unsaid
        or (same_numbers and _inflected(*swapped))
    )
    if swapped and ca & cb and not explained:
        return "a detail differs"  # "the square root of 144" / "the cube root of 144", however short
    if _quantifier_added(wa, wb) or _quantifier_added(wb, wa):
        return "a detail differs"  # "drop rows where column is NaN" / "... where any column is NaN"
    # a word written another way on the other side ("2.4ghz" / "2.4 GHz") counts as shared, half per side
    half = len((ca ^ cb) & same) / 2
    if not (only_a or only_b):
        return ""
    if len(ca & cb) + half < MIN_SHARED * (len(ca | cb) - half) and not (ca & cb and _same_frame(wa, wb)):
        return ""
    # a typo inside a contraction ("What'ss") leaves it unexpanded: compare with the other side as typed
    wa += [w for clause in canonical_words(a, correct=False, expand=False) for w in clause]
    wb += [w for clause in canonical_words(b, correct=False, expand=False) for w in clause]
    aligned = _aligned_pairs(a, b)

    def explained_by(word: str, other: list[str]) -> bool:
        return any(_typed_for(word, w) or (same_numbers and _inflected(word, w)) for w in other)

    unexplained_a = {x for x in only_a - unsaid if not explained_by(x, wb) and x not in aligned}
    unexplained_b = {y for y in only_b - unsaid if not explained_by(y, wa) and y not in aligned}
    return "a detail differs" if unexplained_a or unexplained_b else ""
