"""The engine on a CUDA GPU, in one run: correctness against transformers on that GPU, then speed.

    python -m studies.cuda_check --out DIR         # on the GPU machine: writes DIR/cuda_check.json
    python -m studies.cuda_check --render FILE [--write-docs]   # the docs section from that JSON

Stages, each guarded so that one failure does not lose the others (the JSON is rewritten after each):
  logits   the paged forward (scheduler + runner, chunked prefill, batched decode) against transformers'
           full-sequence forward on the same GPU, float32 and bfloat16
  greedy   eight chat requests arriving staggered through the async engine against transformers'
           `generate` on the same GPU, token for token (float32), and the share that agree in bfloat16
  speed    transformers `generate` (one stream; static batches of 32) and this engine with a closed loop of
           C concurrent streams (C = 1..256), 128-token prompts, exactly 128 output tokens
  profile  20 decode steps at 64 streams under torch.profiler: host time against GPU kernel time per step
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import traceback
from pathlib import Path

MODEL_DIR = "models/SmolLM2-135M-Instruct"
PROMPT_TOKENS = 128
OUTPUT_TOKENS = 128
CONCURRENCY = (1, 8, 32, 64, 128, 256)
DEVICE = "cuda"  # --device cpu runs the same stages here, small, as a smoke test of this script
QUESTIONS = [
    "Hi!",
    "What is the capital of France?",
    "Name three primary colors.",
    "Explain in one sentence why the sky is blue.",
    "Write a haiku about autumn leaves falling on a quiet river at dusk.",
    "Translate 'good morning' into Spanish.",
    "I have a list of numbers: 4, 8, 15, 16, 23, 42. What is their sum, and which of them are even?",
    "Give me a short tip for learning to play the guitar as an adult beginner with little free time.",
]


def sync() -> None:
    import torch

    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def free_cache() -> None:
    import torch

    if DEVICE.startswith("cuda"):
        torch.cuda.empty_cache()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def engine_config(dtype: str, max_num_seqs: int = 256, prefix_caching: bool = True, eager: bool = False):
    from worker.engine.config import EngineConfig, KVCacheConfig, SchedulerConfig

    return EngineConfig(
        model=MODEL_DIR,
        device=DEVICE,
        dtype=dtype,
        quantization="none",
        enforce_eager=eager,
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=2048, max_model_len=2048),
        kv_cache=KVCacheConfig(
            kv_cache_memory_gb=8.0 if DEVICE.startswith("cuda") else 0.5, enable_prefix_caching=prefix_caching
        ),
    )


def hf_model(dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=getattr(torch, dtype))
    return model.to(DEVICE).eval()


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL_DIR)


def chat_ids(tok, question: str) -> list[int]:
    text = tok.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tok.encode(text, add_special_tokens=False)


def bench_prompts(tok, count: int) -> list[list[int]]:
    """The engine ladder's prompts (PROMPT_TOKENS each), so the GPU rows read like the CPU ones."""
    from bench.engine_bench import prompts

    return prompts(tok, count)


# ---- logits ------------------------------------------------------------------------------------
def stage_logits() -> dict:
    """Greedy-decode five prompts together through scheduler + runner on the GPU; every logit row the
    runner computed is compared with transformers' forward over the whole final sequence."""
    import torch

    from bench.engine_bench import TEXT
    from worker.engine.block_manager import BlockManager
    from worker.engine.config import SchedulerConfig
    from worker.engine.request import Request
    from worker.engine.sampling_params import SamplingParams
    from worker.engine.scheduler import Scheduler
    from worker.model.model import LlamaForPagedAttention
    from worker.model.runner import ModelRunner

    tok = tokenizer()
    base = tok.encode(TEXT * 4)
    results = {}
    graphs = "capture" if DEVICE.startswith("cuda") else "eager"
    for dtype, mode in (("float32", "off"), ("float32", graphs), ("bfloat16", "off"), ("bfloat16", graphs)):
        hf = hf_model(dtype)
        paged = LlamaForPagedAttention(hf, 2048)
        runner = ModelRunner(paged, 256, 16, "auto", decode_graphs=mode, max_num_seqs=8, max_model_len=2048)
        scheduler = Scheduler(
            SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=2048),
            BlockManager(256, 16, True),
        )
        requests = []
        for i, n in enumerate((1, 7, 23, 64, 200)):
            params = SamplingParams(temperature=0.0, max_tokens=8)
            requests.append(Request(f"r{i}", base[i : i + n], params, eos_token_id=None, max_tokens=8))
            scheduler.add_request(requests[-1])
        rows: dict[str, dict[int, torch.Tensor]] = {r.request_id: {} for r in requests}
        with torch.inference_mode():
            while scheduler.num_unfinished:
                plan = scheduler.schedule()
                items, logits = runner.all_logits(plan)
                row, sampled = 0, {}
                for item in items:
                    chunk = logits[row : row + item.num_new_tokens].float()
                    for offset in range(item.num_new_tokens):
                        rows[item.request.request_id][item.start + offset] = chunk[offset]
                    if item.samples:
                        sampled[item.request.request_id] = int(chunk[-1].argmax())
                    row += item.num_new_tokens
                scheduler.update_from_output(plan, sampled)
            max_abs, scale, top1_same, total = 0.0, 0.0, 0, 0
            for r in requests:
                expected = hf(torch.tensor([r.all_token_ids], device=DEVICE)).logits[0].float()
                positions = sorted(rows[r.request_id])
                got = torch.stack([rows[r.request_id][p] for p in positions])
                want = expected[positions]
                max_abs = max(max_abs, float((got - want).abs().max()))
                scale = max(scale, float(want.abs().max()))
                top1_same += int((got.argmax(-1) == want.argmax(-1)).sum())
                total += len(positions)
        results[f"{dtype}/{mode}"] = {
            "max_abs_diff": max_abs,
            "max_abs_logit": scale,
            "top1_agreement": top1_same / total,
            "rows_compared": total,
            "blocks_left": scheduler.block_manager.num_used_blocks,
        }
        del hf, paged, runner
        free_cache()
    return results


# ---- greedy ------------------------------------------------------------------------------------
def stage_greedy() -> dict:
    import torch

    from worker.engine.outputs import PromptInput
    from worker.engine.sampling_params import SamplingParams
    from worker.engine.speculative import num_accepted  # the length of the common prefix of two token lists
    from worker.model.build import build_async_engine

    max_new = 48
    tok = tokenizer()
    results = {}
    for dtype in ("float32", "bfloat16"):
        hf = hf_model(dtype)
        expected = []
        with torch.inference_mode():
            for q in QUESTIONS:
                ids = torch.tensor([chat_ids(tok, q)], device=DEVICE)
                out = hf.generate(ids, max_new_tokens=max_new, do_sample=False)
                expected.append(out[0, ids.shape[1] :].tolist())
        del hf
        engine = build_async_engine(engine_config(dtype, max_num_seqs=16))

        async def scenario(engine=engine) -> list[list[int]]:
            await engine.start()
            params = SamplingParams(temperature=0.0, max_tokens=max_new)

            async def one(i: int, q: str) -> list[int]:
                await asyncio.sleep(0.02 * (i % 4))
                prompt = PromptInput(messages=[{"role": "user", "content": q}])
                return [t async for o in engine.generate(f"g{i}", prompt, params) for t in o.token_ids]

            got = await asyncio.gather(*[one(i, q) for i, q in enumerate(QUESTIONS)])
            stats = engine.stats()
            await engine.shutdown()
            return got, stats.num_kv_blocks_used

        got, blocks_left = asyncio.run(scenario())
        same = sum(g == e for g, e in zip(got, expected, strict=True))
        prefix = [num_accepted(g, e) / max(1, len(e)) for g, e in zip(got, expected, strict=True)]
        results[dtype] = {
            "identical": same,
            "requests": len(QUESTIONS),
            "mean_share_before_first_difference": sum(prefix) / len(prefix),
            "blocks_left": blocks_left,
        }
        free_cache()
    return results


# ---- speed -------------------------------------------------------------------------------------
def hf_speed(dtype: str) -> dict:
    import torch

    tok = tokenizer()
    hf = hf_model(dtype)
    out = {}
    with torch.inference_mode():
        ids = torch.tensor(
            [chat_ids(tok, "Write a short story about a robot who learns to paint.")], device=DEVICE
        )
        hf.generate(ids, max_new_tokens=8, do_sample=False)
        sync()
        t0 = time.perf_counter()
        hf.generate(ids, max_new_tokens=OUTPUT_TOKENS, min_new_tokens=OUTPUT_TOKENS, do_sample=False)
        sync()
        out["single_tokens_per_s"] = OUTPUT_TOKENS / (time.perf_counter() - t0)
        tok.padding_side = "left"
        batch = tok.pad({"input_ids": bench_prompts(tok, 32)}, return_tensors="pt").to(DEVICE)
        hf.generate(**batch, max_new_tokens=4, do_sample=False)
        sync()
        t0 = time.perf_counter()
        gen = hf.generate(
            **batch, max_new_tokens=OUTPUT_TOKENS, min_new_tokens=OUTPUT_TOKENS, do_sample=False
        )
        sync()
        new = (gen.shape[1] - batch["input_ids"].shape[1]) * gen.shape[0]
        out["batch32_tokens_per_s"] = new / (time.perf_counter() - t0)
    del hf
    free_cache()
    return out


def engine_speed(dtype: str, eager: bool = False) -> dict:
    """A closed loop per concurrency C: C streams at a time, 2C requests (at least 8), each as soon as
    a slot frees, as `vllm bench serve --max-concurrency C` drives a server."""
    import torch

    from worker.engine.outputs import PromptInput
    from worker.engine.sampling_params import SamplingParams
    from worker.model.build import build_async_engine

    engine = build_async_engine(engine_config(dtype, eager=eager))
    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    rows = {}
    if DEVICE.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()

    async def main() -> None:
        await engine.start()
        tok = engine.engine.tokenizer
        warm = [
            t async for t in engine.generate("warm", PromptInput(token_ids=bench_prompts(tok, 1)[0]), params)
        ]
        assert warm
        for c in CONCURRENCY:
            prompts = bench_prompts(tok, max(8, 2 * c))
            slots = asyncio.Semaphore(c)
            records = []

            async def one(i: int, ids: list[int], c=c, slots=slots, records=records) -> None:
                async with slots:
                    t0 = time.perf_counter()
                    first, n = None, 0
                    async for o in engine.generate(f"c{c}-{i}", PromptInput(token_ids=ids), params):
                        if first is None and o.token_ids:
                            first = time.perf_counter()
                        n += len(o.token_ids)
                    end = time.perf_counter()
                    records.append({"ttft": first - t0, "tpot": (end - first) / max(1, n - 1), "n": n})

            start = time.perf_counter()
            await asyncio.gather(*[one(i, p) for i, p in enumerate(prompts)])
            elapsed = time.perf_counter() - start
            rows[str(c)] = {
                "requests": len(prompts),
                "tokens_per_s": sum(r["n"] for r in records) / elapsed,
                "ttft_p50_ms": 1000 * percentile([r["ttft"] for r in records], 0.5),
                "ttft_p99_ms": 1000 * percentile([r["ttft"] for r in records], 0.99),
                "tpot_p50_ms": 1000 * percentile([r["tpot"] for r in records], 0.5),
            }
            print(f"  {dtype} eager={eager} c={c}: {json.dumps(rows[str(c)])}", flush=True)
        stats = engine.stats()
        rows["blocks_left"] = stats.num_kv_blocks_used
        await engine.shutdown()

    asyncio.run(main())
    on_gpu = DEVICE.startswith("cuda")
    rows["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else 0.0
    free_cache()
    return rows


def stage_speed(dtype: str, eager_too: bool) -> dict:
    out = {"transformers": hf_speed(dtype), "engine": engine_speed(dtype)}
    if eager_too:
        out["engine_eager"] = engine_speed(dtype, eager=True)
    return out


# ---- profile -----------------------------------------------------------------------------------
def stage_profile(dtype: str = "bfloat16", streams: int = 64, steps: int = 20, eager: bool = False) -> dict:
    """Host wall time of an engine step against the GPU time of the kernels it launched: a step whose
    kernels take far less than its wall time is bound by the host (Python, launches), not the GPU."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from worker.engine.outputs import PromptInput
    from worker.engine.sampling_params import SamplingParams
    from worker.model.build import build_engine

    engine = build_engine(engine_config(dtype, eager=eager))
    tok = engine.tokenizer
    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    for i, ids in enumerate(bench_prompts(tok, streams)):
        engine.add(engine.make_requests(f"p{i}", PromptInput(token_ids=ids), params))
    for _ in range(10):  # every prompt prefilled, decoding from here
        engine.step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync()
    wall_ms = 1000 * (time.perf_counter() - t0) / steps
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step()
        sync()
    kernels = [e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    gpu_us = sum(
        e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total for e in kernels
    )
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    return {
        "streams": streams,
        "dtype": dtype,
        "eager": eager,
        "step_wall_ms": wall_ms,
        "gpu_kernel_ms_per_step": gpu_us / 1000 / steps,
        "kernels_per_step": len(kernels) / steps,
        "top_host_ops": table,
    }


# ---- quantization ------------------------------------------------------------------------------
def stage_quantization() -> dict:
    """WORKER_QUANTIZATION=int8 / int4 on this device: served (a few greedy tokens), or refused when the
    engine starts, with the error it gives. The model has SmolLM2's shapes and random weights (only the
    config and tokenizer are read from MODEL_DIR), so this stage needs no weights on the machine."""
    import shutil
    import tempfile

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from worker.engine.config import EngineConfig, KVCacheConfig, SchedulerConfig
    from worker.engine.outputs import PromptInput
    from worker.engine.sampling_params import SamplingParams
    from worker.model.build import build_engine

    directory = tempfile.mkdtemp()
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(MODEL_DIR)).save_pretrained(directory)
    for name in os.listdir(MODEL_DIR):
        if name.startswith(("tokenizer", "generation_config", "chat_template")):
            shutil.copy(os.path.join(MODEL_DIR, name), directory)
    results = {}
    for quantization in ("none", "int8", "int4"):
        try:
            engine = build_engine(
                EngineConfig(
                    model=directory,
                    device=DEVICE,
                    dtype="bfloat16",
                    quantization=quantization,
                    scheduler=SchedulerConfig(max_num_seqs=8, max_model_len=512),
                    kv_cache=KVCacheConfig(num_blocks=64),
                )
            )
            params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
            for i in range(4):
                prompt = PromptInput(token_ids=list(range(10 + i, 40)))
                engine.add(engine.make_requests(f"q{i}", prompt, params))
            steps = 0
            while engine.has_unfinished() and steps < 100:
                engine.step()
                steps += 1
            results[quantization] = {"served": not engine.has_unfinished(), "steps": steps}
        except Exception as exc:  # noqa: BLE001 - the refusal itself is the result
            results[quantization] = {"served": False, "error": f"{type(exc).__name__}: {exc}"[:600]}
        free_cache()
    shutil.rmtree(directory, ignore_errors=True)
    return results


# ---- driver ------------------------------------------------------------------------------------
def run_all(out_dir: Path, only: list[str] | None = None) -> None:
    import torch
    import transformers

    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "env": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name(0) if DEVICE.startswith("cuda") else "cpu",
            "cuda": torch.version.cuda,
        }
    }
    stages = [
        ("logits", stage_logits),
        ("greedy", stage_greedy),
        ("speed_bfloat16", lambda: stage_speed("bfloat16", eager_too=True)),
        ("profile", stage_profile),
        ("profile_eager", lambda: stage_profile(eager=True)),
        ("speed_float32", lambda: stage_speed("float32", eager_too=False)),
        ("quantization", stage_quantization),
    ]
    for name, fn in stages:
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        print(f"[cuda_check] {name} ...", flush=True)
        try:
            result[name] = fn()
        except Exception:  # noqa: BLE001 - a failed stage is recorded and the others still run
            result[name] = {"error": traceback.format_exc()}
            print(result[name]["error"], flush=True)
        result.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
        (out_dir / "cuda_check.json").write_text(json.dumps(result, indent=1))
        summary = {k: v for k, v in result[name].items() if k != "top_host_ops"}
        print(
            f"[cuda_check] {name} done in {result['seconds'][name]} s: {json.dumps(summary)[:1500]}",
            flush=True,
        )


def render(result: dict) -> list[str]:
    env = result["env"]
    lines = [
        "## Engine on a CUDA GPU",
        "",
        f"Command: `python -m studies.cuda_check --out DIR` on one {env['gpu']} (torch {env['torch']}, "
        f"CUDA {env['cuda']}, transformers {env['transformers']}); this section is "
        "`python -m studies.cuda_check --render DIR/cuda_check.json --write-docs`, and the JSON is "
        "docs/data/cuda_check_h200.json. The model is SmolLM2-135M-Instruct converted from the same GGUF "
        "file as everywhere else. One run; every figure below is from it. No vLLM was installed on that "
        "machine, so there is no peer row: the baselines are transformers' `generate` and this engine "
        "without CUDA graphs (`WORKER_ENFORCE_EAGER=true`), side by side in the same run.",
        "",
    ]
    lines += _render_correctness(result)
    for dtype in ("bfloat16", "float32"):
        lines += _render_speed(dtype, result.get(f"speed_{dtype}", {}))
    lines += _render_profiles(result)
    lines += _render_quantization(result)
    return lines


def _render_quantization(result: dict) -> list[str]:
    quant = result.get("quantization", {})
    if not quant or "error" in quant:
        return []
    served = [q for q, r in quant.items() if r["served"]]
    lines = [
        "### Quantized weights on the GPU",
        "",
        "SmolLM2's shapes with random weights, bfloat16, four requests of eight greedy tokens"
        + (f" ({result['quantization_note']})" if "quantization_note" in result else "")
        + f": served with `WORKER_QUANTIZATION` = {', '.join(f'`{q}`' for q in served) or 'nothing'}.",
    ]
    for q, r in quant.items():
        if not r["served"]:
            lines.append(f"`{q}` is refused when the worker starts: `{r.get('error', 'unfinished')}`.")
    return lines + [""]


def _render_correctness(result: dict) -> list[str]:
    logits = result.get("logits", {})
    if not logits or "error" in logits:
        return []
    graphs = "capture" if "float32/capture" in logits else "eager"
    cols = [("float32", "off"), ("float32", graphs), ("bfloat16", "off"), ("bfloat16", graphs)]
    head = " | ".join(f"{d}, {'graphs' if m != 'off' else 'eager'}" for d, m in cols)
    lines = ["### Correctness on the GPU", "", f"| check | {head} |", "|---|---|---|---|---|"]
    first = logits[f"{cols[0][0]}/{cols[0][1]}"]
    diffs = " | ".join(f"{logits[f'{d}/{m}']['max_abs_diff']:.2e}" for d, m in cols)
    lines.append(
        f"| paged forward vs transformers' forward, max abs logit difference over "
        f"{first['rows_compared']} rows (logits up to {first['max_abs_logit']:.0f}) | {diffs} |"
    )
    top1 = " | ".join(f"{logits[f'{d}/{m}']['top1_agreement']:.1%}" for d, m in cols)
    lines.append(f"| same top-1 token as transformers, per row | {top1} |")
    greedy = result.get("greedy", {})
    if greedy and "error" not in greedy:
        g32, g16 = greedy["float32"], greedy["bfloat16"]
        lines += [
            "",
            f"Eight chat requests arriving staggered through the async engine (CUDA graphs on, the default), "
            f"greedy, 48 tokens, against transformers' `generate` on the same GPU: float32 "
            f"**{g32['identical']}/{g32['requests']} identical** token for token; bfloat16 "
            f"{g16['identical']}/{g16['requests']} identical, "
            f"{g16['mean_share_before_first_difference']:.0%} "
            "of tokens before the first difference (bfloat16 rounding depends on the batch shape, in "
            "transformers as here). KV blocks held afterwards: "
            f"{g32['blocks_left']} and {g16['blocks_left']}.",
        ]
    return lines + [""]


def _render_speed(dtype: str, speed: dict) -> list[str]:
    if not speed or "error" in speed:
        return []
    hf, graphs, eager = speed["transformers"], speed["engine"], speed.get("engine_eager")
    lines = [
        f"### Speed, {dtype}",
        "",
        f"Closed loop of C streams (2C requests, at least 8), {PROMPT_TOKENS}-token prompts, exactly "
        f"{OUTPUT_TOKENS} output tokens (EOS ignored). transformers `generate`: "
        f"{hf['single_tokens_per_s']:.0f} tok/s for one stream, {hf['batch32_tokens_per_s']:.0f} tok/s for "
        "a static batch of 32.",
        "",
    ]
    if eager:
        lines += [
            "| concurrency | tok/s, CUDA graphs | tok/s, eager | graphs / eager | TTFT p50 (ms) | "
            "TTFT p99 (ms) | TPOT p50 (ms), graphs | TPOT p50 (ms), eager |",
            "|---|---|---|---|---|---|---|---|",
        ]
    else:
        lines += [
            "| concurrency | tok/s, CUDA graphs | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) |",
            "|---|---|---|---|---|",
        ]
    for c in CONCURRENCY:
        row = graphs.get(str(c))
        if not row:
            continue
        if eager:
            e = eager[str(c)]
            lines.append(
                f"| {c} | {row['tokens_per_s']:.0f} | {e['tokens_per_s']:.0f} | "
                f"{row['tokens_per_s'] / e['tokens_per_s']:.2f}x | {row['ttft_p50_ms']:.0f} | "
                f"{row['ttft_p99_ms']:.0f} | {row['tpot_p50_ms']:.1f} | {e['tpot_p50_ms']:.1f} |"
            )
        else:
            lines.append(
                f"| {c} | {row['tokens_per_s']:.0f} | {row['ttft_p50_ms']:.0f} | {row['ttft_p99_ms']:.0f} | "
                f"{row['tpot_p50_ms']:.1f} |"
            )
    lines += [
        "",
        "Each (batch, blocks) shape is captured the first time a step needs it, so a step at a new shape "
        "also pays for its capture; one warm-up request ran before the table.",
        "",
        f"Peak GPU memory allocated: {graphs['max_memory_allocated_gb']:.1f} GiB (8 GiB of it the KV pool); "
        f"KV blocks held after the run: {graphs['blocks_left']}.",
        "",
    ]
    return lines


def _render_profiles(result: dict) -> list[str]:
    lines = []
    for key in ("profile_eager", "profile"):
        prof = result.get(key, {})
        if not prof or "error" in prof:
            continue
        if not lines:
            lines = ["### Where a decode step goes", ""]
        busy = prof["gpu_kernel_ms_per_step"] / prof["step_wall_ms"]
        verdict = (
            "the GPU idles most of the step, so the host (Python, kernel launches) bounds it"
            if busy < 0.5
            else "the GPU is busy for most of the step, so its kernels bound it"
        )
        lines.append(
            f"- {prof['streams']} streams decoding, {prof['dtype']}, "
            f"{'eager' if prof['eager'] else 'CUDA graphs'}: {prof['step_wall_ms']:.1f} ms of wall time per "
            f"step; {prof['kernels_per_step']:.0f} kernels taking {prof['gpu_kernel_ms_per_step']:.2f} ms of "
            f"GPU time ({busy:.0%}): {verdict}."
        )
    return lines + [""] if lines else []


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, help="run every stage on this machine's GPU; write OUT/cuda_check.json"
    )
    parser.add_argument("--render", type=Path, help="print the docs section from a cuda_check.json")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--stages", nargs="+", help="run only these stages")
    parser.add_argument("--smoke", action="store_true", help="two small concurrency levels, 16 output tokens")
    args = parser.parse_args()
    global DEVICE, CONCURRENCY, OUTPUT_TOKENS
    DEVICE = args.device
    if args.smoke:
        CONCURRENCY, OUTPUT_TOKENS = (1, 4), 16
    if args.out:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        run_all(args.out, args.stages)
    if args.render:
        from bench.report import publish

        publish("cuda", render(json.loads(args.render.read_text())), args.write_docs)


if __name__ == "__main__":
    main()
