"""The runner's lean inputs for decode-only steps (ModelRunner._prepare_decodes) equal the general ones
(`_prepare_batch`) field by field, dtypes included."""

from __future__ import annotations

import pytest
import torch

from tests.engine.factories import make_request, make_scheduler, paged_runner, tiny_llama
from worker.engine.scheduler import ScheduledRequest, SchedulerOutput
from worker.kernels import native_ops
from worker.model.runner import ModelRunner, StepInputs

BLOCK = 4


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    if native_ops() is None:
        pytest.skip("native kernels not built (make kernels): the lean path is for the native attention")
    return paged_runner(tiny_llama(), num_blocks=64, block_size=BLOCK, attention_backend="native")


def assert_same_tensor(got: torch.Tensor | None, expected: torch.Tensor | None) -> None:
    if expected is None:
        assert got is None
        return
    assert got.dtype == expected.dtype and got.is_contiguous() and torch.equal(got, expected)


def assert_same_inputs(got: StepInputs, expected: StepInputs) -> None:
    for name in ("input_ids", "positions", "logits_indices"):
        assert_same_tensor(getattr(got, name), getattr(expected, name))
    for name in ("slot_mapping", "decode_block_tables", "decode_mask", "decode_context_lens"):
        assert_same_tensor(getattr(got.meta, name), getattr(expected.meta, name))
    assert got.meta.num_decodes == expected.meta.num_decodes
    assert got.meta.native_decode == expected.meta.native_decode
    assert got.meta.prefills == expected.meta.prefills == []
    assert [r.request_id for r in got.sampling_requests] == [r.request_id for r in expected.sampling_requests]
    assert got.rows_per_request == expected.rows_per_request
    assert got.items == expected.items
    assert (got.prompt_spans, got.prompt_targets) == (expected.prompt_spans, expected.prompt_targets)


def test_decode_steps_get_the_same_inputs_from_the_lean_path(runner):
    scheduler = make_scheduler(num_blocks=64, block_size=BLOCK, max_num_batched_tokens=8)
    for n in (4, 7, 13, 2):  # new tokens on every slot of a block; chunked prefills before the decodes
        scheduler.add_request(make_request(prompt=[(3 * i + n) % 200 + 1 for i in range(n)], max_tokens=6))
    decode_steps = 0
    while scheduler.num_unfinished:
        plan = scheduler.schedule()
        items = sorted(plan.scheduled, key=lambda s: s.num_new_tokens != 1)
        if all(s.num_new_tokens == 1 for s in items):
            decode_steps += 1
            assert_same_inputs(runner.prepare(plan), runner._prepare_batch(items))
        requests, out = runner.execute(plan)
        sampled = {r.request_id: t for r, t in zip(requests, out.token_ids, strict=True)}
        scheduler.update_from_output(plan, sampled)
    assert decode_steps >= 4


def test_a_one_token_prompt_chunk_is_a_prefill_chunk_beside_the_decodes(runner):
    """A budget's last token can be a one-token chunk mid-prompt: it runs as a prefill chunk of one and
    samples nothing, while the decode beside it stays a decode (test_prefix_cache_numerics.py has why)."""
    mid_prompt = make_request(prompt=[5, 6, 7, 8, 9, 10])
    mid_prompt.block_ids = [3, 9]
    decoding = make_request(prompt=[1, 2, 3, 4])
    decoding.append_output_token(5)
    decoding.block_ids = [7, 2]
    plan = SchedulerOutput([ScheduledRequest(mid_prompt, 1, 4), ScheduledRequest(decoding, 1, 4)])
    got = runner.prepare(plan)
    assert got.sampling_requests == [decoding] and [s.request for s in got.items] == [decoding, mid_prompt]
    assert got.meta.num_decodes == 1 and got.meta.slot_mapping.tolist() == [2 * BLOCK, 9 * BLOCK]
    (chunk,) = got.meta.prefills
    assert (chunk.token_start, chunk.num_tokens, chunk.context_len) == (1, 1, 5)


def test_steps_with_prompt_logprobs_keep_the_general_path(runner, monkeypatch):
    request = make_request(prompt=[1, 2, 3], prompt_logprobs=1)
    request.block_ids = [4]
    monkeypatch.setattr(ModelRunner, "_prepare_decodes", lambda *a: pytest.fail("took the lean path"))
    runner.prepare(SchedulerOutput([ScheduledRequest(request, 1, 2)]))
