"""Where a sequence's KV blocks lie in the pool, and what it costs: the block manager's placement (a request's
next block is the free one after its last, a cached one first moved into the LRU victim by a block copy;
worker/engine/block_manager.py) against plain LRU order.

    simulation  the scheduler and block manager alone, no model. Churn: 64 clients in a closed loop, prompts
                of 88-168 random tokens, 128 output tokens; the share of a running sequence's next blocks that
                follow its last in the pool. Conversations: 64 clients, a 200-token system prompt, each
                conversation four turns, each turn's prompt the last one's tokens and answer plus 10-60 new
                tokens, sent 5-200 steps after the answer; the share of prompt tokens hit in the prefix
                cache, with pools of 700, 1200 and 2912 blocks (2912: the default 1 GB), and the block
                copies a step (368 KB each for the bundled model in bfloat16).
    attention   the compiled decode attention over 30 layers of the bundled model's shape (3 KV heads of 64),
                64 sequences, the block tables each policy left in the churn run, against tables of
                consecutive blocks.
    --engine    the engine in process with the bundled model: 64 streams, prompts of 64-192 random tokens
                and 64-192 output tokens, 256 requests a round, the two policies taking turns.

    .venv/bin/python -m bench.block_placement [--engine] [--rounds 4] [--write-docs]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from bench.closed_loop import closed_loop
from bench.report import cpu_section, publish
from worker.engine.block_manager import BlockManager
from worker.engine.config import SchedulerConfig
from worker.engine.request import Request
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler import Scheduler
from worker.model.cpu_kind import cpu_info

BLOCK_SIZE = 16
DEFAULT_BLOCKS = 2912  # the bundled model's pool at the default kv_cache_memory_gb=1.0 in bfloat16
CLIENTS = 64


class LruOrder(BlockManager):
    """The placement before: every fresh block is the least recently freed one (one allocation's still in
    ascending order, which only helps it)."""

    def _pop_free(self, after: int | None) -> int:
        return super()._pop_free(None)


POLICIES = {"LRU order": LruOrder, "next block after the last, cached ones moved": BlockManager}


class Simulation:
    """The scheduler over one policy's block manager; each sampled token is a fixed function of the step."""

    def __init__(self, manager: type[BlockManager], num_blocks: int, seed: int) -> None:
        config = SchedulerConfig(max_num_seqs=CLIENTS, max_num_batched_tokens=512, max_model_len=4096)
        self.scheduler = Scheduler(config, manager(num_blocks, BLOCK_SIZE))
        self.rng = random.Random(seed)
        self.sent = self.copies = self.steps = 0

    def tokens(self, count: int) -> list[int]:
        return [self.rng.randint(1, 40000) for _ in range(count)]

    def add(self, prompt: list[int], max_tokens: int) -> Request:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        request = Request(f"sim-{self.sent}", prompt, params, eos_token_id=None, max_tokens=max_tokens)
        self.sent += 1
        self.scheduler.add_request(request)
        return request

    def step(self) -> list[Request]:
        """One step; the requests it finished."""
        plan = self.scheduler.schedule()
        self.copies += len(plan.block_copies)
        self.steps += 1
        sampled = [s.request for s in plan.scheduled if s.samples]
        self.scheduler.update_from_output(plan, {r.request_id: self.sent % 97 + 3 for r in sampled})
        return [r for r in sampled if r.is_finished]


def churn(manager: type[BlockManager], steps: int = 2500) -> tuple[float, list[list[int]]]:
    """The share of next blocks adjacent in the pool over the run's second half, and the last block tables."""
    sim = Simulation(manager, DEFAULT_BLOCKS, seed=0)
    for _ in range(CLIENTS):
        sim.add(sim.tokens(sim.rng.randint(88, 168)), 128)
    adjacent = pairs = 0
    for step in range(steps):
        for _ in sim.step():
            sim.add(sim.tokens(sim.rng.randint(88, 168)), 128)
        if step >= steps // 2 and step % 10 == 0:
            for request in sim.scheduler.running:
                table = request.block_ids
                pairs += len(table) - 1
                adjacent += sum(b == a + 1 for a, b in zip(table, table[1:], strict=False))
    return adjacent / pairs, [list(r.block_ids) for r in sim.scheduler.running]


def conversations(manager: type[BlockManager], num_blocks: int, steps: int = 2500) -> tuple[float, float]:
    """The share of prompt tokens found in the prefix cache, and the block copies a step."""
    sim = Simulation(manager, num_blocks, seed=1)
    system = sim.tokens(200)
    turns: dict[str, int] = {}
    due: list[tuple[int, list[int], int]] = []

    def start(prompt: list[int], turn: int) -> None:
        turns[sim.add(prompt, sim.rng.randint(32, 160)).request_id] = turn

    for _ in range(CLIENTS):
        start(system + sim.tokens(sim.rng.randint(20, 120)), 0)
    for step in range(steps):
        for request in sim.step():
            turn = turns.pop(request.request_id)
            if turn < 3:
                follow = request.all_token_ids + sim.tokens(sim.rng.randint(10, 60))
                due.append((step + sim.rng.randint(5, 200), follow, turn + 1))
            else:
                due.append((step + sim.rng.randint(5, 50), system + sim.tokens(sim.rng.randint(20, 120)), 0))
        for item in [d for d in due if d[0] <= step]:
            due.remove(item)
            start(item[1], item[2])
    blocks = sim.scheduler.block_manager
    return blocks.prefix_hits / blocks.prefix_queries, sim.copies / sim.steps


def attention_ms(tables: list[list[int]], dtype: torch.dtype, repeats: int = 30) -> dict[str, float]:
    """Median ms of 30 layers' decode attention over `tables` and over consecutive tables as long."""
    from common.hugepages import huge_zeros
    from common.native_kernels import native_ops

    ops = native_ops()
    if ops is None:
        raise SystemExit("the compiled kernels are not built: make kernels")
    torch.manual_seed(0)
    kv_heads, heads, head_dim, layers = 3, 9, 64, 30
    pools = []
    for _ in range(layers):
        k, v = (huge_zeros((kv_heads, DEFAULT_BLOCKS, BLOCK_SIZE, head_dim), dtype) for _ in range(2))
        pools.append((k.normal_(), v.normal_()))
    rng = random.Random(2)
    lens = torch.tensor([len(t) * BLOCK_SIZE - rng.randint(0, BLOCK_SIZE - 1) for t in tables])
    consecutive, first = [], 0
    for table in tables:
        consecutive.append(list(range(first, first + len(table))))
        first += len(table) + 2

    def padded(rows: list[list[int]]) -> torch.Tensor:
        out = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.int64)
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.tensor(row)
        return out

    variants = {"as placed": padded(tables), "consecutive": padded(consecutive)}
    q = torch.randn(len(tables), heads, head_dim, dtype=dtype)
    out = torch.empty_like(q)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_index in range(repeats + 3):
        for name, block_tables in variants.items():
            began = time.perf_counter()
            for k, v in pools:
                ops.decode_attention(q, k, v, block_tables, lens, head_dim**-0.5, out)
            if round_index >= 3:
                times[name].append((time.perf_counter() - began) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def engine_rounds(rounds: int) -> dict[str, list[tuple[float, float]]]:
    """(output tok/s, median step ms) of each round of each policy, the engine in process."""
    from worker.engine.config import EngineConfig, KVCacheConfig
    from worker.engine.outputs import PromptInput
    from worker.model.build import build_engine

    engine = build_engine(
        EngineConfig(scheduler=SchedulerConfig(max_num_seqs=CLIENTS), kv_cache=KVCacheConfig())
    )
    manager = engine.scheduler.block_manager

    def run(seed: int, total: int) -> tuple[float, float]:
        rng = random.Random(seed)

        def send(index: int) -> None:
            prompt = [rng.randrange(100, 40000) for _ in range(rng.randint(64, 192))]
            params = SamplingParams(temperature=1.0, max_tokens=rng.randint(64, 192), ignore_eos=True)
            engine.add(engine.make_requests(f"r{seed}-{index}", PromptInput(token_ids=prompt), params))

        return closed_loop(engine, send, CLIENTS, total)

    run(0, 8)  # warm
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in POLICIES}
    for round_index in range(rounds):
        order = list(POLICIES.items())
        for name, cls in order if round_index % 2 == 0 else order[::-1]:
            manager.__class__ = cls  # same state, the other placement from here on
            results[name].append(run(1000 + 10 * round_index + len(name), 256))
            tok_s, step_ms = results[name][-1]
            print(
                f"round {round_index + 1} {name}: {tok_s:.1f} tok/s, median step {step_ms:.2f} ms", flush=True
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", action="store_true", help="also the in-process engine rounds (~5 min)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    cpu = cpu_info()
    dtype = torch.bfloat16 if cpu.kind in ("amx", "avx512_bf16") else torch.float32
    pools = (700, 1200, DEFAULT_BLOCKS)
    lines = [
        f"## KV block placement, CPU kind {cpu.kind}",
        "",
        f"CPU: {cpu.model} (kind {cpu.kind}; {' '.join(cpu.flags)}). Command: "
        f"`python -m bench.block_placement{' --engine' if args.engine else ''} --rounds {args.rounds}`. "
        "The module docstring has the workloads. "
        "Attention: 30 layers' decode attention of the 64 sequences the churn run left, "
        f"{str(dtype).removeprefix('torch.')}, median of 30.",
        "",
        "| placement | next blocks adjacent (churn) | attention as placed / consecutive (ms) | "
        + " | ".join(f"prefix hits, {n} blocks" for n in pools)
        + " | copies a step (default pool) |",
        "|---|---|---|" + "---|" * (len(pools) + 1),
    ]
    for name, cls in POLICIES.items():
        share, tables = churn(cls)
        times = attention_ms(tables, dtype)
        hits = [conversations(cls, n) for n in pools]
        lines.append(
            f"| {name} | {share:.0%} | {times['as placed']:.1f} / {times['consecutive']:.1f} | "
            + " | ".join(f"{h:.1%}" for h, _ in hits)
            + f" | {hits[-1][1]:.2f} |"
        )
        print(lines[-1], flush=True)
    if args.engine:
        results = engine_rounds(args.rounds)
        lines += [
            "",
            "| placement (engine, 64 streams) | output tok/s (rounds) | median step ms (rounds) |",
            "|---|---|---|",
        ]
        for name, rounds in results.items():
            tok_s, step_ms = [r[0] for r in rounds], [r[1] for r in rounds]
            lines.append(
                f"| {name} | {statistics.median(tok_s):.0f} ({', '.join(f'{t:.0f}' for t in tok_s)}) | "
                f"{statistics.median(step_ms):.1f} ({', '.join(f'{t:.1f}' for t in step_ms)}) |"
            )
    publish(cpu_section("block-placement", cpu.kind), lines, args.write_docs)


if __name__ == "__main__":
    main()
