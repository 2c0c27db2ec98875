"""The worker servicer's proto <-> engine conversions and its error mapping."""

from __future__ import annotations

import grpc
import pytest

from common.gen import worker_pb2 as pb
from worker.engine.errors import EngineDeadError, EngineOverloadedError, InvalidRequestError
from worker.engine.outputs import PositionLogprobs, RequestOutput, TokenLogprob, Usage
from worker.engine.sampling_params import SamplingParams
from worker.server.servicer import output_to_proto, params_from_proto, prompt_from_proto, status_of


def test_unset_params_keep_engine_defaults() -> None:
    params = params_from_proto(pb.SamplingParams(max_tokens=5, stop=["x"], temperature=0.0))
    defaults = SamplingParams()
    assert (params.max_tokens, params.stop, params.temperature) == (5, ["x"], 0.0)
    assert (params.top_p, params.n, params.logprobs, params.seed) == (
        defaults.top_p,
        defaults.n,
        defaults.logprobs,
        defaults.seed,
    )


def test_explicit_zero_is_kept() -> None:
    params = params_from_proto(pb.SamplingParams(logprobs=0, top_k=0, seed=0))
    assert (params.logprobs, params.top_k, params.seed) == (0, 0, 0)


def test_prompt_forms() -> None:
    assert prompt_from_proto(pb.GenerateRequest(text="hi")).text == "hi"
    assert prompt_from_proto(pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 2]))).token_ids == [1, 2]
    chat = pb.ChatPrompt(messages=[pb.ChatMessage(role="user", content="q")])
    assert prompt_from_proto(pb.GenerateRequest(chat=chat)).messages == [{"role": "user", "content": "q"}]
    with pytest.raises(InvalidRequestError):
        prompt_from_proto(pb.GenerateRequest())


def test_output_to_proto() -> None:
    lp = PositionLogprobs(TokenLogprob(5, "a", -0.5, b"a"), [TokenLogprob(5, "a", -0.5, b"a")])
    out = RequestOutput("r", 1, "a", [5], [lp], "stop", Usage(3, 1, 2))
    proto = output_to_proto(out)
    assert (proto.index, proto.text, list(proto.token_ids), proto.finish_reason) == (1, "a", [5], "stop")
    assert proto.logprobs[0].chosen.token_bytes == b"a" and len(proto.logprobs[0].top) == 1
    assert (proto.usage.prompt_tokens, proto.usage.completion_tokens, proto.usage.cached_tokens) == (3, 1, 2)
    assert output_to_proto(RequestOutput("r", 0, "", [])).finish_reason == ""


def test_status_mapping() -> None:
    assert status_of(InvalidRequestError("x")) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_of(EngineOverloadedError("x")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_of(EngineDeadError("x")) == grpc.StatusCode.UNAVAILABLE
    assert status_of(RuntimeError("x")) == grpc.StatusCode.INTERNAL


def test_an_empty_choice_list_is_refused_naming_the_output_constraint() -> None:
    """Every INVALID_PARAMETER names its parameter (worker.proto's ErrorReason); an empty choice list named
    none. Grammar errors are `response_format`'s, OpenAI's word for any output constraint, and so is this."""
    empty = pb.StructuredOutput(choice=pb.ChoiceList())
    with pytest.raises(InvalidRequestError) as refused:
        params_from_proto(pb.SamplingParams(structured_output=empty))
    assert refused.value.param == "response_format"
