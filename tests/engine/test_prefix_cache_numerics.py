"""A prompt's logits do not depend on what the prefix cache holds, where the kernels compute each row alike
whatever the batch (bfloat16 on AMX tiles or oneDNN's native bfloat16 GEMM).

When every full block of a prompt is cached, only its last token is left to compute. That one token is a
prefill chunk of one, not a decode: run by the decode kernels it came out a bfloat16 rounding away from the
same prompt prefilled whole (SmolLM2 on an AMX Xeon: 0.25-0.31 in the logits of every later step), enough to
change a seeded sample from one request to its repeat.
"""

from __future__ import annotations

import pytest
import torch

from common.linear import amx_available, onednn_available
from tests.engine.factories import make_request, make_scheduler
from tests.engine.test_decode_layers import head_dim_64_llama
from worker.kernels import native_ops
from worker.model.model import LlamaForPagedAttention
from worker.model.runner import ModelRunner

BLOCK = 4


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    probe = torch.zeros(32, 32, dtype=torch.bfloat16)
    if native_ops() is None:
        pytest.skip("native kernels not built (make kernels)")
    if not (amx_available(probe) or onednn_available(probe)):
        pytest.skip("no native bfloat16 GEMM on this CPU: its kernels change method with the batch size")
    model = LlamaForPagedAttention(head_dim_64_llama().to(torch.bfloat16), max_positions=256)
    return ModelRunner(model, 128, BLOCK, attention_backend="native")


def run(runner: ModelRunner, scheduler, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy to the end: the new tokens of each step and each step's logits."""
    request = make_request(prompt=prompt, max_tokens=5)
    scheduler.add_request(request)
    new_tokens, logits = [], []
    while scheduler.num_unfinished:
        plan = scheduler.schedule()
        new_tokens.append(plan.scheduled[0].num_new_tokens)
        inputs = runner.prepare(plan)
        step = runner.model.forward(
            inputs.input_ids, inputs.positions, inputs.meta, runner.kv_caches, inputs.logits_indices
        )
        logits.append(step.float())
        token = int(step.argmax(dim=-1)[0])
        scheduler.update_from_output(plan, {request.request_id: token})
    return new_tokens, logits


def test_a_prompt_left_with_its_last_token_computes_what_it_did_whole(runner):
    prompt = [(5 * i + 3) % 250 + 1 for i in range(4 * BLOCK + 1)]  # 4 full blocks + the token left over
    scheduler = make_scheduler(num_blocks=128, block_size=BLOCK, max_num_batched_tokens=64)
    whole_steps, whole = run(runner, scheduler, prompt)
    cached_steps, cached = run(runner, scheduler, prompt)
    assert whole_steps[0] == len(prompt) and cached_steps[0] == 1  # the repeat found 4 blocks cached
    for step_whole, step_cached in zip(whole, cached, strict=True):
        assert torch.equal(step_whole, step_cached)


def test_a_prompts_last_token_alone_is_a_prefill_chunk_and_a_generated_one_a_decode(runner):
    prompt = [(7 * i + 1) % 250 + 1 for i in range(2 * BLOCK + 1)]
    scheduler = make_scheduler(num_blocks=128, block_size=BLOCK, max_num_batched_tokens=64)
    run(runner, scheduler, prompt)
    scheduler.add_request(make_request(prompt=prompt, max_tokens=2))
    plan = scheduler.schedule()
    inputs = runner.prepare(plan)
    assert plan.scheduled[0].num_new_tokens == 1
    assert inputs.meta.num_decodes == 0 and len(inputs.meta.prefills) == 1
    scheduler.update_from_output(plan, {plan.scheduled[0].request.request_id: 5})
    decode = runner.prepare(scheduler.schedule())
    assert decode.meta.num_decodes == 1 and decode.meta.prefills == []


def sampled_logits(
    runner: ModelRunner, scheduler, prompt: list[int], preempt_after: int | None, steps: list | None = None
) -> list:
    """Greedy to the end, the logits of every step that samples; preempted once after `preempt_after`
    generated tokens (freed and queued again, as the scheduler does when blocks run out). `steps` gets
    each step's (first position, tokens run)."""
    request = make_request(prompt=prompt, max_tokens=12)
    scheduler.add_request(request)
    logits: list[torch.Tensor] = []
    steps = [] if steps is None else steps
    while scheduler.num_unfinished:
        if (
            preempt_after is not None
            and request.num_output_tokens == preempt_after
            and request in scheduler.running
        ):
            scheduler.running.remove(request)
            scheduler._preempt(request)
            preempt_after = None
        plan = scheduler.schedule()
        steps.append((plan.scheduled[0].start, plan.scheduled[0].num_new_tokens))
        inputs = runner.prepare(plan)
        step = runner.model.forward(
            inputs.input_ids, inputs.positions, inputs.meta, runner.kv_caches, inputs.logits_indices
        )
        sampled = {}
        if len(inputs.logits_indices):
            logits.append(step.float())
            sampled = {request.request_id: int(step.argmax(dim=-1)[0])}
        scheduler.update_from_output(plan, sampled)
    return logits


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_a_preempted_request_resumes_with_the_logits_it_had(runner, prefix_caching):
    """Its generated tokens are computed again in one step, each as a decode row, as they were first
    computed: recomputed as a prefill chunk they came out a bfloat16 rounding away, and every later step's
    logits with them (and one decode step per token took a preempted request's whole output as long again)."""
    prompt = [(3 * i + 2) % 250 + 1 for i in range(2 * BLOCK + 2)]
    alone = sampled_logits(runner, make_scheduler(128, BLOCK, 64, prefix_caching=False), prompt, None)
    scheduler = make_scheduler(128, BLOCK, 64, prefix_caching=prefix_caching)
    # 6 generated (5 of them fed back): the cache keeps 3 full blocks (12 tokens), so 4 generated tokens run
    # again; without the cache the 10 prompt tokens and the 6 generated ones
    steps: list[tuple[int, int]] = []
    resumed = sampled_logits(runner, scheduler, prompt, 6, steps)
    assert scheduler.num_preemptions == 1 and len(resumed) == len(alone) == 12
    replay = [(12, 4)] if prefix_caching else [(0, 10), (10, 6)]  # (first position, tokens) after preemption
    assert steps[6 : 6 + len(replay)] == replay  # the prompt, 5 decodes, then the replay
    for step_alone, step_resumed in zip(alone, resumed, strict=True):
        assert torch.equal(step_alone, step_resumed)
