"""Soak: minutes of mixed load on the whole stack, looking for what only time shows (leaks, held blocks).

Redis, the cache service, one worker and the gateway run as `make run` runs them, on loopback ports.
CONCURRENCY clients (as many as the worker batches: the stack at capacity) each send one request after
another: streaming and non-streaming chats, some hung up part-way through, repeated questions the semantic
cache answers, and a few the gateway must refuse (five stop strings: 400). Recorded: requests ok, refused
and failed, p50/p99 latencies, each process's resident memory at start, after warm-up and at the end (and
every minute between), and the KV blocks the worker still holds once the load stops. Writes the `soak`
section of docs/BENCHMARKS.md with --write-docs.

    .venv/bin/python -m bench.soak [--minutes 10] [--warmup-minutes 1] [--concurrency 16] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import psutil
import redis

from bench.report import write_section
from common.gen import worker_pb2, worker_pb2_grpc
from scripts.launch import MODEL_NAME, Service, exit_on_sigterm, free_port, grpc_serving, redis_argv

MODEL = MODEL_NAME
TOPICS = ("rivers", "owls", "bread", "glaciers", "chess", "tides", "copper", "lanterns", "maps", "bees")
# Asked again and again at temperature 0: after the first answer, the semantic cache serves them.
REPEATED = tuple(f"In one sentence, what are {topic}?" for topic in TOPICS[:6])
KINDS = ("stream", "stream hung up", "non-stream", "cache candidate", "deliberate refusal")
WEIGHTS = (0.30, 0.10, 0.30, 0.20, 0.10)


@dataclass
class Tally:
    ok: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)  # the deliberate 400s
    failed: Counter[str] = field(default_factory=Counter)  # anything else: the target is zero
    failure_samples: list[str] = field(default_factory=list)
    latency_s: dict[str, list[float]] = field(default_factory=dict)

    def took(self, kind: str, seconds: float) -> None:
        self.latency_s.setdefault(kind, []).append(seconds)

    def fail(self, kind: str, what: str) -> None:
        self.failed[kind] += 1
        if len(self.failure_samples) < 5:
            self.failure_samples.append(f"{kind}: {what[:300]}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def chat_body(rng: random.Random, kind: str) -> dict:
    if kind == "cache candidate":
        return {
            "messages": [{"role": "user", "content": rng.choice(REPEATED)}],
            "max_tokens": 16,
            "temperature": 0,
        }
    words = " ".join(rng.choice(TOPICS) for _ in range(rng.randint(3, 30)))
    body: dict = {
        "messages": [{"role": "user", "content": f"Write about {words} ({rng.random():.6f})."}],
        "max_tokens": rng.randint(8, 64),
        "temperature": 0.8,
    }
    if kind == "deliberate refusal":
        body["stop"] = ["a", "b", "c", "d", "e"]  # the OpenAI API allows four
    return body


async def one_request(http: httpx.AsyncClient, rng: random.Random, tally: Tally) -> None:
    kind = rng.choices(KINDS, WEIGHTS)[0]
    body = chat_body(rng, kind) | {"model": MODEL, "stream": kind.startswith("stream")}
    start = time.perf_counter()
    try:
        if body["stream"]:
            await stream(http, body, kind, rng.randint(1, 4) if kind == "stream hung up" else None, tally)
        else:
            response = await http.post("/v1/chat/completions", json=body)
            expected = 400 if kind == "deliberate refusal" else 200
            if response.status_code != expected:
                tally.fail(kind, f"{response.status_code} {response.text}")
                return
            (tally.refused if expected == 400 else tally.ok)[kind] += 1
        tally.took(kind, time.perf_counter() - start)
    except httpx.HTTPError as error:
        tally.fail(kind, repr(error))


async def stream(
    http: httpx.AsyncClient, body: dict, kind: str, hang_up_after: int | None, tally: Tally
) -> None:
    """Read the SSE stream to [DONE], or close the connection after a few chunks, as an impatient client."""
    chunks = 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            tally.fail(kind, f"{response.status_code} {(await response.aread()).decode(errors='replace')}")
            return
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                break
            if '"error"' in line:
                tally.fail(kind, line)
                return
            if line.startswith("data: "):
                chunks += 1
                if hang_up_after is not None and chunks >= hang_up_after:
                    break  # leaving the block closes the connection mid-stream
        else:
            tally.fail(kind, "the stream ended without [DONE]")
            return
    tally.ok[kind] += 1


async def client(http: httpx.AsyncClient, seed: int, until: float, tally: Tally) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        await one_request(http, rng, tally)


class Stack:
    """redis-server, cache service, worker and gateway as separate processes on free loopback ports."""

    def __init__(self, log_dir: Path, worker_env: dict[str, str]) -> None:
        redis_port, cache_port, worker_port, gateway_port = (free_port() for _ in range(4))
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        self.worker_addr = f"127.0.0.1:{worker_port}"
        self.url = f"http://127.0.0.1:{gateway_port}"
        py = [sys.executable, "-m"]
        self.services = [
            Service(
                "redis",
                redis_argv(redis_port, log_dir),
                {},
                log_dir / "redis.log",
                lambda: bool(redis.Redis.from_url(redis_url, socket_timeout=1).ping()),
            ),
            Service(
                "cache",
                [*py, "cache_service"],
                {"CACHE_PORT": str(cache_port), "CACHE_METRICS_PORT": "0", "REDIS_URL": redis_url},
                log_dir / "cache.log",
                lambda: grpc_serving(f"127.0.0.1:{cache_port}"),
            ),
            Service(
                "worker",
                [*py, "worker"],
                {"WORKER_PORT": str(worker_port), "WORKER_METRICS_PORT": "0"} | worker_env,
                log_dir / "worker.log",
                lambda: grpc_serving(self.worker_addr),
            ),
            Service(
                "gateway",
                [*py, "gateway"],
                {
                    "GATEWAY_PORT": str(gateway_port),
                    "WORKER_ADDR": self.worker_addr,
                    "CACHE_ADDR": f"127.0.0.1:{cache_port}",
                },
                log_dir / "gateway.log",
                lambda: httpx.get(f"{self.url}/ready", timeout=2).status_code == 200,
            ),
        ]

    def start(self) -> None:
        for service in self.services:
            service.start()

    def stop(self) -> None:
        """Every service is stopped, even when stopping an earlier one fails."""
        for service in reversed(self.services):
            try:
                service.stop()
            except Exception as error:  # keep going: an orphan would outlive the benchmark
                print(f"[soak] stopping {service.name}: {error!r}; killing it", flush=True)
                if service.proc is not None:
                    service.proc.kill()

    def rss_mib(self) -> dict[str, float]:
        out = {}
        for service in self.services:
            assert service.proc is not None and service.alive, f"{service.name} died:\n{service.log_tail()}"
            out[service.name] = psutil.Process(service.proc.pid).memory_info().rss / 2**20
        return out

    def worker_stats(self) -> worker_pb2.Stats:
        with grpc.insecure_channel(self.worker_addr) as channel:
            return worker_pb2_grpc.WorkerStub(channel).GetStats(worker_pb2.StatsRequest(), timeout=5)

    def idle_stats(self, timeout_s: float = 30.0) -> worker_pb2.Stats:
        """The worker's stats once nothing runs or waits (hung-up streams are aborted asynchronously)."""
        deadline = time.monotonic() + timeout_s
        stats = self.worker_stats()
        while time.monotonic() < deadline and (
            stats.num_running or stats.num_waiting or stats.num_kv_blocks_used
        ):
            time.sleep(0.5)
            stats = self.worker_stats()
        return stats

    def cache_hits(self) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        hit = 'llmserve_gateway_semantic_cache_requests_total{result="hit"}'
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(hit))


async def run_load(
    stack: Stack, args: argparse.Namespace, tally: Tally, rss: dict[str, dict[str, float]]
) -> None:
    start = time.monotonic()
    until = start + args.minutes * 60
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    async with httpx.AsyncClient(base_url=stack.url, timeout=300, limits=limits) as http:
        clients = [asyncio.create_task(client(http, seed, until, tally)) for seed in range(args.concurrency)]
        minute = 1
        while not all(c.done() for c in clients):
            await asyncio.sleep(1)
            if time.monotonic() - start >= minute * 60:
                label = "after warm-up" if minute == args.warmup_minutes else f"{minute} min"
                rss[label] = sample = stack.rss_mib()
                ok, failed = sum(tally.ok.values()), sum(tally.failed.values())
                print(
                    f"[soak] {minute} min: ok {ok}, refused {sum(tally.refused.values())}, failed {failed}, "
                    f"rss {', '.join(f'{k} {v:.0f}' for k, v in sample.items())} MiB",
                    flush=True,
                )
                minute += 1
        await asyncio.gather(*clients)


def report(
    args: argparse.Namespace,
    tally: Tally,
    rss: dict[str, dict[str, float]],
    stats: worker_pb2.Stats,
    cache_hits: float,
    elapsed_s: float,
    worker_env: dict[str, str],
    load: tuple[float, float],
) -> str:
    ok, refused, failed = sum(tally.ok.values()), sum(tally.refused.values()), sum(tally.failed.values())
    base, end = rss["after warm-up"], rss["end"]
    growth = {name: end[name] / base[name] - 1 for name in end}
    settings = ", ".join(f"{k}={v}" for k, v in worker_env.items())
    lines = [
        "## Soak: mixed load at capacity",
        "",
        f"`.venv/bin/python -m bench.soak --minutes {args.minutes:g} --warmup-minutes {args.warmup_minutes} "
        f"--concurrency {args.concurrency} --write-docs` (`make soak`). One worker "
        f"({settings}), the cache service with Redis, the gateway; {args.concurrency} clients back to back "
        f"for {elapsed_s / 60:.1f} min on loopback, on a shared {os.cpu_count()}-core machine "
        f"(load average {load[0]:.1f} at the start, {load[1]:.1f} at the end: other work shares the cores).",
        "",
        f"| requests ({ok + refused + failed}) | count |",
        "| --- | --- |",
        f"| ok | {ok} ({', '.join(f'{k} {v}' for k, v in sorted(tally.ok.items()))}) |",
        f"| refused on purpose (5 stop strings: 400) | {refused} |",
        f"| failed (target 0) | {failed} {dict(tally.failed) if failed else ''} |",
        f"| semantic-cache hits (gateway) | {cache_hits:.0f} |",
        "",
        "| kind | p50 | p99 |",
        "| --- | --- | --- |",
    ]
    for kind in KINDS:
        values = tally.latency_s.get(kind, [])
        lines.append(f"| {kind} (s) | {percentile(values, 0.5):.3f} | {percentile(values, 0.99):.3f} |")
    lines += [
        "",
        "| resident memory (MiB) | " + " | ".join(rss["start"]) + " |",
        "| --- |" + " --- |" * len(rss["start"]),
    ]
    for label, sample in rss.items():
        lines.append(f"| {label} | " + " | ".join(f"{v:.0f}" for v in sample.values()) + " |")
    lines.append("| growth after warm-up | " + " | ".join(f"{g:+.1%}" for g in growth.values()) + " |")
    verdict = (
        "met" if failed == 0 and max(growth.values()) < 0.05 and stats.num_kv_blocks_used == 0 else "NOT met"
    )
    lines += [
        "",
        f"KV blocks held once the load stopped: {stats.num_kv_blocks_used} of {stats.num_kv_blocks_total} "
        f"(running {stats.num_running}, waiting {stats.num_waiting}, preemptions {stats.num_preemptions}).",
        "Targets (no failure but the deliberate refusals, memory growth under 5% after warm-up, no block "
        f"held): **{verdict}**.",
    ]
    if tally.failure_samples:
        lines += ["", "First failures:", *[f"- `{s}`" for s in tally.failure_samples]]
    return "\n".join(lines)


def main() -> None:
    exit_on_sigterm()  # killed, it still stops the servers it started
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup-minutes", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--worker-threads", type=int, default=1)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    assert 1 <= args.warmup_minutes < args.minutes, "the warm-up must end before the load does"
    # One intra-op thread: on a machine shared with other work, OpenMP threads that wait at every barrier
    # for a descheduled sibling make each step many times slower.
    worker_env = {
        "WORKER_KV_CACHE_GB": "0.5",
        "WORKER_MAX_NUM_SEQS": str(args.concurrency),
        "WORKER_NUM_THREADS": str(args.worker_threads),
    }
    tally, rss = Tally(), {}
    with tempfile.TemporaryDirectory(prefix="soak-") as log_dir:
        stack = Stack(Path(log_dir), worker_env)
        try:
            stack.start()
            rss["start"] = stack.rss_mib()
            load_at_start = os.getloadavg()[0]
            began = time.monotonic()
            asyncio.run(run_load(stack, args, tally, rss))
            elapsed = time.monotonic() - began
            stats = stack.idle_stats()
            rss["end"] = stack.rss_mib()
            load = (load_at_start, os.getloadavg()[0])
            text = report(args, tally, rss, stats, stack.cache_hits(), elapsed, worker_env, load)
        finally:
            stack.stop()
    print(text)
    if args.write_docs:
        write_section("soak", text)


if __name__ == "__main__":
    main()
