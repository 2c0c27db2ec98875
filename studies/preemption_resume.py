"""What a preemption-heavy run costs with each way of computing a resuming request's generated tokens again:
in one step as decode rows (the engine's way), one per step as decodes, or as one prefill chunk (not bitwise
what decoding computed: a bfloat16 prefill row rounds otherwise). The ways are swapped in by replacing the
scheduler's `tokens_to_run` and the runner's `_is_decode`, the two places that decide them.

Twelve greedy requests of 96 prompt and 256 generated tokens on a KV pool that holds 100 blocks of 16 (about
half of what they need), bfloat16, in process; rounds alternate the ways so machine noise hits each alike.

    .venv/bin/python -m studies.preemption_resume [--rounds 2] [--num-blocks 100]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import worker.engine.scheduler as scheduler_module
import worker.model.runner as runner_module
from bench.report import median
from worker.engine.config import EngineConfig, KVCacheConfig, SchedulerConfig
from worker.engine.outputs import PromptInput
from worker.engine.request import Request
from worker.engine.sampling_params import SamplingParams
from worker.model.build import build_engine
from worker.model.cpu_kind import cpu_info

ENGINE_TOKENS_TO_RUN = scheduler_module.tokens_to_run
ENGINE_IS_DECODE = runner_module._is_decode


def one_per_step(request: Request, start: int, budget: int) -> int:
    if start < request.num_prompt_tokens:
        return min(request.num_prompt_tokens - start, budget)
    return min(request.num_tokens - start, 1)


def single_token_decodes(item) -> bool:
    return item.num_new_tokens == 1 and item.start >= item.request.num_prompt_tokens


WAYS: dict[str, tuple[Callable, Callable]] = {
    "decode rows, one step": (ENGINE_TOKENS_TO_RUN, ENGINE_IS_DECODE),
    "decodes, one per step": (one_per_step, ENGINE_IS_DECODE),
    "prefill chunk": (ENGINE_TOKENS_TO_RUN, single_token_decodes),
}


def run(way: str, prefix_caching: bool, num_blocks: int) -> dict[str, float]:
    scheduler_module.tokens_to_run, runner_module._is_decode = WAYS[way]
    try:
        engine = build_engine(
            EngineConfig(
                model="models/SmolLM2-135M-Instruct",
                dtype="bfloat16",
                scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16, max_model_len=2048),
                kv_cache=KVCacheConfig(
                    block_size=16, num_blocks=num_blocks, enable_prefix_caching=prefix_caching
                ),
            )
        )
        params = SamplingParams(temperature=0.0, max_tokens=256, ignore_eos=True)
        for i in range(12):
            prompt = [(37 * i + 11 * j) % 40000 + 100 for j in range(96)]
            engine.add(engine.make_requests(f"r{i}", PromptInput(token_ids=prompt), params))
        started, steps, finished_at = time.perf_counter(), 0, []
        while engine.has_unfinished():
            outputs = engine.step().outputs
            steps += 1
            finished_at += [time.perf_counter() - started for o in outputs if o.finished]
        return {
            "wall_s": time.perf_counter() - started,
            "steps": steps,
            "preemptions": engine.scheduler.num_preemptions,
            "e2e_p50_s": median(finished_at),
        }
    finally:
        scheduler_module.tokens_to_run, runner_module._is_decode = ENGINE_TOKENS_TO_RUN, ENGINE_IS_DECODE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-blocks", type=int, default=100)
    args = parser.parse_args()
    print(cpu_info().describe())
    for prefix_caching in (True, False):
        results: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
        for _ in range(args.rounds):
            for way in WAYS:
                results[way].append(run(way, prefix_caching, args.num_blocks))
        print(f"prefix caching {'on' if prefix_caching else 'off'} (medians of {args.rounds} rounds):")
        for way, runs in results.items():
            figures = {key: median([r[key] for r in runs]) for key in runs[0]}
            print(
                f"  {way:22s} wall {figures['wall_s']:5.1f} s  steps {figures['steps']:4.0f}  "
                f"preemptions {figures['preemptions']:3.0f}  e2e p50 {figures['e2e_p50_s']:4.1f} s"
            )


if __name__ == "__main__":
    main()
