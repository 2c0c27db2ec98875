"""Where a decode step's time goes: matmul throughput of this CPU and a profiled engine step.

    .venv/bin/python -m bench.engine_profile [--dtype float32]

Prints GEMM throughput for the model's shapes at 1, 32 and 512 rows, then the median decode step of
32 and of 1 sequences (128-token prompts) and the top operators of a profiled 32-sequence step.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from bench.report import median
from worker.config import CacheConfig, EngineConfig
from worker.engine import build_engine
from worker.outputs import PromptInput
from worker.sampling_params import SamplingParams


def gemm_throughput(dtype: torch.dtype) -> None:
    weight = torch.randn(3072, 576, dtype=dtype)
    for rows in (1, 32, 512):
        x = torch.randn(rows, 576, dtype=dtype)
        times = []
        for _ in range(30):
            start = time.perf_counter()
            F.linear(x, weight)
            times.append(time.perf_counter() - start)
        t = median(times)
        print(f"GEMM {dtype} rows={rows:4d}: {2 * rows * 576 * 3072 / t / 1e9:7.1f} GFLOP/s")


def decode_steps(dtype: str, num_seqs: int, profile_top: int = 0) -> None:
    engine = build_engine(EngineConfig(dtype=dtype, cache=CacheConfig(kv_cache_memory_gb=0.5)))
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    for i in range(num_seqs):
        prompt = PromptInput(token_ids=[(i * 7 + j) % 40000 + 100 for j in range(128)])
        engine.add(engine.make_requests(f"r{i}", prompt, params))
    while engine.scheduler.waiting or any(r.num_output_tokens == 0 for r in engine.scheduler.running):
        engine.step()
    times = []
    for _ in range(20):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    t = median(times)
    print(f"decode step, {num_seqs} sequences, {dtype}: {t * 1000:.1f} ms ({num_seqs / t:.0f} tokens/s)")
    if profile_top:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                engine.step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=profile_top))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    gemm_throughput(getattr(torch, args.dtype))
    decode_steps(args.dtype, 1)
    decode_steps(args.dtype, 32, profile_top=8)


if __name__ == "__main__":
    main()
