"""The engine's own forward pass over the paged cache against transformers' forward (tiny random Llama).

Every logit the engine computes, for every position of every sequence, is compared with
transformers' logits for the same full sequence.
"""

import copy

import pytest
import torch

from tests.engine.factories import make_request, make_scheduler, paged_runner, tiny_llama


@pytest.fixture(scope="module")
def hf_model():
    return tiny_llama()


def run_collecting_logits(
    hf_model,
    requests,
    *,
    block_size,
    num_blocks,
    budget,
    prefix_caching=True,
    arrivals=None,
    max_num_seqs=8,
    linear_backend="auto",
    attention_backend="auto",
    runner=None,
):
    """Greedy-decode the requests through scheduler + runner; return per-request {position: logits}."""
    scheduler = make_scheduler(
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_batched_tokens=budget,
        prefix_caching=prefix_caching,
        max_num_seqs=max_num_seqs,
    )
    runner = runner or paged_runner(hf_model, num_blocks, block_size, linear_backend, attention_backend)
    arrivals = arrivals or [0] * len(requests)
    logits_by_request = {r.request_id: {} for r in requests}
    plans, step = [], 0
    while step == 0 or scheduler.num_unfinished or any(a >= step for a in arrivals):
        for r, arrival in zip(requests, arrivals, strict=True):
            if arrival == step:
                scheduler.add_request(r)
        step += 1
        if not scheduler.num_unfinished:
            continue
        plan = scheduler.schedule()
        plans.append(plan)
        items, logits = runner.all_logits(plan)
        row, sampled = 0, {}
        for item in items:
            rows = logits[row : row + item.num_new_tokens]
            for offset in range(item.num_new_tokens):
                logits_by_request[item.request.request_id][item.start + offset] = rows[offset]
            if item.samples:
                sampled[item.request.request_id] = int(rows[-1].argmax())
            row += item.num_new_tokens
        scheduler.update_from_output(plan, sampled)
        assert step < 2000
    assert scheduler.block_manager.num_used_blocks == 0
    return logits_by_request, plans, scheduler


def assert_matches_transformers(hf_model, requests, logits_by_request) -> None:
    """The engine's logits against transformers' forward of the same model in float64: the reference is the
    exact math, so the tolerance is the engine's own rounding alone, not the sum of two float32 paths'."""
    reference = copy.deepcopy(hf_model).double()
    for r in requests:
        with torch.no_grad():
            expected = reference(torch.tensor([r.all_token_ids])).logits[0]
        positions = sorted(logits_by_request[r.request_id])
        assert positions, "no logits computed"
        got = torch.stack([logits_by_request[r.request_id][p] for p in positions])
        torch.testing.assert_close(got.double(), expected[positions], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("linear_backend", "attention_backend"), [("onednn", "native"), ("torch", "native"), ("onednn", "torch")]
)
@pytest.mark.parametrize("block_size", [1, 16])
def test_single_and_batched(hf_model, block_size, linear_backend, attention_backend):
    requests = [make_request(num_prompt_tokens=n, max_tokens=6) for n in (1, 7, 23, 40)]
    logits, plans, _ = run_collecting_logits(
        hf_model,
        requests,
        block_size=block_size,
        num_blocks=512,
        budget=512,
        linear_backend=linear_backend,
        attention_backend=attention_backend,
    )
    assert max(len(p.scheduled) for p in plans) == 4
    assert_matches_transformers(hf_model, requests, logits)


def test_chunked_prefill(hf_model):
    requests = [make_request(num_prompt_tokens=57, max_tokens=4)]
    logits, plans, _ = run_collecting_logits(hf_model, requests, block_size=16, num_blocks=64, budget=10)
    assert [p.scheduled[0].num_new_tokens for p in plans[:6]] == [10, 10, 10, 10, 10, 7]
    assert_matches_transformers(hf_model, requests, logits)


def test_mixed_prefill_and_decode_in_one_step(hf_model):
    requests = [make_request(num_prompt_tokens=n, max_tokens=8) for n in (12, 30, 5)]
    logits, plans, _ = run_collecting_logits(
        hf_model, requests, block_size=4, num_blocks=128, budget=64, arrivals=[0, 3, 5]
    )
    mixed = [p for p in plans if {s.num_new_tokens == 1 for s in p.scheduled} == {True, False}]
    assert mixed, "expected a step with both a prefill and a decode"
    assert_matches_transformers(hf_model, requests, logits)


def test_after_preemption(hf_model):
    requests = [make_request(num_prompt_tokens=n, max_tokens=24) for n in (10, 14, 9)]
    logits, _, scheduler = run_collecting_logits(hf_model, requests, block_size=4, num_blocks=16, budget=64)
    assert scheduler.num_preemptions > 0
    assert_matches_transformers(hf_model, requests, logits)


def test_with_prefix_cache_hits(hf_model):
    shared = [(5 * i + 1) % 250 for i in range(40)]
    requests = [make_request(prompt=shared + tail, max_tokens=5) for tail in ([3], [4, 5, 6], [7] * 12)]
    logits, _, scheduler = run_collecting_logits(
        hf_model, requests, block_size=16, num_blocks=64, budget=64, arrivals=[0, 4, 6]
    )
    assert scheduler.block_manager.prefix_hits >= 64
    assert min(logits[requests[1].request_id]) == 32  # its first 32 tokens came from the cache
    assert_matches_transformers(hf_model, requests, logits)


def test_outputs_identical_with_and_without_prefix_caching(hf_model):
    shared = [(3 * i + 2) % 250 for i in range(33)]
    outs = []
    for caching in (True, False):
        requests = [make_request(prompt=shared + [i], max_tokens=10) for i in range(3)]
        run_collecting_logits(
            hf_model,
            requests,
            block_size=8,
            num_blocks=64,
            budget=64,
            prefix_caching=caching,
            arrivals=[0, 2, 4],
        )
        outs.append([r.output_token_ids for r in requests])
    assert outs[0] == outs[1]


def test_requests_arriving_together_with_one_prompt_hit_the_first_ones_prefill_and_match(hf_model):
    shared = [(7 * i + 4) % 250 for i in range(40)]
    outs = []
    for caching in (True, False):
        requests = [make_request(prompt=shared + [i + 1] * (i + 1), max_tokens=6) for i in range(3)]
        logits, _, scheduler = run_collecting_logits(
            hf_model, requests, block_size=16, num_blocks=64, budget=128, prefix_caching=caching
        )
        if caching:  # the later two waited a step for the first's prefill, then found its 32 tokens cached
            assert [min(logits[r.request_id]) for r in requests] == [0, 32, 32]
            assert [r.num_prefix_waits for r in requests] == [0, 1, 1]
        assert_matches_transformers(hf_model, requests, logits)
        outs.append([r.output_token_ids for r in requests])
    assert outs[0] == outs[1]


def test_preempted_and_resumed_gives_the_same_greedy_output(hf_model):
    outs, preemptions = [], []
    for num_blocks in (256, 16):
        requests = [make_request(num_prompt_tokens=n, max_tokens=30) for n in (10, 14, 9)]
        _, _, scheduler = run_collecting_logits(
            hf_model, requests, block_size=4, num_blocks=num_blocks, budget=64
        )
        outs.append([r.output_token_ids for r in requests])
        preemptions.append(scheduler.num_preemptions)
    assert preemptions[0] == 0 and preemptions[1] > 0
    assert outs[0] == outs[1]


def test_a_cached_prefix_moved_under_another_block_still_hits_and_matches(hf_model):
    """A growing request's next block holds a finished request's cached prefix: the prefix moves into the
    LRU victim (a block copy before the step), and a later request hits it there."""
    shared = [(11 * i + 5) % 250 for i in range(8)]
    grower = make_request(num_prompt_tokens=2, max_tokens=10)  # block 0; grows into block 1 at its 5th token
    first = make_request(prompt=shared + [3], max_tokens=1)  # blocks 1-3; 1 and 2 cached when it finishes
    again = make_request(prompt=shared + [4], max_tokens=4)
    logits, plans, scheduler = run_collecting_logits(
        hf_model, [grower, first, again], block_size=4, num_blocks=16, budget=64, arrivals=[0, 0, 5]
    )
    assert [p.block_copies for p in plans if p.block_copies] == [[(1, 3)]]
    assert min(logits[again.request_id]) == 8  # both shared blocks came from the cache
    assert_matches_transformers(hf_model, [grower, first, again], logits)
