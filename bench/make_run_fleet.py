"""The fleet issue's own load against `make run` as a user starts it: WORKERS=2 WORKER_NUM_KV_BLOCKS=400.

`make run` (scripts/run_stack.py) is started for each setting and policy in turn, with its embedded Redis,
the semantic cache, and every worker setting at its default but the KV blocks; then the multi-tenant load
of bench/fleet_bench.py (tenants each with their own ~460-token system prompt, chat requests in random
tenant order at a fixed concurrency) goes through its gateway. Two ways of placing the workers' threads:

- `split`: the stack's default, each worker on its own cores (WORKER_CPUS, common/cpus.py);
- `oversubscribed`: what the stack did before, every worker with torch's default thread count (one per
  physical core of the machine) on all the cores, set here as WORKER_NUM_THREADS.

Per run: the fleet's prefix-cache hit rate, TTFT p50, output tok/s. Runs of a round use the same tenant
order, each with fresh prompts; rounds alternate the order of the runs.

    .venv/bin/python -m bench.make_run_fleet [--rounds 1] [--write-docs] [--report-only]

Each run is appended to .run/make_run_fleet/results.jsonl; the table is made from every run there with the
same load (`--fresh` forgets them first), so rounds can be added later.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from bench.fleet_bench import TRACE, add_load_arguments, run_load, tenant_order, worker_stats
from bench.report import median, publish
from scripts.launch import ROOT, exit_on_sigterm, http_ok, stop_process
from worker.model.cpu_kind import cpu_info

GATEWAY = "http://127.0.0.1:8000"
WORKER_ADDRS = ["127.0.0.1:50051", "127.0.0.1:50061"]  # run_stack's ports for two workers
RESULTS = ROOT / ".run" / "make_run_fleet" / "results.jsonl"
PLACEMENTS = ("split", "oversubscribed")
MIN_HIT_TOKENS = 256  # of a ~500-token prompt: the tenant's system prompt was found in the prefix cache
POLICIES = ("round_robin", "cache_aware")


@dataclass
class Run:
    placement: str
    policy: str
    round_index: int
    load: str  # requests, tenants, concurrency, output tokens: runs of one load share a table
    hit_rate: float
    ttft_p50_s: float
    tok_s: float
    wall_s: float
    # where routing shows in the TTFT: the share of requests that found no cached prefix, and TTFT by
    # whether they did (0: runs recorded before these were)
    miss_share: float = 0.0
    ttft_p75_s: float = 0.0
    ttft_p90_s: float = 0.0
    ttft_mean_s: float = 0.0
    hit_ttft_p50_s: float = 0.0
    miss_ttft_p50_s: float = 0.0


def torch_default_threads() -> str:
    import torch

    return str(torch.get_num_threads())


def start_stack(placement: str, policy: str, log_path: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKER_", "GATEWAY_", "CACHE_"))}
    env |= {"WORKERS": "2", "WORKER_NUM_KV_BLOCKS": "400", "GATEWAY_ROUTING": policy, "HF_HUB_OFFLINE": "1"}
    if placement == "oversubscribed":
        env["WORKER_NUM_THREADS"] = torch_default_threads()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "scripts.run_stack"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 300
    while not http_ok(f"{GATEWAY}/ready"):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            raise RuntimeError(f"make run did not come up; see {log_path}")
        time.sleep(1)
    return proc


def measure(placement: str, policy: str, round_index: int, args: argparse.Namespace) -> Run:
    order = tenant_order(f"{args.seed}-r{round_index}", args, skewed=False)
    asyncio.run(run_load(GATEWAY, f"warm-up-{placement}-{policy}-{round_index}", [0, 1, 2, 3], args))
    before = worker_stats(WORKER_ADDRS)
    TRACE.clear()
    ttfts, tokens, wall = asyncio.run(
        run_load(GATEWAY, f"{args.seed}-{placement}-{policy}-{round_index}", order, args)
    )
    after = worker_stats(WORKER_ADDRS)
    hits = sum(a.prefix_cache_hits - b.prefix_cache_hits for a, b in zip(after, before, strict=True))
    queries = sum(a.prefix_cache_queries - b.prefix_cache_queries for a, b in zip(after, before, strict=True))
    hit_rate = hits / max(queries, 1)
    # a request hit when its system prompt came from the cache: more cached tokens than half the prompt
    hit_ttfts = [r["ttft"] for r in TRACE if r["cached"] >= MIN_HIT_TOKENS]
    miss_ttfts = [r["ttft"] for r in TRACE if r["cached"] < MIN_HIT_TOKENS]
    return Run(
        placement, policy, round_index, load_of(args), hit_rate, median(ttfts), tokens / wall, wall,
        miss_share=len(miss_ttfts) / max(len(TRACE), 1),
        ttft_p75_s=sorted(ttfts)[int(0.75 * (len(ttfts) - 1))],
        ttft_p90_s=sorted(ttfts)[int(0.9 * (len(ttfts) - 1))],
        ttft_mean_s=sum(ttfts) / len(ttfts),
        hit_ttft_p50_s=median(hit_ttfts) if hit_ttfts else 0.0,
        miss_ttft_p50_s=median(miss_ttfts) if miss_ttfts else 0.0,
    )  # fmt: skip


def load_results() -> list[Run]:
    return [Run(**json.loads(line)) for line in RESULTS.read_text().splitlines()] if RESULTS.exists() else []


def load_of(args: argparse.Namespace) -> str:
    return f"{args.requests}r-{args.tenants}t-c{args.concurrency}-{args.max_tokens}tok-{args.prompt_words}w"


def report(runs: list[Run], args: argparse.Namespace) -> list[str]:
    lines = [
        "## `make run` with two workers: threads split or oversubscribed",
        "",
        f"`.venv/bin/python -m bench.make_run_fleet --max-tokens {args.max_tokens} [--rounds N] "
        "[--placements ...]` (runs added up in its results file) "
        f"on CPU: {cpu_info().describe()}. `WORKERS=2 WORKER_NUM_KV_BLOCKS=400 make run` "
        "(scripts/run_stack.py, the semantic cache on), every other setting at its default; the fleet "
        f"issue's load through its gateway: {args.tenants} tenants with their own ~460-token system "
        f"prompts, {args.requests} chat requests in random tenant order at concurrency {args.concurrency}, "
        f"{args.max_tokens} output tokens each. split: the stack's default, each worker on its own cores; "
        "oversubscribed: every worker with torch's default thread count on all the cores, as the stack ran "
        "them before. Medians over rounds.",
        "",
        "| workers' threads | policy | runs | fleet hit rate | TTFT p50 | output tok/s |",
        "|---|---|---|---|---|---|",
    ]
    detailed = [r for r in runs if r.ttft_p75_s > 0]
    for placement in PLACEMENTS:
        for policy in POLICIES:
            mine = [r for r in runs if r.placement == placement and r.policy == policy]
            if mine:
                lines.append(
                    f"| {placement} | {policy} | {len(mine)} | {median([r.hit_rate for r in mine]):.0%} | "
                    f"{median([r.ttft_p50_s for r in mine]):.2f} s | {median([r.tok_s for r in mine]):.1f} |"
                )
    if detailed:
        lines += [
            "",
            "Where the policies differ in TTFT (the runs that recorded it): requests that found no cached "
            f"system prompt (fewer than {MIN_HIT_TOKENS} cached tokens), and TTFT by whether they did. While "
            "most requests under both policies are prefix hits, the median request is one under both; "
            "routing changes how many miss, so it shows where the misses start, at p75, and in the mean.",
            "",
            "| workers' threads | policy | runs | requests without a cached prefix | "
            "TTFT p50 / p75 / p90 / mean | TTFT p50, prefix hits / the rest |",
            "|---|---|---|---|---|---|",
        ]
        for placement in PLACEMENTS:
            for policy in POLICIES:
                mine = [r for r in detailed if r.placement == placement and r.policy == policy]
                if mine:
                    m = {
                        f: median([getattr(r, f) for r in mine])
                        for f in asdict(mine[0])
                        if f.endswith(("_s", "share"))
                    }
                    lines.append(
                        f"| {placement} | {policy} | {len(mine)} | {m['miss_share']:.0%} | "
                        f"{m['ttft_p50_s']:.3f} / {m['ttft_p75_s']:.3f} / {m['ttft_p90_s']:.3f} / "
                        f"{m['ttft_mean_s']:.3f} s | "
                        f"{m['hit_ttft_p50_s']:.3f} / {m['miss_ttft_p50_s']:.3f} s |"
                    )
    return lines


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    add_load_arguments(parser, requests=128, tenants=16, max_tokens=32)
    parser.add_argument("--placements", nargs="+", default=list(PLACEMENTS), choices=PLACEMENTS)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--fresh", action="store_true", help="forget the runs already in the results file")
    parser.add_argument("--report-only", action="store_true", help="the table from the results file alone")
    args = parser.parse_args()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh and RESULTS.exists():
        RESULTS.unlink()
    if not args.report_only:
        run_all(args)
    runs = [r for r in load_results() if r.load == load_of(args)]
    publish("make-run-fleet", report(runs, args), args.write_docs)


def run_all(args: argparse.Namespace) -> None:
    if http_ok(f"{GATEWAY}/ready"):
        sys.exit("a stack already answers on 127.0.0.1:8000; stop it first")
    log_dir = ROOT / ".run" / "make_run_fleet"
    log_dir.mkdir(parents=True, exist_ok=True)
    plan = [(p, q) for p in args.placements for q in POLICIES]
    done = [r.round_index for r in load_results() if r.load == load_of(args)]
    first = 1 + max(done, default=-1)  # each round a new tenant order
    for round_index in range(first, first + args.rounds):
        for placement, policy in plan if round_index % 2 == 0 else list(reversed(plan)):
            proc = start_stack(placement, policy, str(log_dir / f"{placement}-{policy}.log"))
            try:
                run = measure(placement, policy, round_index, args)
            finally:
                stop_process(proc, timeout_s=90)
            print(asdict(run), flush=True)
            with RESULTS.open("a") as out:
                out.write(json.dumps(asdict(run)) + "\n")


if __name__ == "__main__":
    main()
