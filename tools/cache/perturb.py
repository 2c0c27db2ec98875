"""The perturbation suite: the frozen questions retyped the way people retype, by seeded code.

For every single-question seed of a frozen split (its stored question `q` and its traps), each perturbation
kind below makes one copy. A perturbed copy of `q` must hit `q`'s entry; a perturbed trap must stay a miss.
The wrapper vocabulary (greetings, sign-offs, lead-ins, add-ons) is data/writers/vocab/wrappers.json,
written and frozen by someone who never saw the normalizer (cache_service/canonical.py has its own list).

Kinds:
- typo1, typo2: one or two edits (a keyboard-adjacent substitution, a dropped, doubled or transposed
  letter), in any lower-case word or the first word, short words and first letters included; never in a
  name, a number or a code (a typo there makes another name);
- wrapper: a greeting, a sign-off, a lead-in or an add-on, or a greeting and a sign-off together;
- clause: the question's clauses swapped around a comma, or a trailing clause ("... to open an account",
  "... if it rains") moved to the front with a comma; in a message of several sentences, inside the
  question's own sentence (before 2026-12-05 a clause could be carried across sentences);
- case: all lower case, all upper case, or every word capitalized;
- punctuation: the final mark dropped or doubled, commas dropped, spaces doubled.

    .venv/bin/python -m tools.cache.perturb --write-sample   # the fixed sample under tests/cache/data/
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
from pathlib import Path

HERE = Path(__file__).parent
VOCAB = HERE / "data" / "writers" / "vocab" / "wrappers.json"
# The tune side's own wrappers, written apart from the frozen list by another writer: a suite built from the
# tune split (to iterate on) never sees the frozen vocabulary that measures the normalizer.
TUNE_VOCAB = HERE / "data" / "writers" / "vocab_tune" / "wrappers.json"
# A second tune-side vocabulary by a third writer, in other voices (data/writers/vocab_tune2/README.md).
TUNE2_VOCAB = HERE / "data" / "writers" / "vocab_tune2" / "wrappers.json"
SAMPLE = HERE.parent.parent / "tests" / "cache" / "data" / "perturbation_sample.jsonl"
KINDS = ("typo1", "typo2", "wrapper", "clause", "case", "punctuation")
_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
ADJACENT: dict[str, str] = {}
for _r, _row in enumerate(_ROWS):
    for _c, _ch in enumerate(_row):
        near = [_row[i] for i in (_c - 1, _c + 1) if 0 <= i < len(_row)]
        for _dr in (-1, 1):
            if 0 <= _r + _dr < len(_ROWS):
                other = _ROWS[_r + _dr]
                near += [other[i] for i in (_c - 1, _c, _c + 1) if 0 <= i < len(other)]
        ADJACENT[_ch] = "".join(sorted(set(near)))
_WORD = re.compile(r"[A-Za-z]+")
_MOVABLE = re.compile(r"\s(to|for|if|when|after|before|without|while|because|so that|in order to)\s", re.I)


def rng_for(*parts: str) -> random.Random:
    return random.Random(int(hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16], 16))


def _typo_targets(text: str) -> list[re.Match[str]]:
    """Words a typo may hit: lower-case words, and the first word (its capital is a sentence's)."""
    out = []
    for i, m in enumerate(_WORD.finditer(text)):
        w = m.group()
        if w.islower() or (i == 0 and w[:1].isupper() and w[1:].islower()):
            out.append(m)
    return out


def _edit(word: str, rng: random.Random) -> str:
    pos = rng.randrange(len(word))
    op = rng.choice(
        ("substitute", "drop", "double", "transpose") if len(word) > 1 else ("substitute", "double")
    )
    ch = word[pos]
    if op == "substitute":
        near = ADJACENT.get(ch.lower(), "")
        if not near:
            return word
        new = rng.choice(near)
        return word[:pos] + (new.upper() if ch.isupper() else new) + word[pos + 1 :]
    if op == "drop":
        return word[:pos] + word[pos + 1 :]
    if op == "double":
        return word[:pos] + ch + word[pos:]
    if pos == len(word) - 1:
        pos -= 1
    return word[:pos] + word[pos + 1] + word[pos] + word[pos + 2 :]


def typo(text: str, edits: int, rng: random.Random) -> str:
    for _ in range(edits):
        targets = _typo_targets(text)
        if not targets:
            return text
        m = rng.choice(targets)
        changed = _edit(m.group(), rng)
        text = text[: m.start()] + changed + text[m.end() :]
    return text


def _lower_first(text: str) -> str:
    first = text.split(" ", 1)[0]
    if first[1:].islower() or len(first) == 1 and first != "I":
        return text[:1].lower() + text[1:]
    return text


def _body(text: str) -> tuple[str, str]:
    """(text without its final punctuation, that punctuation)."""
    m = re.search(r"[?.!]+$", text.strip())
    return (text.strip()[: m.start()], m.group()) if m else (text.strip(), "")


def wrap(text: str, vocab: dict[str, list[str]], rng: random.Random) -> str:
    how = rng.choice(("greeting", "signoff", "prefix", "suffix", "both"))
    if how in ("greeting", "both"):
        text = f"{rng.choice(vocab['greetings'])} {text}"
    if how in ("signoff", "both"):
        text = f"{text} {rng.choice(vocab['signoffs'])}"
    if how == "prefix":
        prefix = rng.choice(vocab["prefixes"])
        text = f"{prefix} {text if prefix[-1:] in ':,.!?' else _lower_first(text)}"
    if how == "suffix":
        body, mark = _body(text)
        suffix = rng.choice(vocab["suffixes"])
        text = f"{body} {suffix}" + ("" if suffix[-1:] in "?.!" else mark)
    return text


_SENTENCE_END = re.compile(r"(?<=[.?!])\s+")


def move_clause(text: str, rng: random.Random) -> str | None:
    """A clause moved inside its sentence; in a message of several sentences, inside the question's own
    (the last one asked), so no clause is carried across a sentence boundary ("... how | to do myself.
    Could you explain ..." is no clause move anyone types)."""
    sentences = _SENTENCE_END.split(text.strip())
    if len(sentences) == 1:
        return _move_in_sentence(text, rng)
    asked = [i for i, sentence in enumerate(sentences) if sentence.endswith("?")]
    if not asked:
        return None
    moved = _move_in_sentence(sentences[asked[-1]], rng)
    if moved is None:
        return None
    return " ".join([*sentences[: asked[-1]], moved, *sentences[asked[-1] + 1 :]])


def _move_in_sentence(text: str, rng: random.Random) -> str | None:
    body, mark = _body(text)
    commas = re.split(r"(?<!\d),|,(?!\d)", body)  # a comma inside a number ("3,000") splits nothing
    if len(commas) == 2:
        left, right = (s.strip() for s in commas)
        if left and right:
            return f"{right[:1].upper()}{right[1:]}, {_lower_first(left)}{mark}"
    matches = [m for m in _MOVABLE.finditer(body) if m.start() > len(body) // 3]
    if not matches:
        return None
    m = rng.choice(matches)
    head, tail = body[: m.start()], body[m.start() + 1 :]
    return f"{tail[:1].upper()}{tail[1:]}, {_lower_first(head)}{mark}"


def recase(text: str, rng: random.Random) -> str:
    how = rng.choice(("lower", "upper", "title"))
    return text.lower() if how == "lower" else text.upper() if how == "upper" else text.title()


def repunctuate(text: str, rng: random.Random) -> str:
    body, mark = _body(text)
    how = rng.choice(("drop", "double", "commas", "spaces"))
    if how == "drop":
        return body
    if how == "double":
        return body + (mark or "?") * 2
    if how == "commas" and "," in body:
        return body.replace(",", "") + mark
    return text.replace(" ", "  ")


def perturb(text: str, kind: str, vocab: dict[str, list[str]], salt: str = "") -> str | None:
    """`text` perturbed by `kind` (deterministic for a text, kind and salt), None when the kind does not
    apply or changes nothing."""
    rng = rng_for(kind, salt, text)
    if kind == "typo1":
        out = typo(text, 1, rng)
    elif kind == "typo2":
        out = typo(text, 2, rng)
    elif kind == "wrapper":
        out = wrap(text, vocab, rng)
    elif kind == "clause":
        out = move_clause(text, rng)
    elif kind == "case":
        out = recase(text, rng)
    elif kind == "punctuation":
        out = repunctuate(text, rng)
    else:
        raise ValueError(kind)
    return out if out and out != text else None


def load_vocab(side: str = "frozen") -> dict[str, list[str]]:
    """The wrapper vocabulary of one side: "frozen" measures, "tune" and "tune2" are for iterating on the
    tune split."""
    return json.loads({"frozen": VOCAB, "tune": TUNE_VOCAB, "tune2": TUNE2_VOCAB}[side].read_text())


def suite(rows: list[dict], trap_kinds_per_text: int = 2, side: str = "frozen") -> list[dict]:
    """Perturbed rows from the single-question rows given (frozen splits, or the tune split with
    side="tune"): every kind on each stored question (should hit its group), `trap_kinds_per_text` kinds
    (seeded choice) on each trap (must miss). Rows keep split, topic and groups; `kind` becomes the
    perturbation kind, `trap` the trap's kind. Wrappers come from `side`'s own vocabulary."""
    vocab = load_vocab(side)
    out = []
    seen_q: set[str] = set()
    for r in rows:
        if not isinstance(r["a"], str) or r.get("a_scope", "tenant-a") != r.get("b_scope", "tenant-a"):
            continue
        base = {k: r[k] for k in ("split", "topic", "a", "a_group") if k in r} | (
            {"writer": r["writer"]} if "writer" in r else {}
        )
        if r["a"] not in seen_q:
            seen_q.add(r["a"])
            for kind in KINDS:
                b = perturb(r["a"], kind, vocab)
                if b is not None:
                    out.append(
                        {
                            **base,
                            "kind": kind,
                            "trap": "",
                            "b": b,
                            "b_group": r["a_group"],
                            "should_hit": True,
                        }
                    )
        if not r["should_hit"]:
            for kind in rng_for("trap-kinds", r["b"]).sample(KINDS, trap_kinds_per_text):
                b = perturb(r["b"], kind, vocab)
                if b is not None:
                    out.append(
                        {
                            **base,
                            "kind": kind,
                            "trap": r["kind"],
                            "b": b,
                            "b_group": r["b_group"],
                            "should_hit": False,
                        }
                    )
    return out


def check(questions: list[str], shown: int = 5) -> None:
    """The canonical tier alone on perturbed copies of `questions`, with the tune side's vocabulary."""
    from cache_service.canonical import canonical_keys, near_typo

    vocab = load_vocab("tune")
    for kind in KINDS:
        pairs = [(q, b) for q in questions if (b := perturb(q, kind, vocab)) is not None]
        missed = [
            (q, b) for q, b in pairs if not canonical_keys(q) & canonical_keys(b) and not near_typo(b, q)
        ]
        print(f"{kind}: {len(pairs) - len(missed)}/{len(pairs)} keep a key")
        for q, b in missed[:shown]:
            print(f"    {q!r}\n -> {b!r}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--write-sample", action="store_true", help=f"write the fixed test sample to {SAMPLE}"
    )
    parser.add_argument("--per-kind", type=int, default=12)
    parser.add_argument(
        "--check",
        type=Path,
        help="a JSONL file of tune-side questions ({'q': ...}): how many of each kind's copies keep a "
        "canonical key (or pass as a near typo), and the failures; no model, no frozen data",
    )
    args = parser.parse_args()
    if args.check:
        check([json.loads(line)["q"] for line in args.check.read_text().splitlines() if line.strip()])
        return
    from tools.cache.evaluate import FROZEN, load_evaluation_rows

    rows = [r for r in load_evaluation_rows() if r["split"] in FROZEN]
    perturbed = suite(rows)
    print(f"{len(perturbed)} perturbed rows from {len(rows)} frozen rows")
    if args.write_sample:
        rng = random.Random(35)
        sample = []
        for kind in KINDS:
            for should_hit in (True, False):
                pool = [p for p in perturbed if p["kind"] == kind and p["should_hit"] == should_hit]
                sample += rng.sample(pool, min(args.per_kind, len(pool)))
        SAMPLE.parent.mkdir(parents=True, exist_ok=True)
        SAMPLE.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in sample))
        print(f"{len(sample)} rows -> {SAMPLE}")


if __name__ == "__main__":
    main()
