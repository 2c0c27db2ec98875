"""The native kernels split their work over torch's intra-op threads (output channels, sequences, heads,
query tiles). `make test` runs each pytest process on one thread (tests/conftest.py), so this file is where
the split itself is tested: the same steps at one thread and at two give the same logits and tokens, for every
linear kernel the decode op chains, on prefill chunks (a long prompt among short ones) and decode steps.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.factories import make_request, make_scheduler
from tests.engine.test_decode_layers import BLOCK, CASES, NUM_BLOCKS, TOL, prompts, runner_for
from worker.kernels import native_ops


@pytest.fixture(autouse=True)
def _restore_threads():
    ops = native_ops()
    if ops is None or not hasattr(ops, "decode_layers"):
        pytest.skip("native kernels not built (make kernels)")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def step_logits(case: str, threads: int) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Every step's logits and every request's tokens, with torch on `threads` threads."""
    torch.set_num_threads(threads)
    runner = runner_for("head_dim_64", case)
    scheduler = make_scheduler(
        num_blocks=NUM_BLOCKS, block_size=BLOCK, max_num_batched_tokens=64, max_num_seqs=12
    )
    long_prompt = [(13 * i + 7) % 250 + 1 for i in range(150)]  # prefill chunks of 64 past the first block
    requests = [make_request(prompt=p, max_tokens=6) for p in [long_prompt, *prompts(11)]]
    for request in requests:
        scheduler.add_request(request)
    logits_per_step = []
    while scheduler.num_unfinished:
        plan = scheduler.schedule()
        inputs = runner.prepare(plan)
        logits = runner.model.forward(
            inputs.input_ids, inputs.positions, inputs.meta, runner.kv_caches, inputs.logits_indices
        )
        logits_per_step.append(logits)
        tokens = logits.argmax(dim=-1).tolist()
        scheduler.update_from_output(
            plan, {r.request_id: t for r, t in zip(inputs.sampling_requests, tokens, strict=True)}
        )
    return logits_per_step, [r.all_token_ids[r.num_prompt_tokens :] for r in requests]


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_threads_compute_what_one_does(case):
    one_logits, one_tokens = step_logits(case, 1)
    two_logits, two_tokens = step_logits(case, 2)
    assert torch.get_num_threads() == 2
    assert two_tokens == one_tokens
    assert all(len(tokens) == 6 for tokens in one_tokens)
    assert len(two_logits) == len(one_logits) >= 8
    for two, one in zip(two_logits, one_logits, strict=True):
        torch.testing.assert_close(two, one, **TOL)
