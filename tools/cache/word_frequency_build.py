"""Builds cache_service/word_frequency.tsv.gz, the English word frequencies of the spelling correction
(cache_service/spelling.py),
from the English list inside the PyPI wheel `wordfreq==3.1.1` (data CC BY-SA 4.0:
cache_service/WORD_FREQUENCY_LICENSE).

The wheel's `large_en` list stores words in buckets of one centibel: bucket i (from 0) holds the words whose
frequency is 10^(-i/100), so their Zipf frequency (log10 per billion words) is 9 - i/100. Every bucket's
single words (letters, one inner apostrophe: the words pair_checks.words yields) is written as one line,
"Zipf in hundredths<TAB>words", sorted, gzip without a time stamp: a rebuild is the same file. Nothing is
chosen by reading an evaluation set: it is the whole list.

    .venv/bin/pip install msgpack  # the list's format; the service never needs it
    .venv/bin/python -m tools.cache.word_frequency_build [path/to/wordfreq-3.1.1-py3-none-any.whl]
"""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from cache_service.spelling import FREQUENCY_FILE
from tools.cache import manifest

WHEEL = "wordfreq==3.1.1"
LIST = "wordfreq/data/large_en.msgpack.gz"
_SINGLE_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def build(wheel: Path) -> bytes:
    # Only this developer tool reads wordfreq's format; the service and its image never need the package.
    import msgpack

    with zipfile.ZipFile(wheel) as z:
        header, *buckets = msgpack.loads(gzip.decompress(z.read(LIST)), raw=False)
    if header.get("format") != "cB":
        raise RuntimeError(f"unexpected wordfreq list format: {header}")
    lines = [f"# Zipf frequency x 100 <TAB> words; from {WHEEL} ({LIST}), CC BY-SA 4.0"]
    for i, bucket in enumerate(buckets):
        words = sorted(w for w in bucket if _SINGLE_WORD.fullmatch(w))
        if words:
            lines.append(f"{900 - i}\t{' '.join(words)}")
    return gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)


def main() -> None:
    if len(sys.argv) > 1:
        wheel = Path(sys.argv[1])
    else:
        folder = Path(tempfile.mkdtemp())
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(folder), WHEEL],
            check=True,
        )
        wheel = next(folder.glob("wordfreq-*.whl"))
    FREQUENCY_FILE.write_bytes(build(wheel))
    manifest.record("word_frequency", {"package": WHEEL, "list": LIST})
    print(f"{FREQUENCY_FILE}: {FREQUENCY_FILE.stat().st_size} bytes")


if __name__ == "__main__":
    main()
