"""A worker whose engine loop died exits (1) so that its supervisor starts a fresh one; a stop signal still
drains (0). The waiting is tested on a stand-in engine: only `is_running` is read."""

from __future__ import annotations

import asyncio
import os
import signal

from worker.__main__ import stop_or_engine_death


class Engine:
    is_running = True


async def test_the_engine_loop_dying_ends_the_wait_as_a_death() -> None:
    engine = Engine()
    waiting = asyncio.ensure_future(stop_or_engine_death(engine))  # type: ignore[arg-type]
    await asyncio.sleep(0.3)
    assert not waiting.done()  # a live engine and no signal: it serves on
    engine.is_running = False
    assert await asyncio.wait_for(waiting, 2.0) is True


async def test_a_stop_signal_ends_the_wait_as_a_stop() -> None:
    waiting = asyncio.ensure_future(stop_or_engine_death(Engine()))  # type: ignore[arg-type]
    await asyncio.sleep(0.1)
    os.kill(os.getpid(), signal.SIGTERM)  # the handler the wait installed takes it
    assert await asyncio.wait_for(waiting, 2.0) is False
