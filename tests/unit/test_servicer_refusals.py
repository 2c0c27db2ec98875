"""A Generate call the worker refuses leaves nothing of its prompt behind, on a real gRPC server in process.

The engine is the real one with a scripted runner and a character tokenizer that keeps a weak reference to
every list of token ids it hands out, so the test can tell whether a refused prompt is still in memory.
"""

from __future__ import annotations

import asyncio
import gc
import weakref

import grpc
import pytest

from common.gen import worker_pb2 as pb
from common.gen import worker_pb2_grpc
from tests.support.in_process_worker import served_worker
from tests.unit.test_async_engine import CharTokenizer
from worker.server.grpc_errors import ERROR_TRAILER


class TokenIds(list):
    """A list a test can hold a weak reference to."""


class RecordingTokenizer(CharTokenizer):
    def __init__(self) -> None:
        self.handed_out: list[weakref.ref] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = TokenIds(super().encode(text, add_special_tokens))
        self.handed_out.append(weakref.ref(ids))
        return ids


def reason_of(error: grpc.aio.AioRpcError) -> tuple[str, str]:
    detail = pb.ErrorDetail.FromString(dict(error.trailing_metadata())[ERROR_TRAILER])
    return pb.ErrorReason.Name(detail.reason), detail.param


async def test_a_refused_prompt_is_freed_at_once() -> None:
    """The call ends with its status and reason as before, and its token ids are gone without waiting for a
    garbage collection. A refusal used to end the call by raising gRPC's AbortError, which the call's state
    keeps: that exception, its traceback's frames and the call state form a cycle, and the engine error it
    chained to held the frames that tokenized the prompt. Only a full collection (rare in a process holding a
    model) broke it, so a worker sent megabyte prompts over its context grew by tens of MB per refusal."""
    tokenizer = RecordingTokenizer()
    async with served_worker(tokenizer) as stub:
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
