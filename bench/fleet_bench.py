"""Routing across worker replicas: round_robin against cache_aware on the same multi-tenant load.

16 tenants, each with its own ~480-token system prompt; 128 chat requests in random tenant order at
concurrency 4 through one gateway over 2 workers with WORKER_NUM_KV_BLOCKS=400 each (6,400 tokens: the 16
prompts, ~7,700 tokens, do not fit in one worker). Per run: the fleet's prefix-cache hit rate (hit tokens
over looked-up tokens, both workers, from their prefix_cache_hits / prefix_cache_queries counters), TTFT
p50, output tok/s, and each worker's share of looked-up tokens. Both gateways run over the same two
workers; runs alternate between the policies, and every run uses fresh tenants (their prompts start with
the run's own salt), so no run hits what another left in the cache. Writes the `fleet` section of
docs/BENCHMARKS.md.

    .venv/bin/python -m bench.fleet_bench [--rounds 1] [--requests 128] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx

from bench.report import median, publish
from common.gen import worker_pb2, worker_pb2_grpc
from gateway.routing.router import ranking
from scripts.launch import MODEL_NAME, ROOT, Service, start_gateway, start_worker

POLICIES = ("round_robin", "cache_aware")
WORKER_ENV = {"WORKER_NUM_KV_BLOCKS": "400", "WORKER_NUM_THREADS": "1", "WORKER_MAX_NUM_SEQS": "16"}
WORDS = (
    "account billing invoice customer order refund policy shipping delivery product warranty support ticket "
    "priority escalate agent answer question clear polite brief detail step guide rule exception manager "
    "approve reject review payment card bank transfer currency tax region country store online return item "
    "damaged missing late early schedule window address contact email phone chat hours weekend holiday "
    "discount coupon member loyalty points tier upgrade downgrade cancel renew plan monthly yearly trial"
).split()


@dataclass
class RunResult:
    policy: str
    hit_rate: float
    ttft_p50_s: float
    tokens_per_s: float
    shares: list[float]  # each worker's share of looked-up tokens


def system_prompt(salt: str, tenant: int, words: int) -> str:
    rng = random.Random(f"{salt}-{tenant}")
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"[{salt}] You are the assistant of tenant {tenant}. Follow these house rules: {body}."


def cpu_name() -> str:
    """The CPU's model name and the vector extensions that matter to the kernels."""
    name, flags = platform.processor() or "unknown CPU", set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")
    have = [f for f in wanted if f in flags]
    return f"{name} ({', '.join(have) or 'no AVX2'}{'' if 'amx_tile' in flags else ', no AMX'})"


def worker_stats(addrs: list[str]) -> list[worker_pb2.Stats]:
    stats = []
    for addr in addrs:
        with grpc.insecure_channel(addr) as channel:
            stats.append(worker_pb2_grpc.WorkerStub(channel).GetStats(worker_pb2.StatsRequest(), timeout=30))
    return stats


async def one_request(
    client: httpx.AsyncClient, system: str, question: str, max_tokens: int
) -> tuple[float, int]:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft, tokens = None, 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line.removeprefix("data: "))
            if ttft is None and event.get("choices") and event["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - start
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return (ttft if ttft is not None else time.perf_counter() - start), tokens


async def run_load(url: str, salt: str, args: argparse.Namespace) -> tuple[list[float], int, float]:
    rng = random.Random(salt)
    prompts = [system_prompt(salt, t, args.prompt_words) for t in range(args.tenants)]
    jobs = [
        (rng.randrange(args.tenants), f"Question {i}: what should I do about order {i}?")
        for i in range(args.requests)
    ]
    queue: asyncio.Queue = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    ttfts: list[float] = []
    tokens = 0

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal tokens
        while not queue.empty():
            tenant, question = queue.get_nowait()
            ttft, n = await one_request(client, prompts[tenant], question, args.max_tokens)
            ttfts.append(ttft)
            tokens += n

    start = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(args.concurrency)))
    return ttfts, tokens, time.perf_counter() - start


def measure(policy: str, url: str, addrs: list[str], salt: str, args: argparse.Namespace) -> RunResult:
    before = worker_stats(addrs)
    ttfts, tokens, wall = asyncio.run(run_load(url, salt, args))
    after = worker_stats(addrs)
    queries = [a.prefix_cache_queries - b.prefix_cache_queries for a, b in zip(after, before, strict=True)]
    hits = [a.prefix_cache_hits - b.prefix_cache_hits for a, b in zip(after, before, strict=True)]
    total = max(sum(queries), 1)
    return RunResult(policy, sum(hits) / total, median(ttfts), tokens / wall, [q / total for q in queries])


def key_movement(num_keys: int = 20_000) -> str:
    """How many keys change owner when a fifth worker joins four, or one of four leaves (pure routing)."""
    keys = [f"{MODEL_NAME}\x1etenant-{i}" for i in range(num_keys)]
    four = [f"10.0.0.{i}:50051" for i in range(1, 5)]

    def owners(addrs: list[str]) -> list[str]:
        return [ranking(key, addrs)[0] for key in keys]

    before, joined, left = owners(four), owners([*four, "10.0.0.9:50051"]), owners(four[1:])
    join = sum(a != b for a, b in zip(before, joined, strict=True)) / num_keys
    leave = sum(a != b for a, b in zip(before, left, strict=True)) / num_keys
    leavers = sum(a == four[0] for a in before) / num_keys
    return (
        f"Key movement ({num_keys:,} keys over 4 workers, gateway/routing/router.py): a fifth worker joining "
        f"takes {join:.1%} of the keys (1/5 is ideal), a worker leaving moves {leave:.1%}, which is exactly "
        f"its own share ({leavers:.1%}): no other key moves."
    )


def report(results: list[RunResult], args: argparse.Namespace, prompt_tokens: int) -> list[str]:
    command = f"--rounds {args.rounds} --requests {args.requests} --write-docs"
    lines = [
        "## Fleet routing: round_robin vs cache_aware",
        "",
        f"`.venv/bin/python -m bench.fleet_bench {command}` on {cpu_name()} (2 cores shared with other "
        "work; each worker WORKER_NUM_THREADS=1).",
        f"{args.tenants} tenants, each with its own {prompt_tokens}-token system prompt; {args.requests} "
        f"chat requests in random tenant order at concurrency {args.concurrency}, {args.max_tokens} output "
        f"tokens each; one gateway per policy over the same {args.workers} workers with "
        "WORKER_NUM_KV_BLOCKS=400 (16-token blocks: 6,400 tokens each). Hit rate: hit tokens / looked-up "
        "tokens over all workers (their prefix_cache_hits / prefix_cache_queries). Medians over the rounds "
        "(runs interleaved, fresh tenants each run).",
        "",
        "| policy | fleet prefix-cache hit rate | TTFT p50 | output tok/s | each worker's share of lookups |",
        "|---|---|---|---|---|",
    ]
    for policy in POLICIES:
        runs = [r for r in results if r.policy == policy]
        hit_rate = median([r.hit_rate for r in runs])
        ttft = median([r.ttft_p50_s for r in runs])
        speed = median([r.tokens_per_s for r in runs])
        shares = " / ".join(f"{median([r.shares[i] for r in runs]):.0%}" for i in range(args.workers))
        lines.append(f"| {policy} | {hit_rate:.0%} | {ttft:.2f} s | {speed:.1f} | {shares} |")
    return [*lines, "", key_movement()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--tenants", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--prompt-words", type=int, default=450)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    log_dir = ROOT / ".run" / "fleet_bench"
    log_dir.mkdir(parents=True, exist_ok=True)
    services: list[Service] = []
    try:
        workers = [start_worker(f"fleet-worker-{i}", log_dir, **WORKER_ENV) for i in range(args.workers)]
        services += workers
        addrs = [w.addr for w in workers]
        gateways = {
            p: start_gateway(f"fleet-gateway-{p}", log_dir, ",".join(addrs), ready=True, GATEWAY_ROUTING=p)
            for p in POLICIES
        }
        services += gateways.values()
        count = httpx.post(
            f"{gateways['cache_aware'].addr}/tokenize",
            json={"model": MODEL_NAME, "prompt": system_prompt("x", 0, args.prompt_words)},
            timeout=60,
        ).json()["count"]
        results = []
        for round_index in range(args.rounds):
            for policy in POLICIES if round_index % 2 == 0 else reversed(POLICIES):
                salt = f"r{round_index}-{policy}"
                result = measure(policy, gateways[policy].addr, addrs, salt, args)
                print(result, flush=True)
                results.append(result)
        publish("fleet", report(results, args, count), args.write_docs)
    finally:
        for service in reversed(services):
            service.stop()


if __name__ == "__main__":
    main()
