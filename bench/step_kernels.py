"""Which kernels a 32-sequence decode step and a prefill chunk (fresh, or over a shared prefix) run on this
CPU.

    .venv/bin/python -m bench.step_kernels [--dtype auto] [--quantization auto] [--num-seqs 32]
                                           [--steps 3] [--phases decode prefix prefill] [--top 15]
                                           [--json PATH]

Per phase: the top operators of a torch profile (self CPU time), and oneDNN's verbose log of one step
summed by primitive, implementation and data types. The implementation names the instructions oneDNN chose
(`brg:avx512_core_amx` is AMX tiles, `brg:avx512_core_bf16` AVX512-BF16, `gemm:jit` float32, `ref` no
JIT at all), which is what to read first when a kind of CPU is slower than expected. Phases:
  decode  `--num-seqs` sequences of 128 prompt tokens each, all decoding (the profiled steps decode only)
  prefix  requests of one shared 512-token prefix + 32 own tokens, each prefilled alone to its first token:
          the unprofiled first one misses the prefix cache, the profiled ones hit it (bench.peer_bench's
          shared-prefix run, one request at a time)
  prefill requests of 512 new tokens each (no two alike, so none hits the prefix cache), each prefilled
          alone to its first token: one full chunk of the default step budget, the linears at their most
          rows
Figures are from one short run: for where the time goes, not for how much (bench.peer_bench measures).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from worker.engine.config import EngineConfig, KVCacheConfig, SchedulerConfig
from worker.engine.outputs import PromptInput
from worker.engine.sampling_params import SamplingParams
from worker.model.build import build_engine
from worker.model.cpu_kind import cpu_info

PROMPT_TOKENS = 128
PREFIX_TOKENS, OWN_TOKENS = 512, 32


@contextmanager
def captured_stdout_fd():
    """Everything written to file descriptor 1 (oneDNN prints its verbose log from C), as a list of lines
    filled when the block ends."""
    lines: list[str] = []
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield lines
        finally:
            ctypes.CDLL(None).fflush(None)  # C stdio buffers, before the descriptor goes back
            os.dup2(saved, 1)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode(errors="replace").splitlines())


def parse_onednn_verbose(lines: list[str]) -> list[dict]:
    """oneDNN's `exec` lines as (primitive, implementation, data types, ms). The log's layout:
    onednn_verbose[,v1][,primitive],exec,cpu,<primitive>,<implementation>,<propagation>,<memory
    descriptors>,<attributes>,<auxiliary>,<problem>,<ms>."""
    out = []
    for line in lines:
        fields = line.split(",")
        if not fields[0].startswith(("onednn_verbose", "dnnl_verbose")) or "exec" not in fields:
            continue
        i = fields.index("exec")
        if len(fields) < i + 6:
            continue
        dtypes = sorted({part.split("::")[0] for part in fields[i + 5].split() if "::" in part})
        try:
            ms = float(fields[-1])
        except ValueError:
            ms = 0.0
        out.append({"primitive": fields[i + 2], "impl": fields[i + 3], "dtypes": " ".join(dtypes), "ms": ms})
    return out


def summarize_onednn(calls: list[dict]) -> list[dict]:
    groups: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for call in calls:
        groups[(call["primitive"], call["impl"], call["dtypes"])].append(call["ms"])
    rows = [
        {"primitive": p, "impl": i, "dtypes": d, "calls": len(ms), "total_ms": sum(ms)}
        for (p, i, d), ms in groups.items()
    ]
    return sorted(rows, key=lambda r: -r["total_ms"])


def onednn_calls(step: Callable[[], object]) -> list[dict]:
    """One step under oneDNN's verbose mode (torch's switch: the same log as ONEDNN_VERBOSE=1)."""
    with captured_stdout_fd() as lines, torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        step()
    return parse_onednn_verbose(lines)


def torch_profile(step: Callable[[], object], steps: int, top: int) -> list[dict]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    averages = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    return [
        {"op": e.key, "calls": e.count, "self_ms_per_step": e.self_cpu_time_total / 1000 / steps}
        for e in averages
    ]


def build(args: argparse.Namespace):
    config = EngineConfig(
        dtype=args.dtype,
        quantization=args.quantization,
        scheduler=SchedulerConfig(max_num_seqs=max(args.num_seqs, 8)),
        kv_cache=KVCacheConfig(kv_cache_memory_gb=0.5),
    )
    return build_engine(config)


def add(engine, name: str, token_ids: list[int], max_tokens: int = 64) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    engine.add(engine.make_requests(name, PromptInput(token_ids=token_ids), params))


def decode_phase(engine, num_seqs: int) -> Callable[[], object]:
    """Fill `num_seqs` sequences and prefill them all; the returned step then decodes every one."""
    for i in range(num_seqs):
        add(engine, f"d{i}", [(i * 7 + j) % 40000 + 100 for j in range(PROMPT_TOKENS)], max_tokens=512)
    while engine.scheduler.waiting or any(r.num_output_tokens == 0 for r in engine.scheduler.running):
        engine.step()
    engine.step()  # warm
    return engine.step


def prefix_phase(engine) -> Callable[[], object]:
    """A step that serves one request of the shared 512-token prefix and its own 32 tokens to its first
    token (the prefill chunks, and nothing else, in the batch)."""
    prefix = [(j * 13) % 40000 + 100 for j in range(PREFIX_TOKENS)]
    served = 0

    def step() -> None:
        nonlocal served
        own = [(served * 31 + j) % 40000 + 100 for j in range(OWN_TOKENS)]
        add(engine, f"p{served}", prefix + own, max_tokens=1)
        served += 1
        while engine.has_unfinished():
            engine.step()

    return step


def prefill_phase(engine) -> Callable[[], object]:
    """A step that serves one request of 512 tokens no earlier request had to its first token (a whole
    prefill chunk at the default budget of 512 tokens, and nothing else in the batch)."""
    served = 0

    def step() -> None:
        nonlocal served
        add(engine, f"f{served}", [(served * 7919 + j * 13) % 40000 + 100 for j in range(PREFIX_TOKENS)], 1)
        served += 1
        while engine.has_unfinished():
            engine.step()

    return step


PHASES = {"decode": None, "prefix": prefix_phase, "prefill": prefill_phase}  # decode takes --num-seqs


def run_phase(name: str, step: Callable[[], object], args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    step()
    one_step_ms = (time.perf_counter() - started) * 1000
    ops = torch_profile(step, args.steps, args.top)
    onednn = summarize_onednn(onednn_calls(step))
    return {"phase": name, "one_step_ms": one_step_ms, "torch_ops": ops, "onednn": onednn}


def report(result: dict) -> str:
    lines = [
        f"[{result['phase']}] the first step, unprofiled: {result['one_step_ms']:.1f} ms",
        "",
        "torch ops:",
    ]
    lines += [
        f"  {o['self_ms_per_step']:8.2f} ms/step  {o['calls']:6d} calls  {o['op']}"
        for o in result["torch_ops"]
    ]
    lines += [
        f"prefix cache over the phase: {result['prefix_cache_hit_tokens']} of "
        f"{result['prefix_cache_query_tokens']} prompt tokens hit",
        "",
        "oneDNN primitives (one step):",
    ]
    if not result["onednn"]:
        lines.append("  none logged (no oneDNN primitive ran, or this torch has no verbose mode)")
    lines += [
        f"  {r['total_ms']:8.2f} ms  {r['calls']:5d} calls  {r['primitive']:14s} {r['impl']:26s} "
        f"{r['dtypes']}"
        for r in result["onednn"]
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--quantization", default="auto", choices=["auto", "none", "int8", "int4", "w8a8"])
    parser.add_argument("--num-seqs", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="profiled steps per phase")
    parser.add_argument("--phases", nargs="+", default=["decode", "prefix"], choices=list(PHASES))
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    cpu = cpu_info()
    engine = build(args)
    info = engine.model_info
    print(
        f"CPU: {cpu.describe()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads, capability {torch.backends.cpu.get_cpu_capability()}); "
        f"engine: {info.dtype}, quantization {info.quantization}\n",
        flush=True,
    )
    results = []
    for phase in args.phases:
        step = decode_phase(engine, args.num_seqs) if phase == "decode" else PHASES[phase](engine)
        before = engine.stats()
        results.append(run_phase(phase, step, args))
        after = engine.stats()
        results[-1]["prefix_cache_hit_tokens"] = after.prefix_cache_hits - before.prefix_cache_hits
        results[-1]["prefix_cache_query_tokens"] = after.prefix_cache_queries - before.prefix_cache_queries
        print(report(results[-1]) + "\n", flush=True)
        for group in list(engine.groups):  # the next phase starts with an empty batch
            engine.abort(group)
    if args.json:
        summary = {"cpu": cpu.as_dict(), "dtype": info.dtype, "quantization": info.quantization}
        args.json.write_text(json.dumps(summary | {"phases": results}, indent=1))


if __name__ == "__main__":
    main()
