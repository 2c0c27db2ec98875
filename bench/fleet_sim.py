"""A model of the fleet benchmark, to tune routing without the machine: N one-thread workers with LRU
prefix caches and chunked-prefill steps, closed-loop clients, and the gateway's own Router deciding.

Workers are modelled, not run: a step costs STEP_S + DECODE_S per decoding sequence + PREFILL_S per
prefilled token, slowed while more workers are busy than there are cores; the cache keeps each tenant's
prompt blocks, evicting the least recently used (a prompt's tail first). What it is for: comparing
policies and their settings on a tuning load (seed and tenant count of your choosing) before measuring
the chosen setting once, on the real stack and a different load (bench/fleet_bench.py). Its absolute
times are not measurements.

    .venv/bin/python -m bench.fleet_sim [--workers 2] [--tenants 16] [--seed tune]
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import OrderedDict
from dataclasses import dataclass, field

from gateway.routing.decay import Decayed, DecayedShares
from gateway.routing.router import Router, WorkerState
from gateway.worker_pool import RECENT_KEYS_REFRESH_S

BLOCK = 16
CHUNK = 512  # prefill tokens per step (max_num_batched_tokens)


@dataclass
class Request:
    tenant: int
    sent: float
    prompt: int  # tokens looked up
    cached: int = 0  # tokens found in the prefix cache
    prefilled: int = 0
    decoded: int = 0
    ttft: float | None = None


@dataclass
class Worker:
    addr: str
    capacity: int  # KV blocks
    tokens: Decayed
    cache: OrderedDict = field(default_factory=OrderedDict)  # (tenant, block) -> None, LRU first
    waiting: list[Request] = field(default_factory=list)
    running: list[Request] = field(default_factory=list)
    busy_until: float | None = None
    queries: int = 0
    hits: int = 0
    seen: set = field(default_factory=set)  # tenants whose prompt this worker computed once
    missed: dict = field(default_factory=dict)  # why prompt tokens missed -> how many

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)

    def look_up(self, req: Request, prompt_blocks: int) -> None:
        """When scheduled: the longest cached prefix of the tenant's blocks (only blocks already computed,
        so two requests of a tenant starting together on a cold worker both miss)."""
        n = 0
        while n < prompt_blocks and (req.tenant, n) in self.cache:
            self.cache.move_to_end((req.tenant, n))
            n += 1
        req.cached = min(n * BLOCK, req.prompt - 1)
        req.prefilled = req.cached
        if n < prompt_blocks:  # shared blocks missed: why
            if any(r.tenant == req.tenant and r.prefilled < r.prompt for r in self.running if r is not req):
                why = "concurrent"  # its prompt is being computed here right now
            elif req.tenant in self.seen:
                why = "evicted"
            else:
                why = "cold worker"  # first time here: a tenant's first request, or moved/spread here
            self.missed[why] = self.missed.get(why, 0) + (prompt_blocks - n) * BLOCK
        self.queries += req.prompt
        self.hits += req.cached
        self.tokens.add(req.prompt)
        self._evict()

    def computed(self, req: Request, prompt_blocks: int) -> None:
        """Prefill done: its prompt blocks are cached (touched tail first, so the tail is evicted first)."""
        self.seen.add(req.tenant)
        for b in range(prompt_blocks - 1, -1, -1):
            self.cache[(req.tenant, b)] = None
            self.cache.move_to_end((req.tenant, b))
        self._evict()

    def _evict(self) -> None:
        private = sum(3 + (r.prompt - r.cached) // BLOCK for r in self.running)  # uncached prompt + own
        while self.cache and len(self.cache) + private > self.capacity:
            self.cache.popitem(last=False)


def simulate(args: argparse.Namespace, router: Router, seed: str) -> dict:
    rng = random.Random(seed)
    now = 0.0
    clock = lambda: now  # noqa: E731
    workers = [
        Worker(f"10.0.0.{i + 1}:50051", args.kv_blocks, Decayed(args.half_life, clock))
        for i in range(args.workers)
    ]
    shares = DecayedShares(args.half_life, clock)
    prompt_tokens = args.prompt_tokens + args.question_tokens
    prompt_blocks = args.prompt_tokens // BLOCK

    def tenant_of(i: int) -> int:
        if args.skew and rng.random() < 0.5:
            return 0
        return rng.randrange(args.tenants)

    jobs = [tenant_of(i) for i in range(args.requests)]
    done: list[Request] = []
    recent: dict[str, float] = {}  # the recent keys as last taken...
    recent_at = float("-inf")  # ...and when

    def send(tenant: int) -> None:
        nonlocal recent, recent_at
        req = Request(tenant, now, prompt_tokens)
        states = [WorkerState(w.addr, w.load, 0, w.tokens.value()) for w in workers]
        in_flight = sum(r.tenant == tenant for w in workers for r in w.waiting + w.running)
        key = f"m\x1etenant-{seed}-{tenant}"
        shares.add(key)
        floor = args.share_floor
        if now - recent_at >= args.recent_refresh_s:  # as the gateway takes the recent keys (worker_pool.py)
            recent, recent_at = shares.recent(floor), now
        addr = router.order(key, states, in_flight, shares.share(key, floor), recent)[0]
        worker = next(w for w in workers if w.addr == addr)
        worker.waiting.append(req)

    for _ in range(args.concurrency):
        if jobs:
            send(jobs.pop())
    while any(w.load for w in workers):
        busy = sum(1 for w in workers if w.load)
        slow = max(1.0, busy / args.cores)
        for w in workers:  # start a step on every idle worker with work
            if w.busy_until is None and w.load:
                held = []
                for req in w.waiting:
                    if args.prefix_wait and any(
                        r.tenant == req.tenant and r.prefilled < r.prompt and not r.cached for r in w.running
                    ):  # the worker's scheduler: wait a step for the tenant's prefill in progress
                        held.append(req)
                        continue
                    w.running.append(req)
                    w.look_up(req, prompt_blocks)
                w.waiting = held
                budget, cost = CHUNK, args.step_s
                for req in w.running:
                    if req.prefilled < req.prompt:
                        take = min(budget, req.prompt - req.prefilled)
                        budget -= take
                        cost += take * args.prefill_s
                    else:
                        cost += args.decode_s
                w.busy_until = now + cost * slow
                w.plan = {id(r): r.prefilled < r.prompt for r in w.running}  # type: ignore[attr-defined]
        w = min((w for w in workers if w.busy_until is not None), key=lambda w: w.busy_until)
        now = w.busy_until
        w.busy_until = None
        budget = CHUNK
        for req in list(w.running):
            if w.plan[id(req)]:  # type: ignore[attr-defined]
                take = min(budget, req.prompt - req.prefilled)
                budget -= take
                req.prefilled += take
                if req.prefilled >= req.prompt:
                    req.ttft = now - req.sent
                    req.decoded = 1
                    w.computed(req, prompt_blocks)
            else:
                req.decoded += 1
            if req.decoded >= args.max_tokens:
                w.running.remove(req)
                done.append(req)
                if jobs:
                    send(jobs.pop())
    queries = [w.queries for w in workers]
    total = sum(queries)
    missed: dict[str, float] = {}
    for w in workers:
        for why, n in w.missed.items():
            missed[why] = missed.get(why, 0) + n / total
    firsts = len({r.tenant for r in done}) * prompt_blocks * BLOCK / total
    missed["cold worker, not first"] = missed.get("cold worker", 0) - firsts
    return {
        "missed": missed,
        "hit": sum(w.hits for w in workers) / total,
        "ttft": statistics.median(r.ttft for r in done if r.ttft is not None),
        "tok_s": len(done) * args.max_tokens / now,
        "shares": [q / total for q in queries],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--tenants", type=int, default=16)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=480)
    parser.add_argument("--question-tokens", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--kv-blocks", type=int, default=400)
    parser.add_argument("--step-s", type=float, default=0.02, help="a step's fixed cost on one thread")
    parser.add_argument("--decode-s", type=float, default=0.004, help="per sequence decoded in a step")
    parser.add_argument("--prefill-s", type=float, default=0.005, help="per prompt token prefilled")
    parser.add_argument("--skew", action="store_true", help="tenant 0 sends half the requests")
    parser.add_argument("--seed", default="tune")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--balance", type=float, nargs="*", default=[1.0, 1.25, 1.5, 2.0])
    parser.add_argument("--slack", type=int, nargs="*", default=[0])
    parser.add_argument("--hot-key-requests", type=int, nargs="*", default=[0])
    parser.add_argument("--hot-share", type=float, nargs="*", default=[0.0])
    parser.add_argument("--key-balance", type=float, nargs="*", default=[0.0])
    parser.add_argument("--share-floor", type=float, default=16.0, help="a key's share: of at least this")
    parser.add_argument("--half-life", type=float, default=30.0, help="of fading counts (model seconds)")
    parser.add_argument(
        "--recent-refresh-s",
        type=float,
        default=RECENT_KEYS_REFRESH_S,
        help="how often the recent keys are taken, as the gateway does (0: at every request)",
    )
    parser.add_argument(
        "--prefix-wait", action="store_true", help="a request waits for its tenant's prefill in progress"
    )
    args = parser.parse_args()
    configs = [("round_robin", 1.0, 0, 0, 0.0, 0.0)]
    configs += [
        ("cache_aware", b, s, h, f, k)
        for b in args.balance
        for s in args.slack
        for h in args.hot_key_requests
        for f in args.hot_share
        for k in args.key_balance
    ]
    for policy, balance, slack, hot, share, key_balance in configs:
        runs = []
        for i in range(args.repeats):
            router = Router(policy, balance, slack, hot, share, key_balance)
            runs.append(simulate(args, router, f"{args.seed}-{i}"))
        hit = statistics.median(r["hit"] for r in runs)
        ttft = statistics.median(r["ttft"] for r in runs)
        tok = statistics.median(r["tok_s"] for r in runs)
        largest = [max(r["shares"]) for r in runs]
        smallest = [min(r["shares"]) for r in runs]
        print(
            f"{policy:12s} b {balance:.2f} slack {slack} hot {hot} share {share:.2f} keys {key_balance:.2f}: "
            f"hit {hit:.0%} TTFT {ttft:.2f} tok/s {tok:.1f} largest {statistics.median(largest):.0%} "
            f"(at most {max(largest):.0%}) smallest {statistics.median(smallest):.0%}"
        )
        whys = sorted({why for r in runs for why in r["missed"]})
        missed = {why: statistics.median(r["missed"].get(why, 0.0) for r in runs) for why in whys}
        why_text = ", ".join(f"{k} {v:.1%}" for k, v in missed.items())
        print(f"    missed (median share of looked-up tokens): {why_text}")


if __name__ == "__main__":
    main()
