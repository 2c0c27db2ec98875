"""Faults of the fleet under load: 2 gateways over 3 workers with the semantic cache on (one cache service,
one Redis), a steady streamed chat load through both, while one worker is killed (SIGKILL, then
restarted), one is stopped for 15 s (SIGSTOP, then SIGCONT), one gateway restarts (SIGTERM, drained,
started again), the cache service restarts (SIGTERM, started again) and Redis restarts (SIGTERM, started
again on the same port, empty: it keeps nothing on disk). Clients retry a request that a gateway refused
(5xx) or that never reached it on the other gateway, as the openai SDK's retries would. Every other
request repeats one of 8 questions (semantic-cache hits once stored), the rest are new.

Per fault: requests that failed (split: their stream had started before the fault, or not), how long the
streams on the faulted worker took to end with an error event, how long until both gateways took a
stopped worker out of routing (their `worker_routable` gauge), and output tok/s in the 10 s before each
fault and 10 s after it ended, and semantic-cache hits among the requests that started then. At the end:
KV blocks still held on each worker. Writes the `fleet-faults-<cpu kind>`
section of docs/BENCHMARKS.md (a run on another kind of CPU adds its own beside it).

    .venv/bin/python -m bench.fleet_faults [--runs 3] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
import urllib.request
from dataclasses import dataclass, field

import grpc
import httpx

from bench.fleet_bench import cpu_note
from bench.report import cpu_section, median, publish
from common.gen import worker_pb2, worker_pb2_grpc
from scripts.launch import (
    MODEL_NAME,
    ROOT,
    Service,
    exit_on_sigterm,
    start_cache_service,
    start_gateway,
    start_redis,
    start_worker,
)
from worker.model.cpu_kind import cpu_info

WORKER_ENV = {"WORKER_NUM_THREADS": "1", "WORKER_NUM_KV_BLOCKS": "400", "WORKER_MAX_NUM_SEQS": "16"}
CONCURRENCY = 6
CLIENTS = CONCURRENCY  # --clients: fewer for a check of the script
PACE = 1.0  # every wait of the scenario is scaled by this (--pace: a shorter check of the script itself)
MAX_TOKENS = 24


@dataclass
class Outcome:
    started: float
    ended: float
    ok: bool
    tokens: int
    first_token: float | None
    error: str = ""
    cache: str = ""  # the gateway's X-Semantic-Cache answer: hit, miss, bypass, or "" when none came


@dataclass
class Timeline:
    outcomes: list[Outcome] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)


async def one_stream(client: httpx.AsyncClient, urls: list[str], turn: int, t: Timeline) -> None:
    tenant, question = (turn % 12, turn) if turn % 2 else (0, turn // 2 % 8)  # even turns: 8 repeated
    body = {
        "model": MODEL_NAME,
        "messages": [
            {"role": "system", "content": f"You are the assistant of tenant {tenant}. " * 30},
            {"role": "user", "content": f"Question {question}: tell me a story."},
        ],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    started = time.monotonic()
    first, tokens, error, cache = None, 0, "", ""
    for attempt in range(2):  # the other gateway when this one refused or could not be reached
        url = urls[(turn + attempt) % len(urls)]
        error = ""
        try:
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                cache = response.headers.get("x-semantic-cache", "")
                if response.status_code != 200:
                    error = f"HTTP {response.status_code}"
                    if response.status_code >= 500:  # a draining gateway: the SDK retries these too
                        continue
                    break
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line.removeprefix("data: "))
                    if "error" in event:
                        error = event["error"].get("code") or "error"
                        break
                    if event["choices"] and event["choices"][0]["delta"].get("content"):
                        first = first or time.monotonic()
                        tokens += 1
                        t.token_times.append(time.monotonic())
                break
        except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
            error = type(exc).__name__
            if first is not None:
                break
    t.outcomes.append(Outcome(started, time.monotonic(), not error, tokens, first, error, cache))


async def load(urls: list[str], t: Timeline, stop: asyncio.Event) -> None:
    turns = iter(range(10**9))

    async def client_loop() -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            while not stop.is_set():
                await one_stream(client, urls, next(turns), t)

    await asyncio.gather(*(client_loop() for _ in range(CLIENTS)))


def routable(gateway: Service, worker: Service) -> float:
    with urllib.request.urlopen(f"{gateway.addr}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    prefix = "llmserve_gateway_worker_routable{"
    for line in text.splitlines():
        if line.startswith(prefix) and f'worker="{worker.addr}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def wait_out_of_routing(gateways: list[Service], worker: Service, since: float) -> float:
    while any(routable(g, worker) == 1 for g in gateways):
        await asyncio.sleep(0.1)
    return time.monotonic() - since


async def scenario(
    workers: list[Service], gateways: list[Service], cache: list[Service], t: Timeline
) -> dict[str, float]:
    """`cache`: the cache service and Redis."""
    found: dict[str, float] = {}
    await asyncio.sleep(15 * PACE)
    t.marks["kill"] = time.monotonic()
    workers[2].proc.kill()  # type: ignore[union-attr]
    await asyncio.sleep(10 * PACE)
    await asyncio.to_thread(workers[2].start)
    t.marks["kill_end"] = time.monotonic()
    await asyncio.sleep(15 * PACE)
    pid = workers[1].proc.pid  # type: ignore[union-attr]
    t.marks["stop"] = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    found["out_of_routing_s"] = await wait_out_of_routing(gateways, workers[1], t.marks["stop"])
    await asyncio.sleep(max(0.0, 15 * PACE - (time.monotonic() - t.marks["stop"])))
    os.kill(pid, signal.SIGCONT)
    t.marks["stop_end"] = time.monotonic()
    await asyncio.sleep(15 * PACE)
    t.marks["gateway"] = time.monotonic()
    await asyncio.to_thread(gateways[1].stop)
    await asyncio.to_thread(gateways[1].start)
    t.marks["gateway_end"] = time.monotonic()
    await asyncio.sleep(15 * PACE)
    for name, service in zip(("cache", "redis"), cache, strict=True):
        t.marks[name] = time.monotonic()
        await asyncio.to_thread(service.stop)
        await asyncio.to_thread(service.start)
        t.marks[f"{name}_end"] = time.monotonic()
        found[f"{name}_down_s"] = t.marks[f"{name}_end"] - t.marks[name]
        await asyncio.sleep(15 * PACE)
    return found


def tok_s(t: Timeline, start: float, end: float) -> float:
    return sum(1 for x in t.token_times if start <= x < end) / (end - start)


FAULTS = (  # (name, first mark, last mark); the restarts' names get their down time from the run
    ("SIGKILL a worker (restarted after 10 s)", "kill", "kill_end"),
    ("SIGSTOP a worker for 15 s", "stop", "stop_end"),
    ("restart a gateway (SIGTERM, drain, start)", "gateway", "gateway_end"),
    ("restart the cache service", "cache", "cache_end"),
    ("restart Redis, emptied", "redis", "redis_end"),
)


def fault_figures(t: Timeline, begin: str, end: str) -> dict:
    """One fault of one run: failed requests (their stream begun before it / begun during it or the 12 s
    after), the slowest failed stream's end from the fault, tok/s and cache hits 10 s before and after."""
    at, done = t.marks[begin], t.marks[end]
    during = [o for o in t.outcomes if o.ended >= at and o.started <= done + 12]
    failed_running = [o for o in during if not o.ok and o.started < at]
    failed_new = [o for o in during if not o.ok and o.started >= at]
    ends = [o.ended - at for o in failed_running if o.ended >= at]
    return {
        "failed_running": len(failed_running),
        "failed_new": len(failed_new),
        "stream_end_s": max(ends) if ends else None,
        "tok_s_before": tok_s(t, at - 10, at),
        "tok_s_after": tok_s(t, done, done + 10),
        "hits_before": cache_hits(t, at - 10, at),
        "hits_after": cache_hits(t, done, done + 10),
        "codes": sorted({o.error for o in failed_running + failed_new}),
        "down_s": done - at,
    }


def fault_row(name: str, runs: list[dict]) -> str:
    """Medians over the runs; failures also as their largest, since one failed request is one too many."""

    def mid(key: str, fmt: str = ".1f") -> str:
        return format(median([r[key] for r in runs]), fmt)

    def counts(key: str) -> str:
        values = [r[key] for r in runs]
        return f"{median(values):g} (at most {max(values)})"

    ends = [r["stream_end_s"] for r in runs if r["stream_end_s"] is not None]
    worst = f"{median(ends):.1f} s (at most {max(ends):.1f} s)" if ends else "-"
    codes = sorted({c for r in runs for c in r["codes"]})
    hits = ", ".join(
        f"{median([r[k][0] for r in runs]):g}/{median([r[k][1] for r in runs]):g}"
        for k in ("hits_before", "hits_after")
    )
    return (
        f"| {name} | {counts('failed_running')} | {counts('failed_new')} | {worst} | {mid('tok_s_before')} | "
        f"{mid('tok_s_after')} | {hits} | {', '.join(codes) or '-'} |"
    )


def cache_hits(t: Timeline, start: float, end: float) -> tuple[int, int]:
    """Semantic-cache hits among the requests started in [start, end), and how many of those got an answer."""
    started = [o for o in t.outcomes if start <= o.started < end and o.cache]
    return sum(o.cache == "hit" for o in started), len(started)


def kv_blocks_held(workers: list[Service]) -> list[int]:
    held = []
    for worker in workers:
        with grpc.insecure_channel(worker.addr) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            held.append(stub.GetStats(worker_pb2.StatsRequest(), timeout=30).num_kv_blocks_used)
    return held


async def run(
    workers: list[Service], gateways: list[Service], cache: list[Service]
) -> tuple[Timeline, dict[str, float]]:
    t = Timeline()
    stop = asyncio.Event()
    traffic = asyncio.create_task(load([g.addr for g in gateways], t, stop))
    try:
        found = await scenario(workers, gateways, cache, t)
    finally:
        stop.set()
        await traffic
    return t, found


def one_run() -> dict:
    """Start the fleet, run the scenario under load, stop everything; the run's figures."""
    log_dir = ROOT / ".run" / "fleet_faults"
    log_dir.mkdir(parents=True, exist_ok=True)
    workers: list[Service] = []
    gateways: list[Service] = []
    cache: list[Service] = []
    try:
        redis, redis_url = start_redis(log_dir, "faults-redis")
        cache = [start_cache_service("faults-cache", log_dir, redis_url), redis]
        workers = [start_worker(f"faults-worker-{i}", log_dir, **WORKER_ENV) for i in range(3)]
        addr = ",".join(w.addr for w in workers)
        cache_env = {"CACHE_ENABLED": "true", "CACHE_ADDR": cache[0].addr}
        gateways = [
            start_gateway(f"faults-gateway-{i}", log_dir, addr, ready=True, **cache_env) for i in range(2)
        ]
        t, found = asyncio.run(run(workers, gateways, cache))
        time.sleep(3)
        held = kv_blocks_held(workers)
    finally:
        for service in [*gateways, *workers, *cache]:
            if service.proc is not None and service.proc.poll() is None:
                os.kill(service.proc.pid, signal.SIGCONT)
            service.stop()
    return {
        "requests": len(t.outcomes),
        "faults": [fault_figures(t, begin, end) for _, begin, end in FAULTS],
        "out_of_routing_s": found["out_of_routing_s"],
        "held": held,
        "clients": CLIENTS,
        "pace": PACE,
    }


def recovery(fault: dict) -> str:
    """tok/s after the fault over tok/s before it, as text."""
    before = fault["tok_s_before"]
    return f"{fault['tok_s_after'] / before:.2f}" if before else "-"


def report(runs: list[dict]) -> list[str]:
    faults = [[r["faults"][i] for r in runs] for i in range(len(FAULTS))]
    names = [
        f"{name} (down {median([f['down_s'] for f in fault]):.1f} s)" if begin in ("cache", "redis") else name
        for (name, begin, _), fault in zip(FAULTS, faults, strict=True)
    ]
    out_of_routing = [r["out_of_routing_s"] for r in runs]
    return [
        f"## Fleet faults under load, CPU kind {cpu_info().kind}",
        "",
        f"`.venv/bin/python -m bench.fleet_faults --runs {len(runs)} --write-docs` on {cpu_note()}. "
        "2 gateways "
        "(GATEWAY_ROUTING=cache_aware, GATEWAY_STREAM_STALL_S=10, the semantic cache on: one cache service "
        f"over one Redis) over 3 workers (WORKER_NUM_THREADS=1); {runs[0]['clients']} clients stream chat "
        f"completions of {MAX_TOKENS} tokens through both gateways in turn, retrying on the other gateway "
        "when one cannot be reached; every other request repeats one of 8 questions, the rest are new. "
        f"{len(runs)} runs, each on a fresh fleet, of "
        f"{', '.join(str(r['requests']) for r in runs)} requests; each figure is the median over the runs "
        "(failures also the most in any run). Failed: requests whose stream had begun before the fault / "
        "requests started during the fault or the 12 s after it. Stream end: the slowest of the failed "
        "streams, from the fault to its error event. tok/s: the 10 s before the fault and the 10 s after "
        "it ended; cache hits: semantic-cache hits among the requests started in those 10 s.",
        "",
        "| fault | failed, started before | failed, started after | stream end | tok/s before | tok/s after "
        "| cache hits before, after | error codes |",
        "|---|---|---|---|---|---|---|---|",
        *(fault_row(name, fault) for name, fault in zip(names, faults, strict=True)),
        "",
        "Throughput back (tok/s in the 10 s after the fault ended over the 10 s before it), per run: "
        + "; ".join(
            f"{name.split(' (')[0]} {', '.join(recovery(f) for f in fault)}"
            for (name, _, _), fault in zip(FAULTS, faults, strict=True)
        )
        + ".",
        "",
        f"The stopped worker was out of routing on both gateways {median(out_of_routing):.1f} s after "
        f"SIGSTOP (the runs: {', '.join(f'{x:.1f}' for x in out_of_routing)} s). KV blocks held at the "
        f"end, per worker, per run: {', '.join(str(r['held']) for r in runs)}.",
    ]


def main() -> None:
    exit_on_sigterm()  # killed, it still stops the servers it started
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--pace", type=float, default=1.0, help="scale the scenario's waits (a check: 0.2)")
    parser.add_argument("--clients", type=int, default=CONCURRENCY)
    parser.add_argument("--runs", type=int, default=3, help="runs, each on a fresh fleet (medians reported)")
    args = parser.parse_args()
    global PACE, CLIENTS
    PACE, CLIENTS = args.pace, args.clients
    runs = []
    for _ in range(args.runs):
        runs.append(one_run())
        print(json.dumps(runs[-1]), flush=True)
    publish(cpu_section("fleet-faults", cpu_info().kind), report(runs), args.write_docs)


if __name__ == "__main__":
    main()
