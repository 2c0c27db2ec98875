"""The quantization study: this engine in float32, bfloat16, int8 and int4 beside llama.cpp's own server
on the same GGUF file (Q4_1) and on a Q8_0 file, one server at a time, in one run.

Per row:
  speed     `vllm bench serve` (the same client for every row; vLLM's CPU peer venv), completions API,
            128 random prompt tokens, 64 output tokens (EOS ignored), concurrency 1, 8 and 32.
            Single-stream decode tok/s = 1000 / median TPOT at concurrency 1. TTFT p50 at concurrency 1.
  memory    peak resident memory of the server's processes while the client runs.
  quality   perplexity on bench/data/quant_text.txt (Shakespeare, public domain; chunks of 512 tokens, the
            second half of each chunk scored: llama.cpp's llama-perplexity convention), greedy agreement
            with float32 (share of identical tokens before the first difference, 8 fixed prompts, 32 tokens,
            completions re-tokenized by the model's tokenizer), exact-answer accuracy on 16 fixed questions.
Engine perplexity is computed in-process through the engine's own forward pass (scheduler + runner);
llama.cpp's with its llama-perplexity tool when built. llama.cpp is built by ../shared/peers/llama-server.sh
into .peers/llama on the first run (never a dependency of the stack); its rows are skipped, and say so, when
that script is absent or its build fails.

Speed ranks differ by CPU kind (worker/model/cpu_kind.py), so every table and JSON names the CPU (model, kind,
flags): client JSON and figures.json go to docs/bench/quant/<kind>/ (with --write-docs; a temporary folder
otherwise, so a trial run leaves docs/ as it was), and docs/BENCHMARKS.md gets one section
per kind (a run on another kind adds a table beside this one). Speeds are medians of `--repeats` serving
runs, the rows taking turns.

    .venv/bin/python -m bench.quant_study [--rows float32 bfloat16 int8 int4 llama-q4_1 llama-q8_0]
                                          [--repeats 3] [--quick] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch

from bench.peer_bench import MemorySampler, Server, peer, with_cpu, workload_seed
from bench.report import cpu_section, median_of_runs, write_section
from scripts.launch import (
    MODEL_NAME,
    exit_on_sigterm,
    free_port,
    stack_default_threads,
    start_gateway,
    start_worker,
)
from worker.model.cpu_kind import auto_choice, cpu_info
from worker.model.quant import dequantize_min_rows, native_cpu_bfloat16

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "models" / "SmolLM2-135M-Instruct"
GGUF_Q4_1 = MODEL_DIR / "model.gguf"
LLAMA_DIR = ROOT / ".peers" / "llama"
LLAMA_SCRIPT = ROOT.parent / "shared" / "peers" / "llama-server.sh"
LLAMA_BIN = LLAMA_DIR / "src" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / "build" / "bin"
RESULTS = ROOT / "docs" / "bench" / "quant" / cpu_info().kind  # one folder per CPU kind
TEXT = ROOT / "bench" / "data" / "quant_text.txt"
PPL_CONTEXT = 512
CONCURRENCY = (1, 8, 32)
GREEDY_TOKENS = 32
GREEDY_PROMPTS = [
    "The history of the printing press begins",
    "To make a good cup of tea, you should",
    "The three largest planets in the solar system are",
    "Once upon a time, in a small village by the sea,",
    "A computer program is a sequence of instructions that",
    "The main reasons people learn a second language are",
    "In the winter, many birds fly south because",
    "The recipe for bread needs only four ingredients:",
]
QUESTIONS = [  # (question, accepted answers, lower case)
    ("What is the capital of France?", ["paris"]),
    ("What is the capital of Japan?", ["tokyo"]),
    ("What is the capital of Italy?", ["rome"]),
    ("How many days are in a week?", ["seven", "7"]),
    ("How many legs does a spider have?", ["eight", "8"]),
    ("How many hours are in a day?", ["24", "twenty-four", "twenty four"]),
    ("What is 2 + 3?", ["5", "five"]),
    ("What is 10 times 10?", ["100", "hundred"]),
    ("What color is the sky on a clear day?", ["blue"]),
    ("What is the opposite of hot?", ["cold"]),
    ("Which planet do we live on?", ["earth"]),
    ("What is the largest ocean on Earth?", ["pacific"]),
    ("What do bees make?", ["honey"]),
    ("What is frozen water called?", ["ice"]),
    ("Who wrote Romeo and Juliet?", ["shakespeare"]),
    ("What gas do plants take in from the air?", ["carbon dioxide", "co2"]),
]


@dataclass
class Row:
    name: str
    kind: str  # engine | llama
    dtype: str = "bfloat16"
    quantization: str = "none"
    gguf: Path | None = None
    figures: dict = field(default_factory=dict)


def all_rows() -> dict[str, Row]:
    return {
        "float32": Row("float32", "engine", "float32"),
        "bfloat16": Row("bfloat16", "engine", "bfloat16"),
        "int8": Row("int8", "engine", "float32", "int8"),  # weight-only int8, float32 activations
        "int4": Row("int4", "engine", "float32", "int4"),
        # int8 weights x int8 activations (model/w8a8.py), between layers in the CPU's native dtype: bfloat16
        # where it has it, float32 where bfloat16 is emulated (as `auto` ran it on AVX2 before w4a8)
        "w8a8": Row("w8a8", "engine", "bfloat16" if native_cpu_bfloat16() else "float32", "w8a8"),
        # the int4 row's 4-bit weights (the GGUF file's Q4_1 blocks) x 8-bit activation rows (model/w4a8.py),
        # what `auto` runs on AVX2; between layers in the native dtype, as w8a8
        "w4a8": Row("w4a8", "engine", "bfloat16" if native_cpu_bfloat16() else "float32", "w4a8"),
        "llama-q4_1": Row("llama-q4_1", "llama", gguf=GGUF_Q4_1),
        "llama-q8_0": Row("llama-q8_0", "llama", gguf=LLAMA_DIR / "model-q8_0.gguf"),
    }


# ---- perplexity ------------------------------------------------------------------------------------
def engine_perplexity(row: Row, tokens: list[int]) -> tuple[float, float]:
    """exp(mean NLL) of the second half of each 512-token chunk, through the engine's own forward pass."""
    from worker.engine.block_manager import BlockManager
    from worker.engine.config import SchedulerConfig
    from worker.engine.request import Request
    from worker.engine.sampling_params import SamplingParams
    from worker.engine.scheduler import Scheduler
    from worker.model.loader import load_model
    from worker.model.runner import ModelRunner

    started = time.perf_counter()
    model = load_model(str(MODEL_DIR), row.dtype, "cpu", PPL_CONTEXT + 8, "auto", row.quantization)
    load_s = time.perf_counter() - started
    block_size, num_blocks = 16, PPL_CONTEXT // 16 + 4
    runner = ModelRunner(model, num_blocks, block_size)
    nll, count = 0.0, 0
    for i, start in enumerate(range(0, len(tokens) - PPL_CONTEXT + 1, PPL_CONTEXT)):
        chunk = tokens[start : start + PPL_CONTEXT]
        config = SchedulerConfig(
            max_num_seqs=1, max_num_batched_tokens=PPL_CONTEXT, max_model_len=PPL_CONTEXT + 8
        )
        scheduler = Scheduler(config, BlockManager(num_blocks, block_size, False))
        request = Request(
            f"ppl-{i}", chunk, SamplingParams(max_tokens=1, temperature=0.0), None, max_tokens=1
        )
        scheduler.add_request(request)
        plan = scheduler.schedule()
        _, logits = runner.all_logits(plan)
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        half = PPL_CONTEXT // 2  # llama-perplexity's convention: tokens half+1 .. end, from logits half ..
        targets = torch.tensor(chunk[half + 1 :], dtype=torch.long)
        nll -= float(logprobs[half : PPL_CONTEXT - 1].gather(1, targets[:, None]).sum())
        count += len(targets)
        scheduler.update_from_output(plan, {request.request_id: 0})
        runner.release(request.request_id)
    return float(torch.exp(torch.tensor(nll / count))), load_s


def llama_perplexity(row: Row, num_chunks: int) -> float | None:
    """llama.cpp's own tool over the same chunks the engine scores (`num_chunks` of PPL_CONTEXT tokens)."""
    tool = LLAMA_BIN / "llama-perplexity"
    if not tool.exists() and (LLAMA_BIN.parent / "CMakeCache.txt").exists():
        # the peer script builds the server and the quantizer; the perplexity tool is one more target
        subprocess.run(
            ["cmake", "--build", str(LLAMA_BIN.parent), "--target", "llama-perplexity"],
            capture_output=True,
            timeout=1800,
        )
    if not tool.exists():
        return None
    command = [
        str(tool),
        "-m",
        str(row.gguf),
        "-f",
        str(TEXT),
        "-c",
        str(PPL_CONTEXT),
        "--chunks",
        str(num_chunks),
    ]
    try:
        done = subprocess.run(
            [*command, "-t", str(os.cpu_count())], capture_output=True, text=True, timeout=1800
        )
    except subprocess.TimeoutExpired:
        return None
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", done.stdout + done.stderr)
    return float(found.group(1)) if found else None


# ---- servers ---------------------------------------------------------------------------------------
def start_engine(row: Row, log_dir: Path) -> Server:
    from worker.server.settings import WorkerSettings

    defaults = WorkerSettings.model_fields  # the stack's own defaults, not the test suite's small ones
    worker = start_worker(
        f"worker-{row.name}",
        log_dir,
        WORKER_DTYPE=row.dtype,
        WORKER_QUANTIZATION=row.quantization,
        WORKER_KV_CACHE_GB=str(defaults["kv_cache_gb"].default),
        WORKER_MAX_NUM_SEQS=str(defaults["max_num_seqs"].default),
        **stack_default_threads(),
    )
    gateway = start_gateway(f"gateway-{row.name}", log_dir, worker.addr)

    def stop() -> None:
        gateway.stop()
        worker.stop()

    def logs() -> str:
        return worker.log_tail() + gateway.log_tail()

    return Server(
        row.name, row.name, gateway.addr, {"worker": worker.proc.pid, "gateway": gateway.proc.pid}, stop, logs
    )


def llama(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = os.environ | {"PEER_DIR": str(LLAMA_DIR)} | (env or {})
    return subprocess.run(["bash", str(LLAMA_SCRIPT), *args], env=full_env, capture_output=True, text=True)


def start_llama(row: Row) -> Server:
    port = free_port()
    env = {"LLAMA_PORT": str(port), "LLAMA_PARALLEL": str(max(CONCURRENCY)), "LLAMA_NAME": MODEL_NAME}
    done = llama("start", str(row.gguf), env=env)
    if done.returncode:
        raise RuntimeError(f"llama-server did not start:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    pid = int((LLAMA_DIR / "llama-server.pid").read_text())
    log = LLAMA_DIR / "logs" / "llama-server.log"
    return Server(
        row.name,
        row.name,
        f"http://127.0.0.1:{port}",
        {"llama-server": pid},
        lambda: llama("stop"),
        lambda: log.read_text()[-3000:],
    )


def make_q8_0() -> None:
    """llama-quantize wants a float file: the Hugging Face directory converted to f16, then Q8_0."""
    target = LLAMA_DIR / "model-q8_0.gguf"
    if target.exists():
        return
    with tempfile.TemporaryDirectory() as tmp:
        f16 = Path(tmp) / "model-f16.gguf"
        env_path = (
            f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"  # the converter needs gguf/torch/transformers
        )
        for step in (("convert", str(MODEL_DIR), str(f16)), ("quantize", str(f16), str(target), "Q8_0")):
            done = llama(*step, env={"PATH": env_path})
            if done.returncode:
                raise RuntimeError(
                    f"llama-server.sh {step[0]} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
                )


# ---- served measurements ---------------------------------------------------------------------------
def greedy_completions(base_url: str) -> list[str]:
    texts = []
    for prompt in GREEDY_PROMPTS:
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": GREEDY_TOKENS, "temperature": 0.0}
        reply = httpx.post(f"{base_url}/v1/completions", json=body, timeout=300)
        reply.raise_for_status()
        texts.append(reply.json()["choices"][0]["text"])
    return texts


def accuracy(base_url: str) -> float:
    right = 0
    for question, answers in QUESTIONS:
        body = {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": question + " Answer in a few words."}],
            "max_tokens": 24,
            "temperature": 0.0,
        }
        reply = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=300)
        reply.raise_for_status()
        text = (reply.json()["choices"][0]["message"]["content"] or "").lower()
        right += any(a in text for a in answers)
    return right / len(QUESTIONS)


def agreement(texts: list[str], reference: list[str], tokenizer) -> float:
    """Mean share of the reference's tokens matched before the first difference."""
    shares = []
    for text, ref in zip(texts, reference, strict=True):
        a, b = (
            tokenizer.encode(text, add_special_tokens=False),
            tokenizer.encode(ref, add_special_tokens=False),
        )
        same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        shares.append(same / max(len(b), 1))
    return sum(shares) / len(shares)


def speed(server: Server, quick: bool) -> dict[str, dict]:
    common = [
        "--backend", "openai", "--endpoint", "/v1/completions", "--base-url", server.base_url,
        "--model", MODEL_NAME, "--tokenizer", str(MODEL_DIR), "--ignore-eos",
        "--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "64",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
    ]  # fmt: skip
    # every run its own prompts (peer_bench.workload_seed): one shared seed measured prefix-cache hits
    warm = peer("bench", *common, "--num-prompts", "4", "--max-concurrency", "4", *workload_seed("warmup"))
    if warm.returncode:
        raise RuntimeError(
            f"warm-up against {server.name} failed:\n{warm.stdout[-2000:]}{warm.stderr[-2000:]}"
        )
    out = {}
    RESULTS.mkdir(parents=True, exist_ok=True)
    for c in CONCURRENCY:
        prompts = {1: 6, 8: 16, 32: 32}[c] // (2 if quick else 1)
        filename = f"{server.name}-c{c}.json"
        done = peer("bench", *common, "--num-prompts", str(max(prompts, 2)), "--max-concurrency", str(c),
                    *workload_seed(f"c{c}"), "--save-result", "--result-dir", str(RESULTS),
                    "--result-filename", filename)  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"{server.name} c{c} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        out[f"c{c}"] = with_cpu(RESULTS / filename, cpu_info())
        r = out[f"c{c}"]
        tput, ttft, tpot = r["output_throughput"], r["median_ttft_ms"], r["median_tpot_ms"]
        print(
            f"  {server.name:11} c{c:<3} {tput:7.1f} tok/s  TTFT p50 {ttft:7.1f} ms  TPOT p50 {tpot:6.1f} ms"
        )
    return out


def serve_and_measure(row: Row, log_dir: Path, quick: bool) -> None:
    server = start_engine(row, log_dir) if row.kind == "engine" else start_llama(row)
    try:
        row.figures["greedy"] = greedy_completions(server.base_url)
        row.figures["accuracy"] = accuracy(server.base_url)
        with MemorySampler(server):
            row.figures["speed"] = speed(server, quick)
        row.figures["rss_mb"] = sum(server.peak_rss_mb.values())
    finally:
        server.stop()


# ---- report ----------------------------------------------------------------------------------------
def setup(repeats: int) -> str:
    """What the table's rows are, on this machine."""
    runs = (
        f"speeds are medians of {repeats} serving runs per row, the rows taking turns, quality from the first"
        if repeats > 1
        else "one run"
    )
    import torch

    from worker.kernels import native_ops

    native_ops()  # registers the kernels' ops
    query = getattr(torch.ops.llmserve, "int4_activation_dtype", None)
    int4_rows = query() if query is not None else "float32"
    panel_rows = getattr(torch.ops.llmserve, "bf16_panel_min_rows", lambda: 0)()
    dequantize_rows = dequantize_min_rows(torch.device("cpu"))
    dequantized = (
        " On this CPU both quantized rows change method with the batch (worker/model/quant.py):"
        f" from {panel_rows}"
        f" rows their kernels run a bfloat16 panel GEMM, and from {dequantize_rows} rows (prefill"
        " chunks) the layers dequantize to bfloat16 for oneDNN's GEMM."
        if native_cpu_bfloat16() and panel_rows
        else ""
    )
    native = "yes" if native_cpu_bfloat16() else "no"
    w8a8_dtype, w4a8_dtype = all_rows()["w8a8"].dtype, all_rows()["w4a8"].dtype
    return f"""(one server at a time, on this {os.cpu_count()}-core machine ({cpu_info().model}, native
bfloat16: {native}) with nothing else running; {runs}; counts are small, so compare rows within this
table). Client: `vllm bench serve`, completions, 128 random prompt tokens, 64 output tokens. Decode
tok/s: 1000 / TPOT p50 at one stream. Rows: float32 and bfloat16 are unquantized weights in
that dtype; int8 is float32 activations with int8 weights (one scale per channel) through the project's
kernel; w8a8 is int8 weights times int8 activation rows quantized at every step (model/w8a8.py), in
{w8a8_dtype} between layers, what `WORKER_QUANTIZATION=auto` runs on the avx512 and avx512_bf16 kinds;
int4 is a float32 model whose linear layers run the project's 4-bit kernel on the GGUF file's own Q4_1
blocks (its products read the activations as {int4_rows} here: bfloat16 where the CPU has AVX512-BF16,
else float32).{dequantized} w4a8 is int4's weights times int8 activation rows (a scale per 32 columns) on the
project's kernel (model/w4a8.py; AVX2, or AVX512-VNNI where the CPU has it), in {w4a8_dtype} between layers,
what `auto` runs on the avx2 kind for a model with its GGUF blocks.
The package ships only the Q4_1 file, so the float32 weights are those blocks de-quantized: int4 computes the
same weights as float32, int8 rounds them again, and llama.cpp's Q8_0 file is the Q4_1 weights re-quantized
(its perplexity cannot be better than Q4_1's)."""


def render(
    rows: list[Row], skipped: dict[str, str], command: str, png: str | None, len_tokens: int, reference: str
) -> str:
    repeats = max((len(r.figures.get("speed_runs", [])) for r in rows), default=1) or 1
    cpu = cpu_info()
    lines = [
        "## Quantization study (weight-only int8/int4 in this engine, llama.cpp on the same GGUF), CPU kind "
        + cpu.kind,
        "",
        f"CPU: {cpu.describe()}, {os.cpu_count()} cores.",
        "",
        *textwrap.wrap(f"Command: `{command}` " + " ".join(setup(repeats).split()), 105),
        f"Perplexity: bench/data/quant_text.txt (Shakespeare, public domain; the first {len_tokens} tokens),",
        "512-token chunks,",
        "second half scored. Agreement: identical tokens before the first difference from float32,",
        "8 prompts, 32 greedy tokens. Accuracy: 16 fixed short-answer questions.",
        "",
        "| row | decode tok/s (1 stream) | tok/s at 8 | tok/s at 32 | TTFT p50 ms | peak RSS MB "
        f"| perplexity | agreement with {reference} | accuracy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        f = row.figures
        sp = f.get("speed", {})

        def cell(run: str, key: str, fmt: str = "{:.1f}", sp: dict = sp) -> str:
            return fmt.format(sp[run][key]) if run in sp else "n/a"

        decode = f"{1000 / sp['c1']['median_tpot_ms']:.1f}" if "c1" in sp else "n/a"
        ppl = f"{f['perplexity']:.3f}" if f.get("perplexity") else "n/a"
        agree = f"{f['agreement']:.2f}" if "agreement" in f else "n/a"
        acc = f"{f['accuracy']:.2f}" if "accuracy" in f else "n/a"
        rss = f"{f['rss_mb']:.0f}" if "rss_mb" in f else "n/a"
        at8, at32 = cell("c8", "output_throughput"), cell("c32", "output_throughput")
        lines.append(
            f"| {row.name} | {decode} | {at8} | {at32} | {cell('c1', 'median_ttft_ms')} | {rss} "
            f"| {ppl} | {agree} | {acc} |"
        )
    for name, why in skipped.items():
        lines.append(f"\n{name}: not measured ({why}).")
    lines += ["", *recommendation(rows), "", *targets(rows)]
    if png:
        lines += ["", f"![quantization study]({png})"]
    return "\n".join(lines)


def targets(rows: list[Row]) -> list[str]:
    """Issue 11's targets, checked against this run's figures."""
    f = {r.name: r.figures for r in rows if "speed" in r.figures}

    def decode(name: str) -> float:
        return 1000 / f[name]["speed"]["c1"]["median_tpot_ms"]

    def at32(name: str) -> float:
        return f[name]["speed"]["c32"]["output_throughput"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "missed"

    out = ["Against the targets:", ""]
    if {"int8", "bfloat16"} <= f.keys():
        ratio = decode("int8") / decode("bfloat16")
        ppl = f["int8"]["perplexity"] / f["bfloat16"]["perplexity"] - 1
        out.append(
            f"- int8 single-stream decode {ratio:.2f}x bfloat16's (target 1.5x: {verdict(ratio >= 1.5)}), "
            f"perplexity {ppl:+.2%} against bfloat16 (target within 1%: {verdict(abs(ppl) <= 0.01)})."
        )
    if {"int4", "llama-q4_1"} <= f.keys():
        ratio = decode("int4") / decode("llama-q4_1")
        ours, theirs = f["int4"]["perplexity"], f["llama-q4_1"].get("perplexity")
        quality = (
            f"perplexity {ours:.3f} against llama.cpp's {theirs:.3f} "
            f"(target no worse: {verdict(ours <= theirs)})"
            if theirs
            else "llama.cpp's perplexity not measured (its llama-perplexity tool is not built)"
        )
        out.append(
            f"- int4 single-stream decode {ratio:.2f}x llama-server's on the same Q4_1 file (target 1x: "
            f"{verdict(ratio >= 1)}); {quality}."
        )
    if {"int8", "int4", "bfloat16"} <= f.keys():
        slowest = min(at32("int8"), at32("int4"))

        def c32(name: str, key: str) -> float:
            return f[name]["speed"]["c32"][key]

        split = ", ".join(
            f"{name} {c32(name, 'median_tpot_ms'):.1f} / {c32(name, 'median_ttft_ms'):.0f} ms"
            for name in ("bfloat16", "int8", "int4")
        )
        out.append(
            f"- concurrency 32: int8 {at32('int8'):.1f} and int4 {at32('int4'):.1f} tok/s against bfloat16's "
            f"{at32('bfloat16'):.1f} (target not slower: {verdict(slowest >= at32('bfloat16'))}). "
            f"TPOT / TTFT p50 there: {split}. "
            + (
                f"This CPU computes bfloat16 natively ({cpu_info().kind}): decode steps of 10 or more rows "
                "run the quantized kernels' bfloat16 panel GEMM, and prefill chunks "
                f"({dequantize_min_rows(torch.device('cpu'))} rows and more) "
                "dequantize each weight for oneDNN's bfloat16 GEMM, which then reorders the fresh weights "
                "on every call where the bfloat16 row's were packed at load (section \"Quantized linear "
                'kernels", `stack` rows: the 30 layers at 32 and 512 rows).'
                if native_cpu_bfloat16()
                else "bfloat16 is slow on this CPU, which has no native bfloat16 (its matmuls are emulated)."
            )
        )
    return out


def recommendation(rows: list[Row]) -> list[str]:
    """The CPU default that follows from the table: among engine rows within 1% of float32's perplexity,
    the fastest at one stream and the fastest at concurrency 32; `auto` follows the second, since the stack
    is built for concurrent traffic."""
    from worker.model.loader import resolve_dtype, resolve_quantization

    engine = {r.name: r.figures for r in rows if r.kind == "engine" and "speed" in r.figures}
    if "float32" not in engine or not engine["float32"].get("perplexity"):
        return ["Recommendation: needs the float32 row."]
    limit = engine["float32"]["perplexity"] * 1.01

    def decode(f: dict) -> float:
        return 1000 / f["speed"]["c1"]["median_tpot_ms"]

    def loaded(f: dict) -> float:
        return f["speed"]["c32"]["output_throughput"]

    ok = {n: f for n, f in engine.items() if f.get("perplexity") and f["perplexity"] <= limit}
    single, busy = max(ok, key=lambda n: decode(ok[n])), max(ok, key=lambda n: loaded(ok[n]))
    f32 = engine["float32"]
    kind = cpu_info().kind
    auto = resolve_quantization("auto", "cpu", model_path=str(MODEL_DIR))
    auto_name = resolve_dtype("auto", "cpu") if auto == "none" else auto
    level = [n for n in ok if loaded(ok[n]) >= 0.98 * loaded(ok[busy])]  # within 2%: a tie at this noise
    follows = (
        f"one of the rows level at the top under load (within 2%: {', '.join(level)})"
        if auto_name in level
        else f"not the row this run puts first under load ({busy}): the default was set from earlier runs"
    )
    one, one_x = decode(ok[single]), decode(ok[single]) / decode(f32)
    many, many_x = loaded(ok[busy]), loaded(ok[busy]) / loaded(f32)
    text = f"""**Recommendation (CPU):** among rows within 1% of float32's perplexity ({limit:.2f}),
    `{single}` decodes fastest at one stream ({one:.1f} tok/s, {one_x:.2f}x float32) and `{busy}` makes
    the most tok/s at concurrency 32 ({many:.1f}, {many_x:.2f}x float32). The stack is built for
    concurrent traffic, so the defaults follow the second, per CPU kind (worker/model/cpu_kind.py: the table
    there cites the run each kind's choice rests on): on this CPU's kind, {kind}, `auto` runs
    `{auto_name}` ({auto_choice(kind).basis}), {follows}. Set `{single}` for mostly
    single-stream use (int4's quality here is that of the GGUF file's own Q4 blocks; a model directory
    without a GGUF file is quantized from float at load).
    **GPU:** `none`, bfloat16 weights with decode steps replayed from CUDA graphs (section "Engine on a
    CUDA GPU"): on one H200 a single stream's step took 3.9 ms while reading this model's 270 MB of
    bfloat16 weights takes about 0.06 ms at its ~4.3 TB/s, so smaller weights have little to win there;
    int8 is served there and int4 refused at start (same section), and `auto` does not quantize there."""
    return textwrap.wrap(" ".join(text.split()), 105)


def plot(rows: list[Row]) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in rows if "speed" in r.figures]
    if not measured:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for row in measured:
        sp = row.figures["speed"]
        axes[0].plot(
            CONCURRENCY, [sp[f"c{c}"]["output_throughput"] for c in CONCURRENCY], marker="o", label=row.name
        )
    axes[0].set_xscale("log", base=2)
    axes[0].set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
    axes[0].set_xlabel("concurrent streams")
    axes[0].set_ylabel("output tokens/s")
    axes[0].grid(alpha=0.3)
    axes[0].legend()
    with_ppl = [r for r in measured if r.figures.get("perplexity")]
    axes[1].scatter([1000 / r.figures["speed"]["c1"]["median_tpot_ms"] for r in with_ppl],
                    [r.figures["perplexity"] for r in with_ppl])  # fmt: skip
    for r in with_ppl:
        axes[1].annotate(r.name, (1000 / r.figures["speed"]["c1"]["median_tpot_ms"], r.figures["perplexity"]))
    axes[1].set_xlabel("single-stream decode tok/s")
    axes[1].set_ylabel("perplexity (lower is better)")
    axes[1].grid(alpha=0.3)
    fig.suptitle("SmolLM2-135M-Instruct: quantization, speed and quality (bench/quant_study.py)")
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "quant-study.png"
    fig.savefig(path, dpi=90)
    return os.path.relpath(path, ROOT / "docs")


def speed_only(row: Row, log_dir: Path, quick: bool) -> dict[str, dict]:
    server = start_engine(row, log_dir) if row.kind == "engine" else start_llama(row)
    try:
        return speed(server, quick)
    finally:
        server.stop()


def save_figures(rows: list[Row], run: dict) -> None:
    """Every row's figures, with the CPU they were measured on and the run's arguments (`run`: what
    --from-figures renders them with), kept row by row: a long run that fails keeps its figures."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    figures = {r.name: r.figures for r in rows} | {"cpu": cpu_info().as_dict(), "run": run}
    (RESULTS / "figures.json").write_text(json.dumps(figures, indent=1))


def measure(rows: list[Row], tokens: list[int], run: dict) -> None:
    """Quality and one serving run per row, then repeats - 1 more serving runs of every row, row after row
    (so a slow spell of the machine lands on all rows, not on one); the table's speeds are the medians."""
    quick, repeats = run["quick"], run["repeats"]
    if any(r.name == "llama-q8_0" for r in rows):
        make_q8_0()
    log_dir = Path(tempfile.mkdtemp(prefix="quant-study-"))
    for row in rows:
        print(f"[{row.name}]", flush=True)
        if row.kind == "engine":
            row.figures["perplexity"], row.figures["load_s"] = engine_perplexity(row, tokens)
        else:
            row.figures["perplexity"] = llama_perplexity(row, len(tokens) // PPL_CONTEXT)
        print(f"  perplexity {row.figures['perplexity']}", flush=True)
        serve_and_measure(row, log_dir, quick)
        save_figures(rows, run)
        print(
            f"  accuracy {row.figures['accuracy']:.2f}  peak RSS {row.figures['rss_mb']:.0f} MB", flush=True
        )
    for row in rows:
        row.figures["speed_runs"] = [row.figures["speed"]]
    for run in range(1, repeats):
        for row in rows:
            print(f"[{row.name}] serving run {run + 1} of {repeats}", flush=True)
            row.figures["speed_runs"].append(speed_only(row, log_dir, quick))
    for row in rows:
        row.figures["speed"] = median_of_runs(row.figures["speed_runs"])
    save_figures(rows, run)


def main() -> None:
    global RESULTS
    exit_on_sigterm()  # killed, it still stops the servers it started
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", nargs="+", default=list(all_rows()), choices=list(all_rows()))
    parser.add_argument(
        "--quick", action="store_true", help="half the prompts per concurrency, 4 perplexity chunks"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="serving runs per row, interleaved; the table shows medians"
    )
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument(
        "--from-figures", action="store_true", help="re-render docs/bench/quant/<this CPU kind>/figures.json"
    )
    args = parser.parse_args()
    saved = json.loads((RESULTS / "figures.json").read_text()) if args.from_figures else {}
    # the arguments the figures were measured with (figures.json keeps them; files written before it did
    # fall back to this command's)
    run = {"rows": args.rows, "quick": args.quick, "repeats": args.repeats} | saved.get("run", {})
    if not args.write_docs:  # docs/bench/quant is written by runs that write the docs' table only
        RESULTS = Path(tempfile.mkdtemp(prefix="quant-study-"))
        print(f"raw results in {RESULTS}", flush=True)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    tokens = tokenizer.encode(TEXT.read_text(), add_special_tokens=False)
    if run["quick"]:
        tokens = tokens[: 4 * PPL_CONTEXT]
    rows, skipped = [all_rows()[name] for name in run["rows"]], {}
    wants_llama = any(r.kind == "llama" for r in rows) and not args.from_figures
    if wants_llama and not (LLAMA_BIN / "llama-server").exists() and LLAMA_SCRIPT.exists():
        print("building llama-server into .peers/llama (about 10 minutes on two cores)", flush=True)
        done = llama("build")
        if done.returncode:
            print(f"llama-server.sh build failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}", flush=True)
    if wants_llama and not (LLAMA_BIN / "llama-server").exists():
        skipped.update(
            {r.name: "llama-server is not built in .peers/llama" for r in rows if r.kind == "llama"}
        )
        rows = [r for r in rows if r.kind != "llama"]
    if args.from_figures:
        for row in rows:
            row.figures = saved.get(row.name, {})
        skipped.update({r.name: "the run ended before this row" for r in rows if "speed" not in r.figures})
        rows = [r for r in rows if "speed" in r.figures]
    else:
        measure(rows, tokens, run)
    # float32 is the reference; a run without it compares with bfloat16 (and the table says so)
    reference = next((r for r in rows if r.name == "float32"), None) or next(
        (r for r in rows if r.name == "bfloat16"), None
    )
    for row in rows:
        if reference is not None and "greedy" in row.figures:
            row.figures["agreement"] = agreement(
                row.figures["greedy"], reference.figures["greedy"], tokenizer
            )
    save_figures(rows, run)
    command = "python -m bench.quant_study " + " ".join(
        ["--rows", *run["rows"], "--repeats", str(run["repeats"])]
        + (["--quick"] if run["quick"] else [])
        + (["--write-docs"] if args.write_docs else [])
    )
    body = render(rows, skipped, command, plot(rows), len(tokens), reference.name if reference else "float32")
    print(body)
    if args.write_docs:
        write_section(cpu_section("quant", cpu_info().kind), body)


if __name__ == "__main__":
    main()
