"""The optimization ladder, measured in one run: each method in its own process, same dtype.

    M0  transformers forward with no KV cache: the whole sequence recomputed for every token
    M1  transformers `generate`, one request at a time
    M2  transformers `generate`, static batches of 8 (left-padded)
    E   this engine: continuous batching over the paged KV cache
    P   this engine on a shared-prefix workload, prefix caching off vs on

Workload: 32 requests of 128 prompt tokens each, exactly 128 output tokens (EOS ignored). The engine
rows see them arrive as real traffic does, a seeded Poisson process at 8 requests/s, so prefills land in
steps where others decode and contexts grow as they would; its TTFT counts from each request's arrival.
M0 and M1 serve one request at a time, so their time is linear in the count: they run the first few
requests and their tokens/s is that of the whole queue; their TTFT excludes the queueing the rest
would see. Peak memory is the process's peak RSS.

    .venv/bin/python -m bench.engine_bench [--dtypes float32 bfloat16] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time

import torch

from bench.report import median, write_section

MODEL_DIR = "models/SmolLM2-135M-Instruct"
NUM_REQUESTS = 32
PROMPT_TOKENS = 128
OUTPUT_TOKENS = 128
SEQUENTIAL_SUBSET = 3  # requests M0 / M1 run
ARRIVAL_RATE = 8.0  # requests/s for the engine rows (seeded Poisson arrivals)


def arrival_times(count: int, rate: float = ARRIVAL_RATE, seed: int = 0) -> list[float]:
    """Seconds after the start at which each request arrives: a Poisson process, the same every run."""
    import random

    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out


TEXT = (
    "Large language models are served by engines that batch requests from many users together. "
    "Each request brings a prompt, which is processed in one pass, and then produces its answer one token "
    "at a time. Keeping the attention keys and values of earlier tokens avoids recomputing them, and "
    "storing them in fixed-size blocks lets many sequences share one memory pool without fragmentation. "
)


def prompts(tokenizer, count: int) -> list[list[int]]:
    words = TEXT.split()
    out = []
    for i in range(count):
        rotated = " ".join(words[i % len(words) :] + words[: i % len(words)])
        ids = tokenizer.encode(f"Request {i}. " + rotated * 3)[:PROMPT_TOKENS]
        out.append(ids)
    return out


SINGLE_STREAM_QUESTION = "Write a short story about a robot who learns to paint, in about two hundred words."


def single_stream_prompt(tokenizer) -> list[int]:
    """A natural chat prompt for the single-stream rows (speculation gets no help from repeated text)."""
    messages = [{"role": "user", "content": SINGLE_STREAM_QUESTION}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- transformers baselines ----------------------------------------------------------------
def _hf(dtype: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=getattr(torch, dtype)).eval()
    return tokenizer, model


class _FirstTokenClock:
    """A generate() streamer that notes when the first new token arrives."""

    def __init__(self) -> None:
        self.calls, self.first = 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def _warm_up(model, ids: list[int]) -> None:
    """A few tokens first, as every engine row gets a warm-up request (first calls pick kernels)."""
    model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)


@torch.inference_mode()
def run_m0(dtype: str) -> dict:
    tokenizer, model = _hf(dtype)
    _warm_up(model, prompts(tokenizer, 1)[0][:16])
    ttfts, start, generated = [], time.perf_counter(), 0
    for ids in prompts(tokenizer, SEQUENTIAL_SUBSET)[:2]:
        t0 = time.perf_counter()
        seq = torch.tensor([ids])
        for step in range(OUTPUT_TOKENS):
            logits = model(seq, use_cache=False).logits[:, -1]
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
            if step == 0:
                ttfts.append(time.perf_counter() - t0)
        generated += OUTPUT_TOKENS
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": generated / elapsed, "ttft_s": median(ttfts), "requests": 2}


@torch.inference_mode()
def run_m1(dtype: str) -> dict:
    tokenizer, model = _hf(dtype)
    _warm_up(model, prompts(tokenizer, 1)[0][:16])
    ttfts, start, generated = [], time.perf_counter(), 0
    for ids in prompts(tokenizer, SEQUENTIAL_SUBSET):
        clock, t0 = _FirstTokenClock(), time.perf_counter()
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=OUTPUT_TOKENS,
            min_new_tokens=OUTPUT_TOKENS,
            do_sample=False,
            streamer=clock,
        )
        ttfts.append(clock.first - t0)
        generated += out.shape[1] - len(ids)
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": generated / elapsed, "ttft_s": median(ttfts), "requests": SEQUENTIAL_SUBSET}


@torch.inference_mode()
def run_m1_single(dtype: str) -> dict:
    """One stream, for the single-stream comparison (same as M1 with one request)."""
    tokenizer, model = _hf(dtype)
    ids = single_stream_prompt(tokenizer)
    _warm_up(model, ids)
    t0 = time.perf_counter()
    clock = _FirstTokenClock()
    model.generate(
        torch.tensor([ids]),
        max_new_tokens=OUTPUT_TOKENS,
        min_new_tokens=OUTPUT_TOKENS,
        do_sample=False,
        streamer=clock,
    )
    end = time.perf_counter()
    return {
        "tokens_per_s": OUTPUT_TOKENS / (end - t0),
        "decode_tokens_per_s": (OUTPUT_TOKENS - 1) / (end - clock.first),
        "ttft_s": clock.first - t0,
        "requests": 1,
    }


@torch.inference_mode()
def run_m2(dtype: str) -> dict:
    tokenizer, model = _hf(dtype)
    tokenizer.padding_side = "left"
    _warm_up(model, prompts(tokenizer, 1)[0][:16])
    batch_size, start, ttfts, generated = 8, time.perf_counter(), [], 0
    all_prompts = prompts(tokenizer, NUM_REQUESTS)
    for b in range(0, NUM_REQUESTS, batch_size):
        batch = all_prompts[b : b + batch_size]
        padded = tokenizer.pad({"input_ids": batch}, return_tensors="pt")
        clock = _FirstTokenClock()
        out = model.generate(
            **padded,
            max_new_tokens=OUTPUT_TOKENS,
            min_new_tokens=OUTPUT_TOKENS,
            do_sample=False,
            streamer=_BatchClock(clock),
        )
        ttfts += [clock.first - start] * len(batch)  # all requests arrived at `start`
        generated += (out.shape[1] - padded["input_ids"].shape[1]) * len(batch)
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": generated / elapsed, "ttft_s": median(ttfts), "requests": NUM_REQUESTS}


class _BatchClock(_FirstTokenClock):
    def __init__(self, inner: _FirstTokenClock) -> None:
        super().__init__()
        self.inner = inner

    def put(self, value) -> None:
        self.inner.put(value)


# ---- this engine ---------------------------------------------------------------------------
def _engine(
    dtype: str,
    prefix_caching: bool = True,
    speculative_tokens: int = 0,
    linear_backend: str = "auto",
    attention_backend: str = "auto",
    quantization: str = "none",  # the rungs are unquantized, but for the int8 rows (the CPU default)
):
    from worker.engine.config import EngineConfig, KVCacheConfig, SchedulerConfig
    from worker.model.build import build_async_engine

    config = EngineConfig(
        model=MODEL_DIR,
        dtype=dtype,
        quantization=quantization,
        linear_backend=linear_backend,
        attention_backend=attention_backend,
        scheduler=SchedulerConfig(
            max_num_seqs=64,
            max_num_batched_tokens=512,
            max_model_len=2048,
            num_speculative_tokens=speculative_tokens,
        ),
        kv_cache=KVCacheConfig(kv_cache_memory_gb=1.0, enable_prefix_caching=prefix_caching),
    )
    return build_async_engine(config)


async def _stream(engine, request_id: str, prompt, params, start: float, delay: float = 0.0) -> dict:
    if delay:
        await asyncio.sleep(max(0.0, start + delay - time.perf_counter()))
        start = time.perf_counter()  # TTFT counts from this request's own arrival
    first, count = None, 0
    async for out in engine.generate(request_id, prompt, params):
        if first is None and out.token_ids:
            first = time.perf_counter()
        count += len(out.token_ids)
    return {"ttft": first - start, "tokens": count, "end": time.perf_counter()}


def run_engine(
    dtype: str,
    concurrency: int = NUM_REQUESTS,
    speculative_tokens: int = 0,
    linear_backend: str = "auto",
    attention_backend: str = "auto",
    quantization: str = "none",
) -> dict:
    from worker.engine.outputs import PromptInput
    from worker.engine.sampling_params import SamplingParams

    engine = _engine(
        dtype,
        quantization=quantization,
        speculative_tokens=speculative_tokens,
        linear_backend=linear_backend,
        attention_backend=attention_backend,
    )
    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)

    async def main() -> dict:
        await engine.start()
        tokenizer = engine.engine.tokenizer
        all_prompts = (
            [single_stream_prompt(tokenizer)] if concurrency == 1 else prompts(tokenizer, concurrency)
        )
        await _stream(
            engine,
            "warm-up",
            PromptInput(token_ids=all_prompts[0][:16]),
            SamplingParams(max_tokens=4),
            time.perf_counter(),
        )
        start = time.perf_counter()
        arrivals = arrival_times(len(all_prompts))
        results = await asyncio.gather(
            *[
                _stream(engine, f"r{i}", PromptInput(token_ids=p), params, start, arrivals[i])
                for i, p in enumerate(all_prompts)
            ]
        )
        elapsed = max(r["end"] for r in results) - start
        await engine.shutdown()
        tokens = sum(r["tokens"] for r in results)
        out = {
            "tokens_per_s": tokens / elapsed,
            "ttft_s": median([r["ttft"] for r in results]),
            "requests": concurrency,
        }
        if concurrency == 1:
            out["decode_tokens_per_s"] = (tokens - 1) / (results[0]["end"] - start - results[0]["ttft"])
        return out

    return asyncio.run(main())


def run_engine_single(dtype: str) -> dict:
    return run_engine(dtype, concurrency=1)


def run_engine_single_spec(dtype: str) -> dict:
    return run_engine(dtype, concurrency=1, speculative_tokens=4)


def run_prefix(dtype: str, prefix_caching: bool) -> dict:
    """A 1024-token shared document, then 16 different questions about it, arriving one after another."""
    from worker.engine.outputs import PromptInput
    from worker.engine.sampling_params import SamplingParams

    engine = _engine(dtype, prefix_caching)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)

    async def main() -> dict:
        await engine.start()
        tokenizer = engine.engine.tokenizer
        document = tokenizer.encode(TEXT * 40)[:1024]
        questions = [
            tokenizer.encode(f" Question {i}: what does paragraph {i} say about memory?") for i in range(17)
        ]
        ttfts = []
        for i, question in enumerate(questions):
            start = time.perf_counter()
            result = await _stream(engine, f"q{i}", PromptInput(token_ids=document + question), params, start)
            if i:  # the first request fills the cache for the others
                ttfts.append(result["ttft"])
        await engine.shutdown()
        stats = engine.stats()
        return {
            "ttft_s": median(ttfts),
            "requests": len(ttfts),
            "prefix_hit_rate": stats.prefix_cache_hit_rate,
        }

    return asyncio.run(main())


METHODS = {
    "m0": run_m0,
    "m1": run_m1,
    "m1_single": run_m1_single,
    "m2": run_m2,
    "engine_plain_linear": lambda dtype: run_engine(dtype, linear_backend="torch"),
    "engine_torch_kernels": lambda dtype: run_engine(dtype, attention_backend="torch"),
    "engine": run_engine,
    "engine_int8": lambda dtype: run_engine(dtype, quantization="int8"),
    "engine_single_plain_linear": lambda dtype: run_engine(dtype, concurrency=1, linear_backend="torch"),
    "engine_single": run_engine_single,
    "engine_single_spec": run_engine_single_spec,
    "engine_single_int8": lambda dtype: run_engine(dtype, concurrency=1, quantization="int8"),
    "prefix_off": lambda dtype: run_prefix(dtype, False),
    "prefix_on": lambda dtype: run_prefix(dtype, True),
}


def run_child(method: str, dtype: str) -> dict:
    """Each measurement in a fresh process, so peak memory and warm caches are its own."""
    cmd = [sys.executable, "-m", "bench.engine_bench", "--child", method, "--dtypes", dtype]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def render(results: dict[str, dict[str, dict]], command: str) -> str:
    lines = [
        "## Engine: the optimization ladder",
        "",
        f"Command: `{command}` (2-core CPU, torch {torch.__version__}, {torch.get_num_threads()} threads). "
        f"Workload: {NUM_REQUESTS} requests, {PROMPT_TOKENS} prompt tokens, exactly {OUTPUT_TOKENS} output "
        f"tokens each; the engine rows get them as seeded Poisson arrivals at {ARRIVAL_RATE:.0f} requests/s "
        "(TTFT from each arrival), the transformers rows one batch or one request at a time. "
        "Each method runs "
        "in its own process, one after another, each after a warm-up request.",
        "",
    ]
    for dtype, r in results.items():
        m1 = r["m1"]["tokens_per_s"]
        lines += [
            f"### {dtype}",
            "",
            "| method | requests run | output tokens/s | × M1 | median TTFT (s) | peak RSS (MB) |",
            "|---|---|---|---|---|---|",
        ]
        names = {
            "m0": "M0 no KV cache, one at a time",
            "m1": "M1 transformers generate, one at a time",
            "m2": "M2 transformers generate, static batches of 8",
            "engine_plain_linear": "this engine, 32 arriving, plain F.linear (MKL) weights",
            "engine_torch_kernels": "this engine, 32 arriving, prepacked weights, torch attention/norm ops",
            "engine": "this engine, 32 arriving (prepacked weights, native kernels)",
            "engine_int8": "this engine, 32 arriving, int8 weights (the CPU default)",
            "m1_single": "M1 single stream",
            "engine_single_plain_linear": "this engine, single stream, plain F.linear (MKL) weights",
            "engine_single": "this engine, single stream (prepacked)",
            "engine_single_spec": "this engine, single stream, n-gram speculation (4 drafts)",
            "engine_single_int8": "this engine, single stream, int8 weights (the CPU default)",
        }
        for key, name in names.items():
            if key not in r:
                continue
            x = r[key]
            lines.append(
                f"| {name} | {x['requests']} | {x['tokens_per_s']:.1f} | {x['tokens_per_s'] / m1:.2f} | "
                f"{x['ttft_s']:.3f} | {x['peak_rss_mb']:.0f} |"
            )
        m1_decode = r["m1_single"]["decode_tokens_per_s"]
        single_ratio = r["engine_single"]["decode_tokens_per_s"] / m1_decode
        spec_ratio = r["engine_single_spec"]["decode_tokens_per_s"] / m1_decode
        off, on = r["prefix_off"]["ttft_s"], r["prefix_on"]["ttft_s"]
        plain = r.get("engine_plain_linear", {}).get("tokens_per_s")
        torch_kernels = r.get("engine_torch_kernels", {}).get("tokens_per_s")
        plain_single = r.get("engine_single_plain_linear", {}).get("decode_tokens_per_s")
        int8_single = r.get("engine_single_int8", {}).get("decode_tokens_per_s")
        lines += [
            "",
            f"- 32 arriving vs M1: **{r['engine']['tokens_per_s'] / m1:.1f}×** (target ≥ 10×)"
            + (f"; {plain / m1:.1f}× with plain F.linear weights" if plain else "")
            + (
                f"; the native kernels give {r['engine']['tokens_per_s'] / torch_kernels:.2f}× "
                "the torch-ops engine."
                if torch_kernels
                else "."
            ),
            f"- Single-stream decode: engine {r['engine_single']['decode_tokens_per_s']:.1f} tokens/s vs M1 "
            f"{m1_decode:.1f}: **{single_ratio:.2f}×**; with n-gram speculation "
            f"{r['engine_single_spec']['decode_tokens_per_s']:.1f} tokens/s: **{spec_ratio:.2f}×** "
            "(target ≥ 1.5×; greedy equality with transformers is checked by the test suite, not here)."
            + (f" Plain F.linear weights: {plain_single / m1_decode:.2f}×." if plain_single else "")
            + (
                f" int8 weights (the CPU default): {int8_single:.1f} tokens/s, "
                f"{int8_single / m1_decode:.2f}×."
                if int8_single
                else ""
            ),
            f"- Shared-prefix workload (1024-token document + a question, 16 requests one after another): "
            f"median TTFT {off * 1000:.0f} ms without prefix caching, {on * 1000:.0f} ms with it: "
            f"**{on / off:.2f}** of it "
            f"(target ≤ 0.33; hit rate {r['prefix_on']['prefix_hit_rate']:.0%}).",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if args.child:
        result = METHODS[args.child](args.dtypes[0])
        result["peak_rss_mb"] = peak_rss_mb()
        print(json.dumps(result))
        return
    results: dict[str, dict[str, dict]] = {}
    for dtype in args.dtypes:
        for method in args.methods:
            result = run_child(method, dtype)
            results.setdefault(dtype, {})[method] = result
            print(f"{dtype:9s} {method:14s} {json.dumps(result)}", flush=True)
    if args.write_docs:
        write_section("engine", render(results, "make bench  # = python -m bench.engine_bench --write-docs"))


if __name__ == "__main__":
    main()
