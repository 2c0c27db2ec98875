"""Where a decode step's time goes: matmul throughput of this CPU and a profiled engine step.

    .venv/bin/python -m studies.engine_profile [--dtype float32] [--quantization int8]

Prints GEMM throughput at 1, 32 and 512 rows (F.linear and weights prepacked for oneDNN), the bandwidth
of one-row products over all the model's weights (plain, transposed, prepacked) against a plain read, the
median decode step of 1 and 32 sequences (128-token prompts) with either linear backend, the top
operators of a profiled 32-sequence step, and a single-sequence step run on a thread other than the one
that built the engine. With --quantization (int8, int4 or w8a8), only the decode steps of 1 and 32
sequences and the profile of the latter: where a quantized step's time goes next to an unquantized one's.
"""

from __future__ import annotations

import argparse
import threading
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from bench.report import median
from common.linear import Linear
from worker.engine.config import EngineConfig, KVCacheConfig
from worker.engine.outputs import PromptInput
from worker.engine.sampling_params import SamplingParams
from worker.model.build import build_engine


def gemm_throughput(dtype: torch.dtype) -> None:
    weight = torch.randn(3072, 576, dtype=dtype)
    packed = Linear(weight, backend="onednn")
    for rows in (1, 32, 512):
        x = torch.randn(rows, 576, dtype=dtype)
        for name, fn in (("F.linear", lambda x=x: F.linear(x, weight)), ("prepacked", lambda x=x: packed(x))):
            fn()
            times = []
            for _ in range(30):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            t = median(times)
            print(f"GEMM {dtype} rows={rows:4d} {name:9s}: {2 * rows * 576 * 3072 / t / 1e9:7.1f} GFLOP/s")


def _timed(fn, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return median(times)


def weight_bandwidth(dtype: torch.dtype) -> None:
    """One-row products over weights of the model's size: [out, in] (F.linear) vs [in, out] layout."""
    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
    weights = [torch.randn(shape, dtype=dtype) for shape in shapes]
    transposed = [w.t().contiguous() for w in weights]
    packed = [Linear(w, backend="onednn") for w in weights]
    inputs = {n: torch.randn(1, n, dtype=dtype) for n in (576, 1536)}
    size = sum(w.numel() * w.element_size() for w in weights)
    flat = torch.cat([w.flatten() for w in weights])
    for name, fn in [
        ("F.linear, [out, in]", lambda: [F.linear(inputs[w.shape[1]], w) for w in weights]),
        ("x @ W, [in, out]", lambda: [inputs[w.shape[0]] @ w for w in transposed]),
        ("prepacked for oneDNN", lambda: [p(inputs[p.in_features]) for p in packed]),
        ("plain read (sum)", lambda: flat.sum()),
    ]:
        fn()
        print(f"{dtype} {size / 2**20:.0f} MiB of weights, {name}: {size / _timed(fn) / 1e9:5.1f} GB/s")


def _build(dtype: str, linear_backend: str = "auto", quantization: str = "none"):
    config = EngineConfig(
        dtype=dtype,
        quantization=quantization,
        linear_backend=linear_backend,
        kv_cache=KVCacheConfig(kv_cache_memory_gb=0.5),
    )
    return build_engine(config)


def decode_steps(
    dtype: str,
    num_seqs: int,
    profile_top: int = 0,
    engine=None,
    linear_backend: str = "auto",
    quantization: str = "none",
):
    engine = engine or _build(dtype, linear_backend, quantization)
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
    where = threading.current_thread().name
    print(
        f"decode step, {num_seqs} sequences, {dtype}, {engine.runner.model.linear_backend} linear, "
        f"{quantization} weights, {where}: "
        f"{t * 1000:.1f} ms ({num_seqs / t:.0f} tokens/s)"
    )
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
    parser.add_argument("--quantization", default="none", choices=["none", "int8", "int4", "w8a8"])
    args = parser.parse_args()
    if args.quantization != "none":
        decode_steps(args.dtype, 1, quantization=args.quantization)
        decode_steps(args.dtype, 32, profile_top=8, quantization=args.quantization)
        return
    gemm_throughput(getattr(torch, args.dtype))
    weight_bandwidth(getattr(torch, args.dtype))
    for backend in ("torch", "onednn"):
        decode_steps(args.dtype, 1, linear_backend=backend)
        decode_steps(args.dtype, 32, profile_top=8, linear_backend=backend)
    built_here = _build(args.dtype)
    other = threading.Thread(target=decode_steps, args=(args.dtype, 1, 0, built_here), name="other-thread")
    other.start()
    other.join()


if __name__ == "__main__":
    main()
