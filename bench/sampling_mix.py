"""What a few requests' sampling options cost the batch they share: the engine in process, a closed loop of
random prompts (as `vllm bench serve`'s random workload) with some requests setting `top_p`, `top_k`, a seed,
logprobs or a penalty, against the same load with none.

Each case keeps `--concurrency` requests running until `--requests` have finished, 128 random prompt tokens
and `--output-tokens` output tokens each (EOS ignored), temperature 1. The cases take turns on one engine for
`--rounds` rounds; the table gives the medians and each round's ratio to the plain case of the same round.
Before the sampler drew each kind of row on its own path (docs/STUDY_LOG.md, "Sampling: one request's
options"), one `top_p` row sent the whole batch through a full sort of the vocabulary.

    .venv/bin/python -m bench.sampling_mix [--concurrency 64] [--requests 128] [--rounds 2] [--write-docs]
"""

from __future__ import annotations

import argparse
import random

from bench.closed_loop import closed_loop
from bench.report import cpu_section, median, publish
from worker.engine.config import EngineConfig, KVCacheConfig, SchedulerConfig
from worker.engine.outputs import PromptInput
from worker.engine.sampling_params import SamplingParams
from worker.model.build import build_engine
from worker.model.cpu_kind import cpu_info

PROMPT_TOKENS = 128

# case -> (every how many requests, the options those requests set); the others sample at temperature 1
CASES: dict[str, list[tuple[int, dict]]] = {
    "plain": [],
    "1 in 8 top_p=0.95": [(8, {"top_p": 0.95})],
    "1 in 8 top_k=50": [(8, {"top_k": 50})],
    "1 in 4 seeded": [(4, {"seed": 7})],
    "1 in 8 logprobs=5": [(8, {"logprobs": 5})],
    "1 in 8 presence_penalty=0.5": [(8, {"presence_penalty": 0.5})],
    "all four, 1 in 8 each": [
        (8, {"top_p": 0.95}),
        (8, {"seed": 7}),
        (8, {"logprobs": 5}),
        (8, {"presence_penalty": 0.5}),
    ],
}


def options(case: list[tuple[int, dict]], index: int) -> dict:
    """The options of request `index`: the n-th kind of a case takes requests n, n + every, ..."""
    for nth, (every, extra) in enumerate(case):
        if index % every == nth:
            return extra
    return {}


def run_case(engine, case: list[tuple[int, dict]], args: argparse.Namespace, seed: int) -> dict:
    rng = random.Random(seed)

    def send(index: int) -> None:
        prompt = [rng.randrange(100, 40000) for _ in range(PROMPT_TOKENS)]
        params = SamplingParams(
            temperature=1.0, max_tokens=args.output_tokens, ignore_eos=True, **options(case, index)
        )
        engine.add(engine.make_requests(f"s{seed}-{index}", PromptInput(token_ids=prompt), params))

    tok_s, step_ms = closed_loop(engine, send, args.concurrency, args.requests)
    return {"tok_s": tok_s, "step_ms": step_ms}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    engine = build_engine(
        EngineConfig(scheduler=SchedulerConfig(max_num_seqs=args.concurrency), kv_cache=KVCacheConfig())
    )
    run_case(engine, [], argparse.Namespace(concurrency=4, requests=4, output_tokens=8), seed=0)  # warm
    runs: dict[str, list[dict]] = {name: [] for name in CASES}
    for round_index in range(args.rounds):
        for case_index, (name, case) in enumerate(CASES.items()):
            runs[name].append(run_case(engine, case, args, seed=1000 * round_index + case_index))
            print(f"round {round_index + 1} {name}: {runs[name][-1]['tok_s']:.1f} tok/s", flush=True)
    cpu = cpu_info()
    plain = runs["plain"]
    lines = [
        f"## Sampling options in a shared batch, CPU kind {cpu.kind}",
        "",
        f"CPU: {cpu.model} (kind {cpu.kind}; {' '.join(cpu.flags)}), dtype and quantization `auto`. Command: "
        f"`python -m bench.sampling_mix --concurrency {args.concurrency} --requests {args.requests} "
        f"--output-tokens {args.output_tokens} --rounds {args.rounds}`. The engine in process, closed loop, "
        f"{PROMPT_TOKENS} random prompt tokens per request, temperature 1; the cases take turns each round. "
        "The module docstring has the details.",
        "",
        "| case | output tok/s | median step (ms) | ratio to plain (rounds) |",
        "|---|---|---|---|",
    ]
    for name, case_runs in runs.items():
        ratios = [run["tok_s"] / base["tok_s"] for run, base in zip(case_runs, plain, strict=True)]
        lines.append(
            f"| {name} | {median([r['tok_s'] for r in case_runs]):.0f} | "
            f"{median([r['step_ms'] for r in case_runs]):.1f} | {median(ratios):.2f}x "
            f"({', '.join(f'{r:.2f}' for r in ratios)}) |"
        )
    publish(cpu_section("sampling-mix", cpu.kind), lines, args.write_docs)


if __name__ == "__main__":
    main()
