"""A request's output stream hands over deltas one by one, and merges only what piled up."""

import asyncio

import pytest

from worker.engine.output_stream import OutputStream, TokenBatcher
from worker.engine.outputs import PositionLogprobs, RequestOutput, TokenLogprob, Usage


def delta(index: int, token: int, finish: str | None = None, logprob: bool = False) -> RequestOutput:
    lp = [PositionLogprobs(TokenLogprob(token, f"t{token}", -0.5))] if logprob else None
    usage = Usage(3, token, 0) if finish else None
    return RequestOutput("r", index, f"t{token}", [token], lp, finish, usage)


def drain(stream: OutputStream) -> list:
    return asyncio.run(asyncio.wait_for(stream.drain(), 1))


def test_a_consumer_that_keeps_up_gets_every_delta_as_it_was():
    stream = OutputStream()
    stream.put(delta(0, 1))
    assert [(o.text, o.token_ids) for o in drain(stream)] == [("t1", [1])]
    stream.put(delta(0, 2))
    assert [(o.text, o.token_ids) for o in drain(stream)] == [("t2", [2])]


def test_a_backlog_is_merged_per_choice_keeping_text_tokens_logprobs_and_the_final_usage():
    stream = OutputStream()
    for item in (
        delta(0, 1, logprob=True),
        delta(1, 7),
        delta(0, 2, logprob=True),
        delta(1, 8, "length"),
        delta(0, 3, "stop", logprob=True),
    ):
        stream.put(item)
    out = drain(stream)
    assert [(o.index, o.text, o.token_ids, o.finish_reason) for o in out] == [
        (0, "t1t2t3", [1, 2, 3], "stop"),
        (1, "t7t8", [7, 8], "length"),
    ]
    assert [p.chosen.token_id for p in out[0].logprobs] == [1, 2, 3]
    assert out[1].logprobs is None
    assert out[0].usage == Usage(3, 3, 0) and out[1].usage == Usage(3, 8, 0)


def test_an_error_is_delivered_after_the_deltas_before_it_and_nothing_merges_across_it():
    stream = OutputStream()
    stream.put(delta(0, 1))
    stream.put(RuntimeError("engine died"))
    stream.put(delta(0, 2))
    out = drain(stream)
    assert [type(o).__name__ for o in out] == ["RequestOutput", "RuntimeError", "RequestOutput"]
    assert out[0].token_ids == [1] and out[2].token_ids == [2]


def test_drain_waits_for_the_next_item():
    async def scenario() -> list:
        stream = OutputStream()
        waiter = asyncio.ensure_future(stream.drain())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        stream.put(delta(0, 5))
        return await asyncio.wait_for(waiter, 1)

    assert [o.token_ids for o in asyncio.run(scenario())] == [[5]]


@pytest.mark.parametrize("n", [1, 3])
def test_nothing_after_a_final_delta_is_merged_into_it(n):
    stream = OutputStream()
    stream.put(delta(0, 1, "stop"))
    for token in range(2, 2 + n):
        stream.put(delta(0, token))
    out = drain(stream)
    assert out[0].token_ids == [1] and out[0].finish_reason == "stop"
    assert [o.token_ids for o in out[1:]] == [list(range(2, 2 + n))]


def test_token_batcher_sends_the_first_token_at_once_then_every_interval_and_the_final():
    batcher = TokenBatcher(3)
    sent = [batcher.push(delta(0, t)) for t in range(1, 8)] + [batcher.push(delta(0, 8, "stop"))]
    assert [o.token_ids if o else None for o in sent] == [
        [1],
        None,
        None,
        [2, 3, 4],
        None,
        None,
        [5, 6, 7],
        [8],
    ]
    assert sent[-1].finish_reason == "stop" and sent[-1].usage is not None


def test_token_batcher_holds_each_choice_separately_and_interval_one_sends_everything():
    batcher = TokenBatcher(2)
    assert batcher.push(delta(0, 1)).token_ids == [1]
    assert batcher.push(delta(1, 10)).token_ids == [10]
    assert batcher.push(delta(0, 2)) is None
    assert batcher.push(delta(1, 11)) is None
    assert batcher.push(delta(1, 12, "length")).token_ids == [11, 12]
    assert batcher.push(delta(0, 3)).token_ids == [2, 3]
    every = TokenBatcher(1)
    assert [every.push(delta(0, t)).token_ids for t in (1, 2, 3)] == [[1], [2], [3]]
    with pytest.raises(ValueError):
        TokenBatcher(0)
