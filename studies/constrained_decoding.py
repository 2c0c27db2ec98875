"""The per-token cost of constrained decoding: the engine's tokens/s with and without a JSON schema, at
concurrency 1 and 32, measured side by side in one process (rounds alternate free and constrained, so
machine noise hits both).

The schema asks for an object with a long string ({"essay": string, minLength 2000}), so a constrained
request cannot end before max_tokens either: both modes generate exactly the same number of tokens
(free requests ignore EOS), and the difference is the mask (compute the bitmask, mask the logits) and the
matcher advance. Each mode runs its requests through the synchronous engine from admission to the last
token; the grammar is compiled once before timing (the cache serves the rest, as in serving).

    .venv/bin/python -m studies.constrained_decoding [--rounds 3] [--max-tokens 64] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from bench.report import median, publish
from worker.engine.config import EngineConfig
from worker.engine.engine import LLMEngine
from worker.engine.outputs import PromptInput
from worker.engine.sampling_params import GrammarSpec, SamplingParams
from worker.model.build import build_engine

SCHEMA = {
    "type": "object",
    "properties": {"essay": {"type": "string", "minLength": 2000}},
    "required": ["essay"],
    "additionalProperties": False,
}
QUESTION = "Write an essay about lighthouses as a JSON object with the essay in the field 'essay'."


def run(engine: LLMEngine, concurrency: int, max_tokens: int, constrained: bool) -> tuple[float, int]:
    """Seconds from admission to the last token, and tokens generated."""
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA)) if constrained else None
    start = time.perf_counter()
    for i in range(concurrency):
        params = SamplingParams(
            temperature=0.8, seed=i, max_tokens=max_tokens, ignore_eos=not constrained, structured_output=spec
        )
        messages = [{"role": "user", "content": f"({i}) {QUESTION}"}]
        engine.add(
            engine.make_requests(
                f"{'c' if constrained else 'f'}{i}-{time.monotonic_ns()}",
                PromptInput(messages=messages),
                params,
            )
        )
    tokens = 0
    while engine.has_unfinished():
        for output in engine.step().outputs:
            tokens += len(output.token_ids)
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    engine = build_engine(EngineConfig())
    engine.grammars.matcher(GrammarSpec("json_schema", json.dumps(SCHEMA)))  # tokenizer + compile, untimed
    run(engine, 2, 4, True)  # warm-up
    rows = []
    for concurrency in args.concurrency:
        rates: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for constrained in (False, True):
                seconds, tokens = run(engine, concurrency, args.max_tokens, constrained)
                assert tokens == concurrency * args.max_tokens, tokens
                rates[constrained].append(tokens / seconds)
                mode = "json" if constrained else "free"
                print(f"concurrency {concurrency} {mode}: {tokens / seconds:.1f} tok/s", flush=True)
        free, json_rate = median(rates[False]), median(rates[True])
        ratios = [c / f for f, c in zip(rates[False], rates[True], strict=True)]
        rows.append(
            f"| {concurrency} | {free:.1f} | {json_rate:.1f} | {median(ratios):.3f} "
            f"({min(ratios):.3f}-{max(ratios):.3f}) |"
        )
    flags = f"--rounds {args.rounds} --max-tokens {args.max_tokens} --write-docs"
    threads = torch.get_num_threads()
    info = engine.model_info
    publish(
        "constrained-decoding",
        [
            "## Constrained decoding",
            "",
            f"`.venv/bin/python -m studies.constrained_decoding {flags}`: the engine in one process (default"
            f" settings: {info.dtype}, quantization {info.quantization}, {threads} torch threads),"
            f" chat prompts, {args.max_tokens} tokens a request,"
            " all requests admitted together;"
            " tokens/s from admission to the last token, medians over rounds that alternate free text and a"
            " JSON schema (llguidance; an object with one long string field, so both modes generate the same"
            " number of tokens). Ratio: constrained / free within a round, median (range).",
            "",
            "| concurrency | free text (tok/s) | JSON schema (tok/s) | ratio |",
            "| --- | --- | --- | --- |",
            *rows,
            "",
            f"Load average of the machine when the run ended: {os.getloadavg()[0]:.1f} (1 min) on"
            f" {os.cpu_count()} CPUs; above the CPU count the figures are dominated by other processes.",
        ],
        args.write_docs,
    )


if __name__ == "__main__":
    main()
