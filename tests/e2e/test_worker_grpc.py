"""The worker's gRPC API called directly: Generate in every prompt form, Abort, info, stats, health,
reflection, error codes, and cancellation freeing KV blocks."""

from __future__ import annotations

import grpc
import pytest

from common.gen import worker_pb2 as pb
from common.gen import worker_pb2_grpc
from scripts.launch import MODEL_NAME, Service
from tests.e2e.conftest import wait_for_idle
from tests.e2e.test_deadlines import reason_of
from tests.support.grpc_checks import serving_with_reflection
from worker.engine.config import EngineConfig
from worker.model.cpu_kind import auto_choice, cpu_info
from worker.model.loader import resolve_dtype, resolve_quantization

GREEDY = pb.SamplingParams(temperature=0.0, max_tokens=8)


def generate(stub: worker_pb2_grpc.WorkerStub, **fields: object) -> list[pb.GenerateResponse]:
    fields.setdefault("params", GREEDY)
    return list(stub.Generate(pb.GenerateRequest(**fields), timeout=60))


def text_of(chunks: list[pb.GenerateResponse], index: int = 0) -> str:
    return "".join(c.text for c in chunks if c.index == index)


def test_health_and_reflection(worker: Service) -> None:
    assert serving_with_reflection(worker.addr, "llmserve.worker.v1.Worker") == {
        "Generate",
        "Abort",
        "GetModelInfo",
        "GetStats",
        "Tokenize",
        "Detokenize",
        "WatchLoad",
        "LoadLoraAdapter",
        "UnloadLoraAdapter",
        "ListLoraAdapters",
    }


def test_model_info(worker_stub: worker_pb2_grpc.WorkerStub) -> None:
    info = worker_stub.GetModelInfo(pb.ModelInfoRequest())
    assert info.model_name == MODEL_NAME
    assert info.max_model_len > 0 and info.block_size > 0 and info.num_kv_blocks > 0
    assert info.vocab_size == 49152
    # the worker's own defaults on this CPU and its model (w4a8 needs the model's GGUF 4-bit blocks)
    quantization = resolve_quantization("auto", "cpu", model_path=EngineConfig.model)
    assert info.dtype == resolve_dtype("auto", "cpu", quantization) and info.device == "cpu"
    assert info.quantization == quantization


def test_watch_load_reports_at_once_then_follows_a_request(worker_stub: worker_pb2_grpc.WorkerStub) -> None:
    """The first report comes at once; a running request shows up in a later one and leaves again."""
    wait_for_idle(worker_stub)
    reports = worker_stub.WatchLoad(pb.WatchLoadRequest(interval_ms=10, heartbeat_ms=200), timeout=300)
    first = next(reports)
    assert first.model_name == MODEL_NAME and not first.draining and not first.stalled
    assert (first.num_running, first.num_waiting) == (0, 0)
    params = pb.SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    call = worker_stub.Generate(pb.GenerateRequest(text="Count to a hundred:", params=params), timeout=300)
    next(call)  # the request runs now
    seen_running = False
    for report in reports:
        seen_running = seen_running or report.num_running == 1
        if seen_running and report.num_running == 0:
            break
        if not seen_running:
            assert report.kv_cache_usage >= 0.0
    assert seen_running
    assert report.prefix_cache_queries >= first.prefix_cache_queries + 5
    list(call)
    reports.cancel()


def test_the_worker_logs_the_cpu_and_why_auto_chose(worker: Service) -> None:
    log = worker.log_path.read_text(errors="replace")
    cpu = cpu_info()
    assert f"CPU {cpu.describe()}" in log
    assert auto_choice(cpu.kind).basis in log  # WORKER_DTYPE and WORKER_QUANTIZATION are auto here


def test_generate_text_streams_deltas_then_usage(worker_stub: worker_pb2_grpc.WorkerStub) -> None:
    chunks = generate(worker_stub, text="The capital of France is")
    assert len(chunks) > 1, "a streamed answer comes in several chunks"
    assert all(not c.finish_reason for c in chunks[:-1])
    last = chunks[-1]
    assert last.finish_reason in ("stop", "length")
    assert last.usage.prompt_tokens == 5
    assert last.usage.completion_tokens == sum(len(c.token_ids) for c in chunks)
    assert "Paris" in text_of(chunks)


def test_tokens_come_first_alone_then_in_messages_of_the_stream_interval(
    worker_stub: worker_pb2_grpc.WorkerStub,
) -> None:
    """Default WORKER_STREAM_INTERVAL is 4: one message for the first token, then >= 4 tokens a message
    (more only when the consumer fell behind), the remainder with the final one."""
    params = pb.SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True)
    chunks = list(
        worker_stub.Generate(pb.GenerateRequest(text="Count to twenty:", params=params), timeout=60)
    )
    sizes = [len(c.token_ids) for c in chunks]
    assert sum(sizes) == 13 and chunks[-1].usage.completion_tokens == 13
    assert all(size >= 4 for size in sizes[1:-1]), sizes
    assert 2 <= len(chunks) <= 4, sizes
    assert chunks[-1].finish_reason == "length"


def test_chat_and_token_id_prompts(worker_stub: worker_pb2_grpc.WorkerStub) -> None:
    chat = pb.ChatPrompt(messages=[pb.ChatMessage(role="user", content="What is the capital of France?")])
    chat_chunks = generate(worker_stub, chat=chat)
    assert chat_chunks[-1].usage.prompt_tokens > 10, "the chat template wraps the message"
    text_chunks = generate(worker_stub, text="The capital of France is")
    # The same prompt as SmolLM2 token ids gives the same greedy continuation.
    by_ids = generate(worker_stub, token_ids=pb.TokenIds(ids=[504, 3575, 282, 4649, 314]))
    assert text_of(by_ids) == text_of(text_chunks)


def test_greedy_is_deterministic_and_seeded_sampling_repeats(worker_stub: worker_pb2_grpc.WorkerStub) -> None:
    assert text_of(generate(worker_stub, text="Once upon a time")) == text_of(
        generate(worker_stub, text="Once upon a time")
    )
    seeded = pb.SamplingParams(temperature=1.0, seed=1234, max_tokens=12)
    first = text_of(generate(worker_stub, text="Once upon a time", params=seeded))
    assert first == text_of(generate(worker_stub, text="Once upon a time", params=seeded))


def test_logprobs_and_n(worker_stub: worker_pb2_grpc.WorkerStub) -> None:
    params = pb.SamplingParams(temperature=0.8, max_tokens=6, logprobs=3, n=2, seed=7)
    chunks = generate(worker_stub, text="Hello", params=params)
    assert {c.index for c in chunks} == {0, 1}
    for index in (0, 1):
        mine = [c for c in chunks if c.index == index]
        assert mine[-1].finish_reason
        for chunk in mine:
            # every token has its logprobs, except a stop token that ends the choice (as in OpenAI)
            stop_token = 1 if chunk.finish_reason == "stop" and not chunk.text else 0
            assert len(chunk.logprobs) == len(chunk.token_ids) - stop_token
            for position in chunk.logprobs:
                assert len(position.top) == 3
                assert position.chosen.logprob <= 0.0
                assert position.top[0].logprob >= position.top[-1].logprob


def test_stop_string_ends_the_choice(worker_stub: worker_pb2_grpc.WorkerStub) -> None:
    free = text_of(
        generate(
            worker_stub,
            text="The capital of France is",
            params=pb.SamplingParams(temperature=0, max_tokens=8),
        )
    )
    stop_word = free.split()[1]
    params = pb.SamplingParams(temperature=0, max_tokens=8, stop=[stop_word])
    chunks = generate(worker_stub, text="The capital of France is", params=params)
    assert chunks[-1].finish_reason == "stop"
    assert stop_word not in text_of(chunks)
    assert free.startswith(text_of(chunks))


def test_an_output_ending_inside_a_character_is_its_ids_decoded(
    worker_stub: worker_pb2_grpc.WorkerStub,
) -> None:
    """max_tokens can cut a multi-byte character: the text is still the decode of the returned ids (U+FFFD
    for the lone bytes), as the ids, usage and logprob bytes say, not the text with those bytes dropped."""
    lead = worker_stub.Tokenize(pb.TokenizeRequest(text="🎉", add_special_tokens=False)).token_ids[0]
    params = pb.SamplingParams(temperature=0, max_tokens=2, allowed_token_ids=[lead], logprobs=0)
    chunks = generate(worker_stub, text="Party:", params=params)
    ids = [t for c in chunks for t in c.token_ids]
    assert ids == [lead, lead] and chunks[-1].finish_reason == "length"
    decoded = worker_stub.Detokenize(pb.DetokenizeRequest(token_ids=ids)).text
    assert decoded.endswith("\ufffd") and text_of(chunks) == decoded
    partial = b"".join(p.chosen.token_bytes for c in chunks for p in c.logprobs)
    assert partial.decode("utf-8", errors="replace") == decoded


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({}, "prompt"),
        ({"text": "hi", "params": pb.SamplingParams(temperature=-1.0)}, "temperature"),
        ({"text": "hi", "params": pb.SamplingParams(max_tokens=100000)}, "maximum context length"),
        ({"token_ids": pb.TokenIds(ids=[10**6])}, "out of range"),
        ({"text": "hi", "params": pb.SamplingParams(stop=[f"s{i}" for i in range(1000)])}, "stop strings"),
        ({"text": "hi", "params": pb.SamplingParams(stop=["x" * 5000])}, "stop string may have"),
    ],
)
def test_invalid_requests_are_invalid_argument(
    worker_stub: worker_pb2_grpc.WorkerStub, fields: dict, needle: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        list(worker_stub.Generate(pb.GenerateRequest(**fields), timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in info.value.details()


@pytest.mark.parametrize(
    ("chat", "param"),
    [
        ({"tools_json": "{bad"}, "tools"),
        ({"template_kwargs_json": "[1]"}, "chat_template_kwargs"),
    ],
)
def test_a_bad_chat_option_to_tokenize_is_invalid_argument_as_in_generate(
    worker_stub: worker_pb2_grpc.WorkerStub, chat: dict, param: str
) -> None:
    prompt = pb.ChatPrompt(messages=[pb.ChatMessage(role="user", content="hi")], **chat)
    for call in (
        lambda: worker_stub.Tokenize(pb.TokenizeRequest(chat=prompt), timeout=30),
        lambda: list(worker_stub.Generate(pb.GenerateRequest(chat=prompt, params=GREEDY), timeout=30)),
    ):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason_of(info.value) == ("ERROR_REASON_INVALID_PARAMETER", param)


def test_unknown_model_is_not_found(worker_stub: worker_pb2_grpc.WorkerStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        generate(worker_stub, text="hi", model="gpt-5")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_cancelled_stream_frees_its_blocks(worker_stub: worker_pb2_grpc.WorkerStub) -> None:
    params = pb.SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
    call = worker_stub.Generate(pb.GenerateRequest(text="Write a long story.", params=params))
    stream = iter(call)
    for _ in range(3):
        next(stream)
    busy = worker_stub.GetStats(pb.StatsRequest())
    assert busy.num_running == 1 and busy.num_kv_blocks_used > 0
    call.cancel()
    stats = wait_for_idle(worker_stub)
    assert (stats.num_running, stats.num_kv_blocks_used) == (0, 0)


def test_abort_by_id_and_an_id_in_use_is_already_exists(worker_stub: worker_pb2_grpc.WorkerStub) -> None:
    params = pb.SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
    stream = iter(
        worker_stub.Generate(pb.GenerateRequest(request_id="abort-me", text="Tell me", params=params))
    )
    next(stream)
    with pytest.raises(grpc.RpcError) as taken:
        generate(worker_stub, request_id="abort-me", text="hi")
    assert taken.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert reason_of(taken.value) == ("ERROR_REASON_ALREADY_EXISTS", "request_id")
    assert worker_stub.Abort(pb.AbortRequest(request_id="abort-me")).found
    rest = list(stream)
    assert rest and rest[-1].finish_reason == "abort"
    assert not worker_stub.Abort(pb.AbortRequest(request_id="no-such-request")).found
    stats = wait_for_idle(worker_stub)
    assert stats.num_kv_blocks_used == 0 and stats.num_finished > 0


@pytest.mark.parametrize(
    ("first", "first_n", "second", "second_n"), [("pair", 2, "pair#1", 1), ("lone#0", 1, "lone", 2)]
)
def test_an_id_that_names_a_choice_of_another_request_is_already_exists(
    worker_stub: worker_pb2_grpc.WorkerStub, first: str, first_n: int, second: str, second_n: int
) -> None:
    """With n > 1 each choice runs as `<id>#<index>`: a client's own id of that form, sent while the other
    request ran (or the other way round), was admitted beside it and crashed the engine loop (a KeyError on
    the shared choice id), so one request made the whole worker answer ENGINE_DEAD until restarted."""
    params = pb.SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True, n=first_n)
    running = iter(worker_stub.Generate(pb.GenerateRequest(request_id=first, text="Tell me", params=params)))
    next(running)
    short = pb.SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, n=second_n)
    with pytest.raises(grpc.RpcError) as taken:
        generate(worker_stub, request_id=second, text="hi", params=short)
    assert taken.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert reason_of(taken.value) == ("ERROR_REASON_ALREADY_EXISTS", "request_id")
    assert worker_stub.Abort(pb.AbortRequest(request_id=first)).found
    assert list(running)[-1].finish_reason == "abort"
    assert generate(worker_stub, request_id=second, text="hi", params=short)[-1].finish_reason == "length"
    assert wait_for_idle(worker_stub).num_kv_blocks_used == 0
