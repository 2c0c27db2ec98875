"""AsyncEngine under concurrency: admission is exact, every block comes back, stalls and drains are seen.

The engine here is the real LLMEngine, scheduler and block manager, with a scripted runner in
place of the model and a character tokenizer, so hundreds of requests run in about a second.
"""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path

import pytest

from tests.engine.factories import ScriptedRunner
from worker.engine.async_engine import AsyncEngine
from worker.engine.block_manager import BlockManager
from worker.engine.config import EngineConfig, KVCacheConfig, SchedulerConfig
from worker.engine.engine import LLMEngine
from worker.engine.errors import EngineDrainingError, EngineOverloadedError, EngineStalledError
from worker.engine.outputs import ModelInfo, PromptInput
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler import Scheduler


class CharTokenizer:
    """One token per character (ids 3..99), enough for the engine's admission and detokenizer."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 97 + 3 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)

    def apply_chat_template(self, messages: list[dict], tokenize: bool, add_generation_prompt: bool) -> str:
        return "".join(m["content"] for m in messages)


class GatedRunner(ScriptedRunner):
    """A scripted runner whose steps wait while the gate is closed, to hold the engine thread."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def execute(self, plan):
        self.entered.set()
        self.gate.wait()
        return super().execute(plan)


def build(
    runner: ScriptedRunner,
    max_waiting: int = 1024,
    num_blocks: int = 512,
    tokenizer: CharTokenizer | None = None,
    **options: object,
) -> AsyncEngine:
    sched = SchedulerConfig(
        max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256, max_waiting=max_waiting
    )
    config = EngineConfig(scheduler=sched, kv_cache=KVCacheConfig(block_size=4, num_blocks=num_blocks))
    info = ModelInfo("char", 256, 4, num_blocks, "float32", "cpu", 8, 128)
    scheduler = Scheduler(sched, BlockManager(num_blocks, 4, True))
    tokenizer = tokenizer or CharTokenizer()
    return AsyncEngine(lambda: LLMEngine(config, scheduler, runner, tokenizer, info, None), **options)


async def run_one(engine: AsyncEngine, request_id: str, max_tokens: int, n: int = 1) -> str:
    """Generate to the end; return the finish reason of the last choice (or the error's name)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, n=n)
    finish = ""
    try:
        async for output in engine.generate(request_id, PromptInput(text=f"hello {request_id}"), params):
            finish = output.finish_reason or finish
    except Exception as exc:  # the caller counts outcomes
        return type(exc).__name__
    return finish


async def until(condition, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def settled(engine: AsyncEngine) -> None:
    """Nothing in flight, running or waiting, and every KV block back in the pool."""
    await until(lambda: engine.num_in_flight == 0)
    await until(lambda: engine.snapshot().num_unfinished == 0 and engine.stats().num_kv_blocks_used == 0)


async def test_admission_refuses_exactly_what_overflows_the_queue() -> None:
    """Rounds of bursts while the engine thread is busy: exactly `burst - max_waiting` are refused
    each round. A count shared by two threads that lost an update would drift from round to round."""
    runner = GatedRunner()
    engine = build(runner, max_waiting=6)
    await engine.start()
    try:
        for round_ in range(15):
            runner.gate.clear()
            runner.entered.clear()
            blocker = asyncio.create_task(run_one(engine, f"block-{round_}", 4))
            await asyncio.to_thread(runner.entered.wait, 5.0)
            burst = [asyncio.create_task(run_one(engine, f"r{round_}-{i}", 3)) for i in range(10)]
            await until(lambda: engine.num_in_flight == 11)  # every add is queued behind the held step
            runner.gate.set()
            outcomes = await asyncio.gather(*burst)
            assert outcomes.count("EngineOverloadedError") == 4, outcomes
            assert outcomes.count("length") == 6, outcomes
            assert await blocker == "length"
            await settled(engine)
    finally:
        runner.gate.set()
        await engine.shutdown()


async def test_storm_of_adds_aborts_and_cancels_frees_every_block() -> None:
    rng = random.Random(13)
    engine = build(ScriptedRunner(), num_blocks=256)
    await engine.start()
    try:

        async def client(i: int) -> str:
            task = asyncio.create_task(
                run_one(engine, f"s{i}", rng.randint(1, 40), n=rng.choice((1, 1, 2, 3)))
            )
            fate = rng.random()
            if fate < 0.3:
                await asyncio.sleep(rng.random() * 0.02)
                task.cancel()  # the client went away
            elif fate < 0.5:
                await asyncio.sleep(rng.random() * 0.02)
                await engine.abort(f"s{i}")
            try:
                return await task
            except asyncio.CancelledError:
                return "cancelled"

        outcomes = await asyncio.gather(*(client(i) for i in range(300)))
        assert set(outcomes) <= {"length", "abort", "cancelled"}, set(outcomes)
        assert outcomes.count("length") > 50
        await settled(engine)
        stats = engine.stats()
        assert (stats.num_running, stats.num_waiting, stats.num_kv_blocks_used) == (0, 0, 0)
    finally:
        await engine.shutdown()
    inner = engine.engine
    assert inner is not None and not inner.groups and not inner.detokenizers  # the thread is joined


async def test_a_stalled_loop_is_seen_and_clears_when_it_moves(tmp_path: Path) -> None:
    stall = tmp_path / "stall"
    engine = build(ScriptedRunner(), stall_timeout_s=0.2, debug_stall_file=str(stall))
    await engine.start()
    try:
        stall.touch()
        held = asyncio.create_task(run_one(engine, "held", 5))
        await until(lambda: engine.is_stalled, timeout_s=5.0)
        assert await run_one(engine, "new", 5) == EngineStalledError.__name__
        stall.unlink()
        assert await held == "length"
        assert not engine.is_stalled and engine.stalled_for() == 0.0
        assert await run_one(engine, "after", 5) == "length"
    finally:
        stall.unlink(missing_ok=True)
        await engine.shutdown()


async def test_draining_refuses_new_requests_and_lets_open_ones_finish() -> None:
    runner = GatedRunner()
    engine = build(runner)
    await engine.start()
    try:
        runner.gate.clear()
        open_one = asyncio.create_task(run_one(engine, "open", 5))
        await until(lambda: engine.num_in_flight == 1)
        engine.stop_admitting()
        assert await run_one(engine, "late", 5) == EngineDrainingError.__name__
        runner.gate.set()
        assert await open_one == "length"
        await settled(engine)
    finally:
        runner.gate.set()
        await engine.shutdown()


@pytest.mark.parametrize("max_waiting", [1])
async def test_queue_full_is_an_overloaded_error(max_waiting: int) -> None:
    runner = GatedRunner()
    engine = build(runner, max_waiting=max_waiting)
    await engine.start()
    try:
        runner.gate.clear()
        first = asyncio.create_task(run_one(engine, "first", 3))
        await asyncio.to_thread(runner.entered.wait, 5.0)
        second = asyncio.create_task(run_one(engine, "second", 3))  # waits: the queue is now full
        await until(lambda: engine.num_in_flight == 2)
        third = asyncio.create_task(run_one(engine, "third", 3))
        await until(lambda: engine.num_in_flight == 3)
        runner.gate.set()
        assert await asyncio.gather(first, second, third) == [
            "length",
            "length",
            EngineOverloadedError.__name__,
        ]
    finally:
        runner.gate.set()
        await engine.shutdown()


async def test_a_client_with_its_last_token_sees_the_stats_of_that_step() -> None:
    """The snapshot goes out before the outputs: even when the engine thread is held right after handing
    them over (a slow metrics listener here), the client that has its final output reads stats with its
    request no longer running and its blocks back."""
    engine = build(ScriptedRunner())
    engine.add_step_listener(lambda stats: threading.Event().wait(0.05))
    await engine.start()
    try:
        for i in range(5):
            assert await run_one(engine, f"last-{i}", 3) == "length"
            stats = engine.stats()
            assert stats.num_running == 0 and stats.num_kv_blocks_used == 0, stats
    finally:
        await engine.shutdown()
