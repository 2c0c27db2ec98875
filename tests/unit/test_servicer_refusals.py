"""A Generate call the worker refuses leaves nothing of its prompt behind, on a real gRPC server in process.

The engine is the real one with a scripted runner and a character tokenizer that keeps a weak reference to
every list of token ids it hands out, so the test can tell whether a refused prompt is still in memory.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest

from common.gen import worker_pb2 as pb
from common.gen import worker_pb2_grpc
from common.grpc_server import GrpcServer
from scripts.launch import free_port
from tests.engine.factories import ScriptedRunner
from tests.unit.test_async_engine import CharTokenizer, build
from worker.server.grpc_errors import ERROR_TRAILER
from worker.server.servicer import WorkerServicer


class TokenIds(list):
    """A list a test can hold a weak reference to."""


class RecordingTokenizer(CharTokenizer):
    def __init__(self) -> None:
        self.handed_out: list[weakref.ref] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = TokenIds(super().encode(text, add_special_tokens))
        self.handed_out.append(weakref.ref(ids))
        return ids


@asynccontextmanager
async def served() -> AsyncIterator[tuple[worker_pb2_grpc.WorkerStub, RecordingTokenizer]]:
    tokenizer = RecordingTokenizer()
    engine = build(ScriptedRunner(), tokenizer=tokenizer)
    await engine.start()
    server = GrpcServer("llmserve.Worker")
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(engine), server.server)
    address = f"127.0.0.1:{free_port()}"
    await server.start(address)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            yield worker_pb2_grpc.WorkerStub(channel), tokenizer
    finally:
        await server.server.stop(None)
        await engine.shutdown()


def reason_of(error: grpc.aio.AioRpcError) -> tuple[str, str]:
    detail = pb.ErrorDetail.FromString(dict(error.trailing_metadata())[ERROR_TRAILER])
    return pb.ErrorReason.Name(detail.reason), detail.param


async def test_a_refused_prompt_is_freed_at_once() -> None:
    """The call ends with its status and reason as before, and its token ids are gone without waiting for a
    garbage collection. A refusal used to end the call by raising gRPC's AbortError, which the call's state
    keeps: that exception, its traceback's frames and the call state form a cycle, and the engine error it
    chained to held the frames that tokenized the prompt. Only a full collection (rare in a process holding a
    model) broke it, so a worker sent megabyte prompts over its context grew by tens of MB per refusal."""
    async with served() as (stub, tokenizer):
        await refuse_three_times_with_no_collection(stub, tokenizer)


async def refuse_three_times_with_no_collection(
    stub: worker_pb2_grpc.WorkerStub, tokenizer: RecordingTokenizer
) -> None:
    gc.disable()
    try:
        for _ in range(3):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in stub.Generate(pb.GenerateRequest(text="x" * 5000)):
                    pass
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert reason_of(caught.value) == ("ERROR_REASON_CONTEXT_LENGTH_EXCEEDED", "prompt")
        assert len(tokenizer.handed_out) == 3
        for _ in range(100):  # the server's handler may still be unwinding after the client has its status
            if all(ref() is None for ref in tokenizer.handed_out):
                break
            await asyncio.sleep(0.02)
        assert [ref() is None for ref in tokenizer.handed_out] == [True] * 3
    finally:
        gc.enable()
