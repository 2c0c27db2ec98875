"""docs/BENCHMARKS.md is shared by several benchmark scripts: each owns one marker-delimited section."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md"


def write_section(name: str, body: str, path: Path = DOCS) -> None:
    """Replace the text between <!-- name:start --> and <!-- name:end --> (appending it if missing)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        text = before + block + after
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def model_section(name: str, title: str, embedding_model: str) -> tuple[str, str]:
    """The docs section and heading of a cache benchmark run with `embedding_model`: the default model's
    are the benchmark's own, another model's sit beside them."""
    from cache_service.embedding_models import DEFAULT_EMBEDDING_MODEL

    if embedding_model == DEFAULT_EMBEDDING_MODEL:
        return name, f"## {title}"
    return f"{name}-{embedding_model}", (
        f"## {title} with {embedding_model} (opt-in: CACHE_EMBEDDING_MODEL={embedding_model})"
    )


def publish(name: str, lines: list[str], write_docs: bool) -> str:
    """Print a benchmark's section and, with --write-docs, make it section `name` of docs/BENCHMARKS.md."""
    body = "\n".join(lines)
    print(body)
    if write_docs:
        write_section(name, body)
    return body


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def median_of_runs(runs: list[dict[str, dict]]) -> dict[str, dict]:
    """Per workload, the median over runs of every number the client reported (a workload missing from a run
    takes the median of the runs that have it)."""
    out = {}
    for name in dict.fromkeys(name for run in runs for name in run):
        present = [run[name] for run in runs if name in run]
        numbers = [k for k, v in present[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
        out[name] = {k: median([r[k] for r in present if k in r]) for k in numbers}
        out[name]["num_runs"] = len(present)
    return out


def cpu_section(name: str, kind: str) -> str:
    """The docs section of a benchmark measured on one kind of CPU: a run on another kind adds its own table
    beside this one instead of overwriting it (worker/model/cpu_kind.py names the kinds)."""
    return f"{name}-{kind}"
