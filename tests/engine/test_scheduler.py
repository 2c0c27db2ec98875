"""Scheduler: budgets, FCFS, chunked prefill, preemption, abort, refusal. No model."""

import random

import pytest

from tests.engine.factories import ScriptedRunner, drive, make_request, make_scheduler
from worker.engine.request import RequestStatus


def _assert_no_blocks_held(scheduler) -> None:
    bm = scheduler.block_manager
    assert bm.num_used_blocks == 0
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_budgets_are_never_exceeded_on_a_random_workload():
    rng = random.Random(1)
    scheduler = make_scheduler(num_blocks=40, block_size=4, max_num_seqs=5, max_num_batched_tokens=24)
    requests = [
        make_request(num_prompt_tokens=rng.randint(1, 60), max_tokens=rng.randint(1, 20)) for _ in range(30)
    ]
    for r in requests:
        scheduler.add_request(r)
    plans = drive(scheduler, ScriptedRunner())
    for plan in plans:
        assert plan.num_batched_tokens <= 24
        assert len(plan.scheduled) <= 5
        assert len({s.request.request_id for s in plan.scheduled}) == len(plan.scheduled)
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in requests)
    assert all(r.num_output_tokens == r.max_tokens for r in requests)
    _assert_no_blocks_held(scheduler)


def test_long_prompt_is_chunked_and_decodes_of_others_keep_running():
    scheduler = make_scheduler(max_num_batched_tokens=16, block_size=4, prefix_caching=False)
    short = make_request(num_prompt_tokens=4, max_tokens=20)
    scheduler.add_request(short)
    drive_steps = [scheduler.schedule()]
    runner = ScriptedRunner()
    reqs, out = runner.execute(drive_steps[0])
    scheduler.update_from_output(
        drive_steps[0], dict(zip([r.request_id for r in reqs], out.token_ids, strict=True))
    )
    long = make_request(num_prompt_tokens=50, max_tokens=2)
    scheduler.add_request(long)
    chunks = []
    while long.num_output_tokens == 0:
        plan = scheduler.schedule()
        ids = {s.request.request_id: s for s in plan.scheduled}
        assert short.request_id in ids and ids[short.request_id].num_new_tokens == 1  # decode never stalls
        chunks.append(ids[long.request_id].num_new_tokens)
        reqs, out = runner.execute(plan)
        scheduler.update_from_output(
            plan, dict(zip([r.request_id for r in reqs], out.token_ids, strict=True))
        )
    assert sum(chunks) == 50 and len(chunks) == 4 and max(chunks) == 15


def test_first_come_first_served_admission():
    scheduler = make_scheduler(max_num_seqs=2, max_num_batched_tokens=100)
    requests = [make_request(num_prompt_tokens=5, max_tokens=3) for _ in range(5)]
    for r in requests:
        scheduler.add_request(r)
    first_step = {}
    for step, plan in enumerate(drive(scheduler, ScriptedRunner())):
        for s in plan.scheduled:
            first_step.setdefault(s.request.request_id, step)
    order = [first_step[r.request_id] for r in requests]
    assert order == sorted(order)


def test_preemption_takes_the_most_recent_and_everything_still_finishes():
    scheduler = make_scheduler(num_blocks=8, block_size=4, max_num_seqs=4, max_num_batched_tokens=64)
    requests = [make_request(num_prompt_tokens=6, max_tokens=14) for _ in range(3)]
    for r in requests:
        scheduler.add_request(r)
    plans = drive(scheduler, ScriptedRunner())
    preempted = [r for plan in plans for r in plan.preempted]
    assert preempted, "the pool is too small for all three: someone must be preempted"
    assert preempted[0] is requests[-1]
    assert all(r.num_output_tokens == 14 for r in requests)
    _assert_no_blocks_held(scheduler)


def test_preempted_request_produces_the_same_tokens():
    alone = make_scheduler(num_blocks=64, block_size=4)
    tight = make_scheduler(num_blocks=8, block_size=4)
    outputs = []
    for scheduler in (alone, tight):
        requests = [make_request(prompt=[5, 6, 7, 8, 9, 10], max_tokens=14) for _ in range(3)]
        for r in requests:
            scheduler.add_request(r)
        drive(scheduler, ScriptedRunner())
        outputs.append([r.output_token_ids for r in requests])
    assert tight.num_preemptions > 0 and alone.num_preemptions == 0
    assert outputs[0] == outputs[1]


def test_abort_frees_blocks_at_once_wherever_the_request_is():
    scheduler = make_scheduler(max_num_seqs=1)
    running, waiting = make_request(num_prompt_tokens=9), make_request(num_prompt_tokens=9)
    scheduler.add_request(running)
    scheduler.add_request(waiting)
    scheduler.schedule()
    assert running.block_ids
    assert scheduler.finish_request(running.request_id, RequestStatus.FINISHED_ABORTED) is running
    assert scheduler.finish_request(waiting.request_id, RequestStatus.FINISHED_ABORTED) is waiting
    assert scheduler.num_unfinished == 0
    _assert_no_blocks_held(scheduler)


def test_aborted_during_a_step_is_not_updated():
    scheduler = make_scheduler()
    request = make_request(num_prompt_tokens=5)
    scheduler.add_request(request)
    plan = scheduler.schedule()
    scheduler.finish_request(request.request_id, RequestStatus.FINISHED_ABORTED)
    new_tokens, finished = scheduler.update_from_output(plan, {request.request_id: 42})
    assert new_tokens == [] and finished == [] and request.output_token_ids == []
    _assert_no_blocks_held(scheduler)


@pytest.mark.parametrize(
    ("prompt_len", "max_tokens", "message"),
    [(250, 10, "maximum context length is 256"), (100, 100, "whole cache holds 128 tokens")],
)
def test_requests_that_can_never_fit_are_refused(prompt_len, max_tokens, message):
    scheduler = make_scheduler(num_blocks=32, block_size=4, max_model_len=256)
    with pytest.raises(ValueError, match=message):
        scheduler.add_request(make_request(num_prompt_tokens=prompt_len, max_tokens=max_tokens))


def test_stop_conditions_eos_min_tokens_and_stop_token_ids():
    scheduler = make_scheduler()
    eos_request = make_request(num_prompt_tokens=3, max_tokens=10)
    eos_request.eos_token_id = 7
    scheduler.add_request(eos_request)
    plan = scheduler.schedule()
    _, finished = scheduler.update_from_output(plan, {eos_request.request_id: 7})
    assert finished == [eos_request] and eos_request.status.finish_reason == "stop"

    ignoring = make_request(num_prompt_tokens=3, max_tokens=2, ignore_eos=True)
    ignoring.eos_token_id = 7
    stop_ids = make_request(num_prompt_tokens=3, max_tokens=10, stop_token_ids=[11])
    for r in (ignoring, stop_ids):
        scheduler.add_request(r)
    plan = scheduler.schedule()
    _, finished = scheduler.update_from_output(plan, {ignoring.request_id: 7, stop_ids.request_id: 11})
    assert finished == [stop_ids] and ignoring.status == RequestStatus.RUNNING


def test_prefix_cache_hits_are_counted_in_tokens():
    scheduler = make_scheduler(block_size=4, max_num_batched_tokens=100)
    prompt = list(range(1, 20))
    first = make_request(prompt=prompt, max_tokens=1)
    scheduler.add_request(first)
    drive(scheduler, ScriptedRunner())
    second = make_request(prompt=prompt, max_tokens=1)
    scheduler.add_request(second)
    plan = scheduler.schedule()
    assert plan.prefix_hits == 16 and plan.scheduled[0].num_new_tokens == 3
    assert second.num_cached_tokens == 16
    bm = scheduler.block_manager
    assert (bm.prefix_queries, bm.prefix_hits) == (38, 16)


def test_a_preempted_request_resuming_is_no_prefix_cache_query():
    """As vLLM's prefix_cache_queries/hits: only a request's first lookup counts. A victim resuming finds its
    own blocks again; counted, it made the hit rate of prompts that share nothing climb with preemptions."""
    scheduler = make_scheduler(num_blocks=8, block_size=4, max_num_seqs=4, max_num_batched_tokens=64)
    requests = [make_request(prompt=[50 * i + t for t in range(1, 7)], max_tokens=14) for i in range(3)]
    for r in requests:
        scheduler.add_request(r)
    plans = drive(scheduler, ScriptedRunner())
    assert any(plan.preempted for plan in plans)
    assert sum(plan.prefix_queries for plan in plans) == sum(r.num_prompt_tokens for r in requests)
    assert sum(plan.prefix_hits for plan in plans) == sum(r.num_cached_tokens for r in requests) == 0
    assert scheduler.block_manager.prefix_hits > 0  # the resumes did hit (the load reports count them)


def test_a_request_waits_for_the_prefill_of_the_prompt_it_shares_then_hits_it():
    scheduler = make_scheduler(block_size=4, max_num_batched_tokens=100)
    prompt = list(range(1, 21))
    first, second = make_request(prompt=prompt, max_tokens=2), make_request(prompt=prompt, max_tokens=2)
    other = make_request(prompt=list(range(50, 60)), max_tokens=2)
    for r in (first, second, other):
        scheduler.add_request(r)
    plan = scheduler.schedule()
    assert [s.request for s in plan.scheduled] == [first, other]  # the other tenant does not wait
    assert list(scheduler.waiting) == [second] and second.num_prefix_waits == 1
    runner = ScriptedRunner()
    reqs, out = runner.execute(plan)
    scheduler.update_from_output(plan, dict(zip([r.request_id for r in reqs], out.token_ids, strict=True)))
    plan = scheduler.schedule()
    item = next(s for s in plan.scheduled if s.request is second)
    assert second.num_cached_tokens == 16 and item.num_new_tokens == 4  # (20 - 1) // 4 blocks hit
    drive(scheduler, runner)
    assert first.output_token_ids == second.output_token_ids
    _assert_no_blocks_held(scheduler)


def test_no_wait_without_prefix_caching_or_for_a_prompt_only_partly_shared_in_its_first_block():
    for caching, tail in ((False, [1, 2, 3]), (True, [])):
        scheduler = make_scheduler(block_size=4, max_num_batched_tokens=100, prefix_caching=caching)
        first = make_request(prompt=list(range(1, 21)), max_tokens=2)
        second = make_request(prompt=[1, 2, 3, 99, *range(5, 21), *tail], max_tokens=2)  # block 0 differs
        scheduler.add_request(first)
        scheduler.add_request(second)
        assert [s.request for s in scheduler.schedule().scheduled] == [first, second]


def test_waits_for_shared_prefixes_are_bounded_and_change_no_output():
    """A random workload of tenants sharing prompts, short and chunked: every request finishes, none waits
    more than MAX_PREFIX_WAITS steps, and the tokens are those of the same load without prefix caching."""
    from worker.engine.scheduler import MAX_PREFIX_WAITS

    outputs, hits = [], []
    for caching in (True, False):
        rng = random.Random(7)
        scheduler = make_scheduler(
            num_blocks=60, block_size=4, max_num_seqs=6, max_num_batched_tokens=24, prefix_caching=caching
        )
        prefixes = [[rng.randrange(1, 200) for _ in range(rng.choice((8, 20, 45)))] for _ in range(4)]
        requests = [
            make_request(prompt=rng.choice(prefixes) + [rng.randrange(1, 200)], max_tokens=rng.randint(1, 6))
            for _ in range(40)
        ]
        runner, step = ScriptedRunner(), 0
        pending = list(requests)
        while pending or scheduler.num_unfinished:
            for _ in range(rng.randint(0, 3)):  # arrivals between steps, often several at once
                if pending:
                    scheduler.add_request(pending.pop(0))
            if scheduler.num_unfinished:
                plan = scheduler.schedule()
                reqs, out = runner.execute(plan)
                ids = [r.request_id for r in reqs]
                scheduler.update_from_output(plan, dict(zip(ids, out.token_ids, strict=True)))
            step += 1
            assert step < 5000
        assert all(r.status == RequestStatus.FINISHED_LENGTH for r in requests)
        assert max(r.num_prefix_waits for r in requests) <= MAX_PREFIX_WAITS
        assert any(r.num_prefix_waits for r in requests) == caching
        _assert_no_blocks_held(scheduler)
        outputs.append([r.output_token_ids for r in requests])
        hits.append(scheduler.block_manager.prefix_hits)
    assert outputs[0] == outputs[1] and hits[0] > 0
