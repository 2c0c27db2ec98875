"""OpenAI response shapes built from worker chunks."""

from __future__ import annotations

import json

from common.gen import worker_pb2 as pb
from gateway.responses import ChoiceState, ResponseMeta, UsageTotals, completion_logprobs, sse


def position(token: str, logprob: float, *alternatives: tuple[str, float]) -> pb.PositionLogprobs:
    return pb.PositionLogprobs(
        chosen=pb.TokenLogprob(token=token, logprob=logprob, token_bytes=token.encode()),
        top=[pb.TokenLogprob(token=t, logprob=lp, token_bytes=t.encode()) for t, lp in alternatives],
    )


def test_legacy_logprobs_offsets_continue_from_the_given_offset() -> None:
    shaped = completion_logprobs([position(" Pa", -0.5, (" Pa", -0.5)), position("ris", float("-inf"))], 4)
    assert shaped["tokens"] == [" Pa", "ris"]
    assert shaped["text_offset"] == [4, 7]
    assert shaped["token_logprobs"] == [-0.5, -9999.0], "-inf is not JSON"
    assert shaped["top_logprobs"] == [{" Pa": -0.5}, {"ris": -9999.0}]


def test_legacy_top_logprobs_hold_the_sampled_token_too() -> None:
    """OpenAI's legacy `logprobs: k` gives up to k + 1 entries: the sampled token always among them, as in
    vLLM; a researcher reading top_logprobs[i][tokens[i]] must find it whatever was sampled."""
    shaped = completion_logprobs([position(" Lyon", -3.0, (" Paris", -0.25), (" the", -1.5))], 0)
    assert shaped["top_logprobs"] == [{" Lyon": -3.0, " Paris": -0.25, " the": -1.5}]
    shaped = completion_logprobs([position(" Paris", -0.25, (" Paris", -0.25), (" the", -1.5))], 0)
    assert shaped["top_logprobs"] == [{" Paris": -0.25, " the": -1.5}], "k entries when it is among the top"


def test_usage_counts_the_prompt_once() -> None:
    totals = UsageTotals()
    for completion in (3, 4):
        totals.add(pb.Usage(prompt_tokens=10, completion_tokens=completion, cached_tokens=8))
    assert totals.as_dict() == {
        "prompt_tokens": 10,
        "completion_tokens": 7,
        "total_tokens": 17,
        "prompt_tokens_details": {"cached_tokens": 8},
    }


def test_chat_shapes() -> None:
    meta = ResponseMeta(id="chatcmpl-1", created=1, model="m", chat=True, num_logprobs=1, include_usage=True)
    role = meta.role_chunk(0)
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""} and role["usage"] is None
    logprobs = meta.render_logprobs([position("Hi", -0.5, ("Hi", -0.5))], 0)
    assert logprobs == {
        "content": [
            {
                "token": "Hi",
                "logprob": -0.5,
                "bytes": [72, 105],
                "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}],
            }
        ]
    }
    final = meta.delta_choice(0, "", "stop", None)
    assert final == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    full = meta.full([ChoiceState(text_parts=["a", "b"], finish_reason="length")], {"x": 1})
    assert full["object"] == "chat.completion"
    assert "system_fingerprint" in full and full["system_fingerprint"] is None  # OpenAI's key, vLLM's null
    assert role["system_fingerprint"] is None and meta.usage_chunk({})["system_fingerprint"] is None
    assert full["choices"][0]["message"] == {"role": "assistant", "content": "ab"}


def test_completion_chunk_and_sse_framing() -> None:
    meta = ResponseMeta(id="cmpl-1", created=1, model="m", chat=False, num_logprobs=None)
    event = sse(meta.chunk([meta.delta_choice(0, "é", None, None)]))
    assert event.startswith("data: ") and event.endswith("\n\n")
    body = json.loads(event.removeprefix("data: "))
    assert body["object"] == "text_completion" and "usage" not in body
    assert "system_fingerprint" in body and meta.full([], {})["system_fingerprint"] is None
    assert body["choices"] == [{"index": 0, "text": "é", "logprobs": None, "finish_reason": None}]
