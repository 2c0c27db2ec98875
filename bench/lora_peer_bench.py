"""Multi-LoRA serving beside vLLM's CPU build, with the same adapters and vLLM's own client.

Both servers start with the same four rank-16 PEFT adapters (every attention and MLP projection, made with
peft as the tests make them) and LoRA on; then `vllm bench serve --lora-modules ... --lora-assignment
round-robin` sends each request to one adapter in turn (0 adapters: every request on the base model, LoRA
still on). Rows: 8 and 32 streams x 0, 1 and 4 adapters in the mix, 64 random prompt tokens and 32 output
tokens (EOS ignored), twice as many requests as streams. Ours is the whole serving path (gateway with the
semantic cache off, gRPC, worker); the servers take turns `--repeats` times and the table shows medians,
each ratio the median of the rounds' ratios. Raw client JSON: docs/bench/lora/<cpu kind>/.

    .venv/bin/python -m bench.lora_peer_bench [--repeats 3] [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from bench.peer_bench import (
    MODEL_DIR,
    PEER_SCRIPT,
    ROOT,
    Server,
    peer,
    ratio_cell,
    start_ours,
    start_vllm,
    with_cpu,
    workload_seed,
)
from bench.report import cpu_section, median, write_section
from scripts.launch import MODEL_NAME, exit_on_sigterm
from worker.model.cpu_kind import cpu_info

RANK = 16
ADAPTERS = 4
STREAMS = (8, 32)
ADAPTER_COUNTS = (0, 1, 4)
PROMPT_TOKENS, OUTPUT_TOKENS = 64, 32
RESULTS = ROOT / "docs" / "bench" / "lora" / cpu_info().kind


def make_adapters(root: Path) -> dict[str, str]:
    from tests.support.lora_adapters import load_base, make_adapter

    base = load_base()
    return {
        f"a{i}": make_adapter(str(root / f"a{i}"), 100 + i, r=RANK, lora_alpha=2 * RANK, base=base)
        for i in range(ADAPTERS)
    }


def start(name: str, adapters: dict[str, str], log_dir: Path) -> Server:
    modules = " ".join(f"{n}={p}" for n, p in adapters.items())
    if name == "ours":
        return start_ours(
            "auto",
            log_dir,
            WORKER_LORA_MODULES=modules.replace(" ", ","),
            WORKER_MAX_LORAS=str(ADAPTERS),
            WORKER_MAX_LORA_RANK=str(RANK),
        )
    return start_vllm(
        "bfloat16", f"--enable-lora --max-loras {ADAPTERS} --max-lora-rank {RANK} --lora-modules {modules}"
    )


def row_name(streams: int, count: int) -> str:
    return f"c{streams}-lora{count}"


def drive(server: Server, adapters: list[str], round_: int) -> dict[str, dict]:
    common = [
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", server.base_url,
        "--model", MODEL_NAME, "--tokenizer", str(MODEL_DIR), "--ignore-eos",
        "--dataset-name", "random", "--random-input-len", str(PROMPT_TOKENS),
        "--random-output-len", str(OUTPUT_TOKENS), "--percentile-metrics", "ttft,tpot,e2el",
        "--metric-percentiles", "50,99",
    ]  # fmt: skip
    # every row its own prompts (peer_bench.workload_seed): one shared seed measured prefix-cache hits
    warmup = peer("bench", *common, "--num-prompts", "8", "--max-concurrency", "8",
                  "--lora-modules", *adapters, *workload_seed("warmup"))  # fmt: skip
    if warmup.returncode:
        raise RuntimeError(
            f"warm-up against {server.name} failed:\n{warmup.stdout[-3000:]}{warmup.stderr[-3000:]}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = {}
    for streams in STREAMS:
        for count in ADAPTER_COUNTS:
            name = row_name(streams, count)
            filename = f"{server.name}-{name}-r{round_ + 1}.json"
            lora = ["--lora-modules", *adapters[:count], "--lora-assignment", "round-robin"] if count else []
            load = ["--num-prompts", str(2 * streams), "--max-concurrency", str(streams), *lora]
            load += ["--seed", str(10_000 + 100 * streams + count)]
            save = ["--save-result", "--result-dir", str(RESULTS), "--result-filename", filename]
            done = peer("bench", *common, *load, *save)
            if done.returncode:
                raise RuntimeError(
                    f"{server.name} {name} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
                )
            results[name] = r = with_cpu(RESULTS / filename, cpu_info())
            if r["failed"]:
                raise RuntimeError(f"{server.name} {name}: {r['failed']} requests failed\n{server.logs()}")
            print(
                f"{server.name:5} r{round_ + 1} {name:11} {r['output_throughput']:7.1f} tok/s  "
                f"TTFT p50 {r['median_ttft_ms']:7.1f} ms  TPOT p50 {r['median_tpot_ms']:6.1f} ms",
                flush=True,
            )
    return results


def render(rounds: dict[str, list[dict[str, dict]]], command: str) -> str:
    cpu = cpu_info()
    med = {
        server: {name: median([run[name]["output_throughput"] for run in runs]) for name in runs[0]}
        for server, runs in rounds.items()
        if runs
    }
    ratios: dict[str, list[float]] = {}
    for mine, theirs in zip(rounds.get("ours", []), rounds.get("vllm", []), strict=False):
        for name, r in mine.items():
            ratios.setdefault(name, []).append(r["output_throughput"] / theirs[name]["output_throughput"])
    repeats = max(len(runs) for runs in rounds.values())
    lines = [
        f"## LoRA serving beside vLLM's CPU build (same adapters, vLLM's own client), CPU kind {cpu.kind}",
        "",
        f"CPU: {cpu.describe()}, {os.cpu_count()} cores.",
        "",
        f"Command: `{command}`. Both servers at their defaults (ours `WORKER_DTYPE=auto`, vLLM",
        f"bfloat16) with LoRA on and the same {ADAPTERS} rank-{RANK} adapters (all seven projections);",
        "`vllm bench serve --lora-modules ... --lora-assignment round-robin` spreads requests over the row's",
        f"adapters (0: base model only). {PROMPT_TOKENS} random prompt + {OUTPUT_TOKENS} output tokens (EOS",
        f"ignored), twice as many requests as streams. The servers took turns {repeats} times; medians, and",
        "each ratio the median of the rounds' ratios (each round's in brackets). Output tok/s:",
        "",
        "| streams | adapters | ours | vLLM | ratio | ours cost vs 0 adapters | vLLM cost vs 0 adapters |",
        "|---|---|---|---|---|---|---|",
    ]
    for streams in STREAMS:
        for count in ADAPTER_COUNTS:
            name, base = row_name(streams, count), row_name(streams, 0)
            cells = [f"{med[s][name]:.1f}" if s in med else "-" for s in ("ours", "vllm")]
            costs = [
                f"{100 * (1 - med[s][name] / med[s][base]):.0f}%" if s in med and count else "-"
                for s in ("ours", "vllm")
            ]
            lines.append(
                f"| {streams} | {count} | {cells[0]} | {cells[1]} | {ratio_cell(ratios.get(name))} | "
                f"{costs[0]} | {costs[1]} |"
            )
    return "\n".join(lines)


def main() -> None:
    exit_on_sigterm()  # killed, it still stops the servers it started
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--servers", nargs="+", default=["ours", "vllm"], choices=["ours", "vllm"])
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if "vllm" in args.servers and not PEER_SCRIPT.exists():
        raise SystemExit(f"the vLLM peer script is missing ({PEER_SCRIPT}): run with --servers ours")
    rounds: dict[str, list[dict[str, dict]]] = {name: [] for name in args.servers}
    with tempfile.TemporaryDirectory() as tmp:
        adapters = make_adapters(Path(tmp) / "adapters")
        for round_ in range(args.repeats):
            for name in args.servers:
                server = start(name, adapters, Path(tmp))
                try:
                    time.sleep(2)
                    rounds[name].append(drive(server, list(adapters), round_))
                finally:
                    server.stop()
    command = f"python -m bench.lora_peer_bench --repeats {args.repeats} --servers {' '.join(args.servers)}"
    text = render(rounds, command)
    print(text)
    if args.write_docs:
        write_section(cpu_section("lora-peer", cpu_info().kind), text)


if __name__ == "__main__":
    main()
