"""Tokenize over gRPC counts a prompt as Generate reads it, on a real gRPC server in process.

The engine is the real one with a scripted runner and a character tokenizer that, like Gemma's or Llama's,
puts a BOS token first unless told not to: the case where a count without it is one short of Generate's.
"""

from __future__ import annotations

import grpc
import pytest

from common.gen import worker_pb2 as pb
from common.gen import worker_pb2_grpc
from tests.support.in_process_worker import served_worker
from tests.unit.test_async_engine import CharTokenizer
from tests.unit.test_servicer_refusals import reason_of

BOS = 1


class BosTokenizer(CharTokenizer):
    """Adds BOS with the special tokens, as `tokenizer.encode` does by default for many models."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [BOS] * add_special_tokens + super().encode(text)

    def convert_ids_to_tokens(self, token_id: int) -> str:  # each token's text, for TokenizeResponse.tokens
        return self.decode([token_id])


async def prompt_tokens_of_generate(stub: worker_pb2_grpc.WorkerStub, text: str) -> int:
    params = pb.SamplingParams(max_tokens=1, temperature=0.0)
    chunks = [chunk async for chunk in stub.Generate(pb.GenerateRequest(text=text, params=params))]
    return chunks[-1].usage.prompt_tokens


async def test_a_text_counts_as_generate_reads_it_unless_told_to_leave_special_tokens_out() -> None:
    """The RPC is documented as the prompt's ids as Generate would see them, for budgeting; Generate reads a
    text with the tokenizer's special tokens (vLLM's add_special_tokens default, true). The field was a plain
    bool, so a client that left it unset (proto3: false) was counted one token short on such a model."""
    async with served_worker(BosTokenizer()) as stub:
        unset = await stub.Tokenize(pb.TokenizeRequest(text="hello"))
        assert list(unset.token_ids)[0] == BOS
        assert len(unset.token_ids) == await prompt_tokens_of_generate(stub, "hello") == 6
        without = await stub.Tokenize(pb.TokenizeRequest(text="hello", add_special_tokens=False))
        assert list(without.token_ids) == list(unset.token_ids)[1:]
        explicit = await stub.Tokenize(pb.TokenizeRequest(text="hello", add_special_tokens=True))
        assert list(explicit.token_ids) == list(unset.token_ids)


async def test_a_tokenize_call_without_a_prompt_is_refused_as_generate_refuses_it() -> None:
    """Neither text nor chat set is a client's mistake (an empty list of ids hid it), named `prompt`."""
    async with served_worker(BosTokenizer()) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Tokenize(pb.TokenizeRequest())
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason_of(caught.value) == ("ERROR_REASON_INVALID_PARAMETER", "prompt")
        empty = await stub.Tokenize(pb.TokenizeRequest(text="", add_special_tokens=False))
        assert list(empty.token_ids) == []  # an empty text is a text: no ids, as vLLM's /tokenize answers
