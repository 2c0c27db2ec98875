"""One request's outputs on their way from the engine thread to the server: a backlog is sent as one.

The engine delivers one output per choice per step. When the consumer (a gRPC stream, an SSE
response) keeps up, it gets them one by one, as they come. When it falls behind (a busy event loop,
a slow client), the outputs that piled up for a choice are merged into one before they are handed
over, so a late consumer catches up with one message instead of many: the same tokens, fewer writes.
"""

from __future__ import annotations

import asyncio
from collections import deque

from worker.engine.outputs import RequestOutput

Item = RequestOutput | BaseException


def merge(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
    """Two consecutive deltas of one choice as one (the later one may be the final)."""
    logprobs = None
    if earlier.logprobs is not None or later.logprobs is not None:
        logprobs = (earlier.logprobs or []) + (later.logprobs or [])
    return RequestOutput(
        group_id=earlier.group_id,
        index=earlier.index,
        text=earlier.text + later.text,
        token_ids=earlier.token_ids + later.token_ids,
        logprobs=logprobs,
        finish_reason=later.finish_reason,
        usage=later.usage,
        prompt_logprobs=earlier.prompt_logprobs or later.prompt_logprobs,
    )


class OutputStream:
    """Filled on the event loop (put), drained by one consumer (drain)."""

    def __init__(self) -> None:
        self._items: deque[Item] = deque()
        self._ready = asyncio.Event()

    def put(self, item: Item) -> None:
        self._items.append(item)
        self._ready.set()

    async def drain(self) -> list[Item]:
        """Everything delivered since the last call (waiting for at least one item), backlog merged."""
        await self._ready.wait()
        self._ready.clear()
        out: list[Item] = []
        last_of_choice: dict[int, int] = {}  # choice index -> position in out of its open delta
        while self._items:
            item = self._items.popleft()
            if isinstance(item, RequestOutput):
                at = last_of_choice.get(item.index)
                if at is not None:
                    out[at] = merge(out[at], item)  # type: ignore[arg-type]
                    if item.finished:
                        del last_of_choice[item.index]
                    continue
                if not item.finished:
                    last_of_choice[item.index] = len(out)
            else:
                last_of_choice.clear()  # an error ends the stream: nothing merges across it
            out.append(item)
        return out


class TokenBatcher:
    """Holds back a choice's deltas until `interval` tokens are pending (vLLM's stream interval).

    The first delta of each choice (time to first token) and the final one go out at once. Used at the
    network boundary, where every message costs CPU on both ends that the model would otherwise use.
    """

    def __init__(self, interval: int) -> None:
        if interval < 1:
            raise ValueError("the stream interval must be at least 1 token")
        self.interval = interval
        self._held: dict[int, RequestOutput] = {}
        self._started: set[int] = set()

    def push(self, output: RequestOutput) -> RequestOutput | None:
        """What to send now for this delta (merged with what was held), or None to keep holding."""
        held = self._held.pop(output.index, None)
        if held is not None:
            output = merge(held, output)
        if output.finished or output.index not in self._started or len(output.token_ids) >= self.interval:
            self._started.add(output.index)
            return output
        self._held[output.index] = output
        return None
