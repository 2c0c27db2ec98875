"""`make bench`'s semantic-cache quality run: the offline evaluation (tools/cache/evaluate.py: frozen splits,
perturbation suite, the plain-cosine baseline beside the shipped cache) with its tables written into
docs/BENCHMARKS.md. Takes evaluate's flags.

    .venv/bin/python -m bench.cache_quality --write-docs
"""

from __future__ import annotations

from bench.report import model_section, publish
from tools.cache import evaluate


def main() -> None:
    args, lines = evaluate.main()
    if args.write_docs and not args.quick:
        section, title = model_section("cache-quality", "Semantic cache quality", args.embedding_model)
        publish(section, [title, "", *lines], True)


if __name__ == "__main__":
    main()
