"""Routing across worker replicas: round_robin against cache_aware on the same multi-tenant load.

Tenants each with their own system prompt send chat requests in random tenant order (or, with the skewed
mix, one tenant half of them) at a fixed concurrency through one gateway per policy over the same workers,
whose KV cache is too small to hold every tenant's prompt (the prompts outgrow one worker's blocks). Per
run: the fleet's prefix-cache hit rate (hit tokens over looked-up tokens, all workers, from their
prefix_cache_hits / prefix_cache_queries counters), TTFT p50, output tok/s, and each worker's share of
looked-up tokens. Runs alternate between the policies; both policies of a round send the same tenant
order, with fresh prompts each run (salted per run), so no run hits what another left in the cache. Each
`--fleet WORKERS:KV_BLOCKS` is one set of workers; every run appends to a results file, and the docs
section (`fleet`) and the plot are written from all the runs in it, so a set can be run on its own.

    .venv/bin/python -m bench.fleet_bench [--fleet 2:300 --fleet 4:150 ...] [--rounds 3] [--skew-rounds 3]
        [--tenants 12] [--seed measure] [--fresh] [--write-docs] [--report-only]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import httpx

from bench.report import median, publish
from common.gen import worker_pb2, worker_pb2_grpc
from gateway.routing.config import RoutingConfig
from gateway.routing.router import ranking
from scripts.launch import MODEL_NAME, ROOT, Service, exit_on_sigterm, start_gateway, start_worker
from worker.model.cpu_kind import cpu_info

POLICIES = ("round_robin", "cache_aware")
VARIANTS = {  # more --policies, as gateway settings: cache_aware without its later rules, to compare
    "cache_aware_before": {
        "GATEWAY_ROUTING": "cache_aware",
        "GATEWAY_ROUTING_HOT_SHARE": "0",
        "GATEWAY_ROUTING_KEY_BALANCE": "0",
    },
    # the default before GATEWAY_ROUTING_HOT_KEY_REQUESTS went from 2 to 3
    "cache_aware_hot2": {"GATEWAY_ROUTING": "cache_aware", "GATEWAY_ROUTING_HOT_KEY_REQUESTS": "2"},
    # keys split evenly between workers, without the one key over the mean the default allows
    "cache_aware_even": {"GATEWAY_ROUTING": "cache_aware", "GATEWAY_ROUTING_KEY_BALANCE": "1.0"},
}
VARIANT_NOTES = {
    "cache_aware_before": "cache_aware_before: the same without the bounds on a key's share and on keys per "
    "worker (GATEWAY_ROUTING_HOT_SHARE=0, GATEWAY_ROUTING_KEY_BALANCE=0), as routing was before them",
    "cache_aware_hot2": "cache_aware_hot2: the same with GATEWAY_ROUTING_HOT_KEY_REQUESTS=2, the default "
    "before it became 3",
    "cache_aware_even": "cache_aware_even: the same with GATEWAY_ROUTING_KEY_BALANCE=1.0 (keys split evenly, "
    "none over the mean)",
}


def cpu_note(described: Iterable[str] = ()) -> str:
    """The CPU the figures came from: the runs' own (recorded with each), else this machine's."""
    cpus = sorted(set(described)) or [cpu_info().describe()]
    return f"CPU: {'; '.join(cpus)}, {os.cpu_count()} cores"


BLOCK = 16  # the workers' KV block size (tokens), the unit a prefix cache hits in
WORKER_ENV = {"WORKER_NUM_THREADS": "1", "WORKER_MAX_NUM_SEQS": "16"}
RESULTS = ROOT / ".run" / "fleet_bench" / "results.jsonl"
TRACES = ROOT / ".run" / "fleet_bench" / "traces.jsonl"  # per request: tenant, times, cached tokens
TRACE: list[dict] = []
PLOT = ROOT / "docs" / "bench" / "fleet" / "fleet-routing.png"
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
    workers: int
    kv_blocks: int
    mix: str  # "uniform" or "skewed" (tenant 0 sends half the requests)
    round: int
    seed: str
    tenants: int
    requests: int
    prompt_tokens: int  # each system prompt's length
    hit_rate: float
    ttft_p50_s: float
    tokens_per_s: float
    shares: list[float]  # each worker's share of looked-up tokens
    wall_s: float
    attainable: float = 0.0  # the hit rate with every tenant's prompt cached after its first request
    cpu: str = ""  # the CPU it ran on (worker/model/cpu_kind.py); runs recorded before this field: ""


def system_prompt(salt: str, tenant: int, words: int) -> str:
    rng = random.Random(f"{salt}-{tenant}")
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"[{salt}] You are the assistant of tenant {tenant}. Follow these house rules: {body}."


def worker_stats(addrs: list[str]) -> list[worker_pb2.Stats]:
    stats = []
    for addr in addrs:
        with grpc.insecure_channel(addr) as channel:
            stats.append(worker_pb2_grpc.WorkerStub(channel).GetStats(worker_pb2.StatsRequest(), timeout=30))
    return stats


def all_routable(url: str, addrs: list[str]) -> bool:
    """Whether the gateway takes every worker in routing (load reports from all of them)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith("llmserve_gateway_worker_routable{")]
    return all(any(f'worker="{a}"' in line and line.endswith(" 1.0") for line in lines) for a in addrs)


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
    ttft, tokens, cached = None, 0, 0
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
                cached = (event["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    ttft = ttft if ttft is not None else time.perf_counter() - start
    TRACE.append(
        {"tenant": hash(system), "start": start, "end": time.perf_counter(), "cached": cached, "ttft": ttft}
    )
    return ttft, tokens


def shared_tokens(url: str, system: str) -> int:
    """Tokens of the rendered chat that every request of this tenant shares, whole blocks only (what a
    prefix cache can hit): the common start of two renderings that differ in the question."""
    rendered = []
    for question in ("Question 1: a?", "Question 2: b?"):
        body = {
            "model": MODEL_NAME,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        }
        rendered.append(httpx.post(f"{url}/tokenize", json=body, timeout=60).json()["tokens"])
    common = next((i for i, (a, b) in enumerate(zip(*rendered, strict=False)) if a != b), 0)
    return common // BLOCK * BLOCK


def tenant_order(seed: str, args: argparse.Namespace, skewed: bool) -> list[int]:
    """The tenants of the requests in order; skewed: tenant 0 sends half of them."""
    rng = random.Random(seed)
    if not skewed:
        return [rng.randrange(args.tenants) for _ in range(args.requests)]
    return [0 if rng.random() < 0.5 else rng.randrange(1, args.tenants) for _ in range(args.requests)]


async def run_load(
    url: str, salt: str, order: list[int], args: argparse.Namespace
) -> tuple[list[float], int, float]:
    prompts = [system_prompt(salt, t, args.prompt_words) for t in range(args.tenants)]
    queue: asyncio.Queue = asyncio.Queue()
    for i, tenant in enumerate(order):
        queue.put_nowait((tenant, f"Question {i}: what should I do about order {i}?"))
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


def measure(
    policy: str,
    url: str,
    addrs: list[str],
    fleet: tuple[int, int],
    mix: str,
    round_index: int,
    args: argparse.Namespace,
) -> RunResult:
    """One run; `fleet`: the KV blocks of each worker and the system prompt's length in tokens."""
    kv_blocks, prompt_tokens = fleet
    order_seed = f"{args.seed}-{len(addrs)}w-{mix}-r{round_index}"  # the same order for both policies
    order = tenant_order(order_seed, args, mix == "skewed")
    before = worker_stats(addrs)
    salt = f"{order_seed}-{policy}"
    TRACE.clear()
    ttfts, tokens, wall = asyncio.run(run_load(url, salt, order, args))
    with TRACES.open("a") as out:
        out.write(json.dumps({"run": f"{salt}-{len(addrs)}w", "requests": TRACE}) + "\n")
    after = worker_stats(addrs)
    queries = [a.prefix_cache_queries - b.prefix_cache_queries for a, b in zip(after, before, strict=True)]
    hits = [a.prefix_cache_hits - b.prefix_cache_hits for a, b in zip(after, before, strict=True)]
    total = max(sum(queries), 1)
    shared = {t: shared_tokens(url, system_prompt(salt, t, args.prompt_words)) for t in set(order)}
    attainable = sum(shared[t] for t in order) - sum(shared.values())  # each tenant's first misses
    return RunResult(
        policy,
        len(addrs),
        kv_blocks,
        mix,
        round_index,
        args.seed,
        args.tenants,
        args.requests,
        prompt_tokens,
        sum(hits) / total,
        median(ttfts),
        tokens / wall,
        [q / total for q in queries],
        wall,
        attainable / total,
        cpu_info().describe(),
    )


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


def load_results() -> list[RunResult]:
    if not RESULTS.exists():
        return []
    return [RunResult(**json.loads(line)) for line in RESULTS.read_text().splitlines() if line.strip()]


def summary(runs: list[RunResult]) -> dict[str, float | list[float] | int]:
    """Medians over the runs; shares: each worker's median share, sorted from the largest."""
    width = runs[0].workers
    shares = sorted((median([r.shares[i] for r in runs]) for i in range(width)), reverse=True)
    return {
        "hit_rate": median([r.hit_rate for r in runs]),
        "ttft": median([r.ttft_p50_s for r in runs]),
        "speed": median([r.tokens_per_s for r in runs]),
        "attainable": median([r.attainable for r in runs]),
        "largest": median([max(r.shares) for r in runs]),
        "smallest": median([min(r.shares) for r in runs]),
        "shares": shares,
        "runs": len(runs),
    }


def groups(results: list[RunResult]) -> dict[tuple[int, int, str], dict[str, list[RunResult]]]:
    out: dict[tuple[int, int, str], dict[str, list[RunResult]]] = {}
    for r in results:
        out.setdefault((r.workers, r.kv_blocks, r.mix), {}).setdefault(r.policy, []).append(r)
    return dict(sorted(out.items(), key=lambda item: (item[0][0], item[0][1], item[0][2] != "uniform")))


def plot(results: list[RunResult]) -> Path | None:
    """Hit rate and TTFT p50 against the number of workers, both policies (uniform mix, medians)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = {k: v for k, v in groups(results).items() if k[2] == "uniform"}
    if not table:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for policy in POLICIES:
        points = sorted((k[0], summary(v[policy])) for k, v in table.items() if policy in v)
        xs = [w for w, _ in points]
        axes[0].plot(xs, [100 * s["hit_rate"] for _, s in points], marker="o", label=policy)
        axes[1].plot(xs, [s["ttft"] for _, s in points], marker="o", label=policy)
    for ax, label in zip(axes, ("fleet prefix-cache hit rate (%)", "TTFT p50 (s)"), strict=True):
        ax.set_xlabel("workers")
        ax.set_xticks(sorted({k[0] for k in table}))
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylim(0, 100)
    axes[1].set_ylim(bottom=0)
    fig.suptitle("round_robin vs cache_aware, SmolLM2-135M, one-thread workers on 2 shared cores")
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=90)
    plt.close(fig)
    return PLOT


def commands(results: list[RunResult]) -> str:
    """The invocations that made these runs, one per fleet (rounds as found in the results)."""
    first = results[0]
    out = []
    for workers, kv_blocks in sorted({(r.workers, r.kv_blocks) for r in results}):
        runs = [r for r in results if (r.workers, r.kv_blocks) == (workers, kv_blocks)]
        rounds = len({r.round for r in runs if r.mix == "uniform"})
        skewed = len({r.round for r in runs if r.mix == "skewed"})
        policies = [p for p in (*POLICIES, *VARIANTS) if any(r.policy == p for r in runs)]
        out.append(
            f"`.venv/bin/python -m bench.fleet_bench --fleet {workers}:{kv_blocks} --rounds {rounds} "
            f"--skew-rounds {skewed} --tenants {first.tenants} --requests {first.requests} "
            f"--seed {first.seed} --policies {' '.join(policies)}`"
        )
    return ", ".join(out) + " (then `--report-only --write-docs`)"


def report(results: list[RunResult], args: argparse.Namespace) -> list[str]:
    first = results[0]
    routing = RoutingConfig()
    lines = [
        "## Fleet routing: round_robin vs cache_aware",
        "",
        f"{commands(results)}, on {cpu_note(r.cpu for r in results if r.cpu)}; each worker "
        "WORKER_NUM_THREADS=1.",
        "",
        f"Measuring load: seed `{first.seed}`, {first.tenants} tenants, each with its own "
        f"{first.prompt_tokens}-token system prompt; {first.requests} chat requests "
        f"({first.requests // first.tenants} per tenant, as the issue's 128 over 16) in random tenant "
        f"order at concurrency {args.concurrency}, {args.max_tokens} output tokens "
        "each, one gateway per policy over the same workers; cache_aware with the defaults "
        f"(GATEWAY_ROUTING_BALANCE={routing.balance:g}, GATEWAY_ROUTING_SLACK={routing.slack}, "
        f"GATEWAY_ROUTING_HOT_KEY_REQUESTS={routing.hot_key_requests}, "
        f"GATEWAY_ROUTING_HOT_SHARE={routing.hot_share:g}, "
        f"GATEWAY_ROUTING_KEY_BALANCE={routing.key_balance:g}, "
        f"GATEWAY_ROUTING_HALF_LIFE_S={routing.half_life_s:g}), "
        "which were tuned on another load (fleet notes below)"
        + "".join(f"; {VARIANT_NOTES[v]}" for v in VARIANTS if any(r.policy == v for r in results))
        + ". Every fleet holds about "
        f"{first.workers * first.kv_blocks} KV blocks in all (WORKER_NUM_KV_BLOCKS per worker in each row, "
        f"16-token blocks) against the {first.tenants * (first.prompt_tokens // BLOCK + 1)} the tenants' "
        "prompts need, about the issue's ratio (800 against 496), so from two workers on the prompts outgrow "
        "one worker. Hit rate: hit tokens / looked-up tokens over all workers (their prefix_cache_hits / "
        "prefix_cache_queries). Attainable: the hit rate if every request but each tenant's first found all "
        "its tenant's shared whole blocks cached (from /tokenize): the ceiling of any policy on that load. "
        "Medians over the runs; rounds interleave the policies, both policies of a round send the same "
        "tenant order, each run with fresh prompts, after a warm-up of the fresh workers. Shares: each "
        "worker's share of the looked-up tokens, largest first; largest / mean: the largest share over "
        "1 / workers. Skewed: tenant 0 sends half the requests.",
        "",
        "| workers x KV blocks | mix | policy | runs | fleet hit rate | attainable | TTFT p50 | output tok/s "
        "| shares | largest / mean |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (workers, kv_blocks, mix), by_policy in groups(results).items():
        for policy in (*POLICIES, *VARIANTS):
            if policy not in by_policy:
                continue
            s = summary(by_policy[policy])
            shares = " / ".join(f"{x:.0%}" for x in s["shares"])  # type: ignore[union-attr]
            lines.append(
                f"| {workers} x {kv_blocks} | {mix} | {policy} | {s['runs']} | {s['hit_rate']:.0%} | "
                f"{s['attainable']:.0%} | {s['ttft']:.2f} s | {s['speed']:.1f} | {shares} | "
                f"{s['largest'] * workers:.2f}x |"
            )
    path = plot(results)
    if path is not None:
        lines += ["", f"![fleet routing: hit rate and TTFT against workers](bench/fleet/{path.name})"]
    return [*lines, "", key_movement()]


def add_load_arguments(parser: argparse.ArgumentParser, requests: int, tenants: int, max_tokens: int) -> None:
    """The multi-tenant load's flags, as run_load and tenant_order read them."""
    parser.add_argument("--requests", type=int, default=requests)
    parser.add_argument("--tenants", type=int, default=tenants)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=max_tokens)
    parser.add_argument("--prompt-words", type=int, default=435)  # about 460 tokens, as the 480
    parser.add_argument("--seed", default="measure")


def run_fleet(workers: int, kv_blocks: int, args: argparse.Namespace) -> None:
    """Start `workers` workers and a gateway per policy, run the rounds, append each run to RESULTS."""
    log_dir = ROOT / ".run" / "fleet_bench"
    log_dir.mkdir(parents=True, exist_ok=True)
    services: list[Service] = []
    env = WORKER_ENV | {"WORKER_NUM_KV_BLOCKS": str(kv_blocks)}
    try:
        started = [start_worker(f"fleet-worker-{i}", log_dir, **env) for i in range(workers)]
        services += started
        addrs = [w.addr for w in started]
        policies = tuple(args.policies)
        gateways = {
            p: start_gateway(
                f"fleet-gateway-{p}",
                log_dir,
                ",".join(addrs),
                ready=True,
                **VARIANTS.get(p, {"GATEWAY_ROUTING": p}),
            )
            for p in policies
        }
        services += gateways.values()
        count = httpx.post(
            f"{gateways[policies[0]].addr}/tokenize",
            json={"model": MODEL_NAME, "prompt": system_prompt("x", 0, args.prompt_words)},
            timeout=60,
        ).json()["count"]
        for policy in policies:  # a fresh worker's first steps are slow: not part of any run
            asyncio.run(run_load(gateways[policy].addr, f"warm-up-{policy}", list(range(workers)) * 2, args))
        plan = [("uniform", r) for r in range(args.rounds)] + [("skewed", r) for r in range(args.skew_rounds)]
        for index, (mix, round_index) in enumerate(plan):
            for policy in policies if index % 2 == 0 else tuple(reversed(policies)):
                # A fresh gateway per run: its fading counts of each worker's recent tokens and each key's
                # share would otherwise start from the run before (another policy's, on these workers).
                gateways[policy].stop()
                gateways[policy].start()
                gateways[policy].wait_until(lambda g=gateways[policy]: all_routable(g.addr, addrs))
                fleet = (kv_blocks, count)
                result = measure(policy, gateways[policy].addr, addrs, fleet, mix, round_index, args)
                print(result, flush=True)
                with RESULTS.open("a") as out:
                    out.write(json.dumps(asdict(result)) + "\n")
    finally:
        for service in reversed(services):
            service.stop()


def main() -> None:
    exit_on_sigterm()  # killed, it still stops the servers it started
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--fleet", action="append", help="WORKERS:KV_BLOCKS, repeatable (2:300 4:150 1:600 3:200)"
    )
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=[*POLICIES, *VARIANTS])
    parser.add_argument("--rounds", type=int, default=3, help="uniform-mix rounds per fleet")
    parser.add_argument("--skew-rounds", type=int, default=3, help="skewed-mix rounds per fleet")
    add_load_arguments(parser, requests=96, tenants=12, max_tokens=8)
    parser.add_argument("--fresh", action="store_true", help="forget the runs already in the results file")
    parser.add_argument("--report-only", action="store_true", help="write the section from the results file")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh and RESULTS.exists():
        RESULTS.unlink()
    if not args.report_only:
        for spec in args.fleet or ["2:300", "4:150", "1:600", "3:200"]:
            workers, kv_blocks = (int(x) for x in spec.split(":"))
            run_fleet(workers, kv_blocks, args)
    results = load_results()
    if results:
        publish("fleet", report(results, args), args.write_docs)


if __name__ == "__main__":
    main()
