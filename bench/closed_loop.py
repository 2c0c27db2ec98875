"""An in-process engine kept at a fixed concurrency, as a closed-loop client keeps a server: each finished
request is replaced by the next until all were sent."""

from __future__ import annotations

import time
from collections.abc import Callable

from bench.report import median


def closed_loop(engine, send: Callable[[int], None], concurrency: int, requests: int) -> tuple[float, float]:
    """Run `engine` with `concurrency` requests in flight until `requests` were sent (`send(i)` adds the i-th)
    and finished; returns output tok/s and the median step in ms."""
    sent = 0

    def send_next() -> None:
        nonlocal sent
        send(sent)
        sent += 1

    for _ in range(min(concurrency, requests)):
        send_next()
    steps, tokens, began = [], 0, time.perf_counter()
    while engine.has_unfinished():
        step_began = time.perf_counter()
        result = engine.step()
        steps.append(time.perf_counter() - step_began)
        for out in result.outputs:
            tokens += len(out.token_ids)
            if out.finish_reason is not None and sent < requests:
                send_next()
    return tokens / (time.perf_counter() - began), median(steps) * 1000
