"""Several worker streams read as one: a /v1/completions request with a list of prompts runs one worker
request per prompt, and its choices are numbered prompt by prompt (prompt i, choice j -> i * n + j)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from common.gen import worker_pb2
from gateway.worker_pool import WorkerStream

_DONE = object()


class MergedStream:
    def __init__(self, streams: list[WorkerStream], choices_per_prompt: int) -> None:
        self.streams = streams
        self.choices_per_prompt = choices_per_prompt

    async def chunks(self) -> AsyncIterator[worker_pb2.GenerateResponse]:
        if len(self.streams) == 1:
            async for chunk in self.streams[0].chunks():
                yield chunk
            return
        queue: asyncio.Queue[object] = asyncio.Queue()
        tasks = [asyncio.create_task(self._pump(i, s, queue)) for i, s in enumerate(self.streams)]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is _DONE:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item  # type: ignore[misc]
        finally:
            for task in tasks:
                task.cancel()

    async def _pump(self, prompt_index: int, stream: WorkerStream, queue: asyncio.Queue[object]) -> None:
        try:
            async for chunk in stream.chunks():
                chunk.index += prompt_index * self.choices_per_prompt
                await queue.put(chunk)
            await queue.put(_DONE)
        except Exception as exc:  # handed to the reader, which raises it
            await queue.put(exc)

    def cancel(self) -> None:
        for stream in self.streams:
            stream.cancel()
