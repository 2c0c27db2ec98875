"""Hypothesis on the worker's parameter path: any proto a client can send is either refused as a
parameter error or samples a valid token, and becomes a bounded number of engine requests. An exception
anywhere else would be raised on the engine thread at the next step and take the whole worker down."""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.gen import worker_pb2 as pb
from common.sampling import MAX_N, MAX_STOP_CHARS, MAX_STOP_STRINGS
from tests.engine.factories import ScriptedRunner
from tests.unit.test_async_engine import CharTokenizer
from worker.engine.block_manager import BlockManager
from worker.engine.config import EngineConfig, KVCacheConfig, SchedulerConfig
from worker.engine.engine import LLMEngine
from worker.engine.errors import ContextLengthError, InvalidRequestError
from worker.engine.outputs import ModelInfo, PromptInput
from worker.engine.request import Request
from worker.engine.scheduler import Scheduler
from worker.model.sampler import build_batch, sample
from worker.server.servicer import check_params_for_model, params_from_proto

VOCAB = 64
INT32 = st.integers(-(2**31), 2**31 - 1)
EDGE_FLOATS = st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 3.0e38, -3.0e38, 1.0e-45])
FUZZ = settings(
    max_examples=200, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
# Each field: mostly in its valid range (so the other fields get exercised), sometimes anything at all.
FLOAT_FIELDS = {
    "temperature": st.floats(0, 2, width=32),
    "top_p": st.floats(0.125, 1, width=32),
    "min_p": st.floats(0, 1, width=32),
    "presence_penalty": st.floats(-2, 2, width=32),
    "frequency_penalty": st.floats(-2, 2, width=32),
    "repetition_penalty": st.floats(0.125, 10, width=32),
}
INT_FIELDS = {
    "top_k": st.integers(0, 100),
    "max_tokens": st.integers(1, 50),
    "min_tokens": st.integers(0, 5),
    "logprobs": st.integers(0, 20),
    "n": st.one_of(st.integers(1, 4), st.sampled_from([MAX_N, MAX_N + 1])),
}


@st.composite
def proto_params(draw: st.DrawFn) -> pb.SamplingParams:
    fields: dict[str, object] = {}
    for name, valid in FLOAT_FIELDS.items():
        if draw(st.booleans()):
            fields[name] = draw(st.one_of(valid, valid, valid, EDGE_FLOATS, st.floats(width=32)))
    for name, valid in INT_FIELDS.items():
        if draw(st.booleans()):
            fields[name] = draw(st.one_of(valid, valid, valid, INT32))
    if draw(st.booleans()):
        fields["seed"] = draw(st.integers(-(2**63), 2**63 - 1))
    fields["ignore_eos"] = draw(st.booleans())
    fields["stop"] = draw(st.lists(st.text(max_size=5), max_size=3))
    fields["stop_token_ids"] = draw(st.lists(st.one_of(st.integers(0, VOCAB - 1), INT32), max_size=3))
    token = st.one_of(st.integers(0, VOCAB - 1), INT32)
    bias = st.one_of(st.floats(-100, 100, width=32), EDGE_FLOATS, st.floats(width=32))
    fields["logit_bias"] = draw(st.dictionaries(token, bias, max_size=3))
    if draw(st.booleans()):
        fields["prompt_logprobs"] = draw(st.one_of(st.integers(0, 20), INT32))
    return pb.SamplingParams(**fields)


def accepted(proto: pb.SamplingParams):
    """The SamplingParams the worker would run with, or None when it refuses them as the client's error."""
    try:
        params = params_from_proto(proto)
        params.validate()
        check_params_for_model(params, VOCAB)
    except (InvalidRequestError, ValueError):
        return None
    return params


@FUZZ
@given(proto_params(), st.integers(0, 3))
def test_accepted_params_sample_a_valid_token(proto: pb.SamplingParams, num_output: int) -> None:
    params = accepted(proto)
    if params is None:
        return
    for name in FLOAT_FIELDS:
        assert math.isfinite(getattr(params, name)), name
    request = Request("r", [1, 2, 3], params, eos_token_id=0, max_tokens=params.max_tokens or 8)
    request.output_token_ids.extend(range(5, 5 + num_output))
    request.all_token_ids.extend(range(5, 5 + num_output))
    generators = {}
    if params.seed is not None:
        generators["r"] = torch.Generator().manual_seed(params.seed + params.n - 1)  # the last choice's seed
    batch = build_batch([request], generators, VOCAB, torch.device("cpu"))
    out = sample(torch.randn(1, VOCAB), batch)
    assert 0 <= out.token_ids[0] < VOCAB


def char_engine() -> LLMEngine:
    """The real LLMEngine (admission, scheduler, block manager) with a scripted runner; no model."""
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256)
    config = EngineConfig(scheduler=sched, kv_cache=KVCacheConfig(block_size=4, num_blocks=512))
    info = ModelInfo("char", 256, 4, 512, "float32", "cpu", 8, VOCAB)
    return LLMEngine(
        config, Scheduler(sched, BlockManager(512, 4, True)), ScriptedRunner(), CharTokenizer(), info, 0
    )


ENGINE = char_engine()


@FUZZ
@given(proto_params())
def test_accepted_params_become_a_bounded_number_of_requests(proto: pb.SamplingParams) -> None:
    """What the worker admits costs at most MAX_N sequences, each within the context (a proto's n was
    unbounded: n = 2**31 - 1 built that many requests on one call, past the queue's bound)."""
    params = accepted(proto)
    if params is None:
        return
    assert params.n <= MAX_N  # before building them: an unbounded n would hang here, not fail
    try:
        requests = ENGINE.make_requests("r", PromptInput(text="hello"), params)
    except (InvalidRequestError, ContextLengthError):
        return
    assert 1 <= len(requests) == params.n <= MAX_N
    assert all(r.num_prompt_tokens + r.max_tokens <= 256 for r in requests)


def test_regressions_found_by_the_fuzzer_are_refused() -> None:
    """Each of these reached the engine thread and broke a step before it was refused up front."""
    for proto in (
        pb.SamplingParams(temperature=math.inf),
        pb.SamplingParams(frequency_penalty=math.nan),
        pb.SamplingParams(stop_token_ids=[VOCAB], min_tokens=1),
        pb.SamplingParams(stop_token_ids=[-1], min_tokens=1),
        pb.SamplingParams(n=2**31 - 1),
        pb.SamplingParams(n=MAX_N + 1),
        pb.SamplingParams(logit_bias={1: math.nan}),
        pb.SamplingParams(logit_bias={VOCAB: 1.0}),
        pb.SamplingParams(stop=["a"] * (MAX_STOP_STRINGS + 1)),  # a stop list matched after every token
        pb.SamplingParams(stop=["a" * (MAX_STOP_CHARS + 1)]),
    ):
        assert accepted(proto) is None, proto
    assert accepted(pb.SamplingParams(n=MAX_N)) is not None
    assert accepted(pb.SamplingParams(stop=["a"] * MAX_STOP_STRINGS)) is not None
