"""Prompt-lookup speculation: drafts, acceptance, and greedy output identical to one token a step."""

from tests.engine.factories import make_request, make_scheduler, paged_runner, tiny_llama
from worker.engine.speculative import can_speculate, num_accepted, propose_ngram_drafts


def test_drafts_copy_what_followed_the_latest_match_of_the_tail():
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert propose_ngram_drafts(tokens, 3) == [7, 8, 5]  # the latest earlier "1 2 3" wins
    assert propose_ngram_drafts(tokens, 0) == []
    assert propose_ngram_drafts([4, 5, 6], 3) == []  # nothing repeats


def test_acceptance_stops_at_the_first_disagreement():
    assert num_accepted([5, 6, 7], [5, 6, 9, 1]) == 2
    assert num_accepted([5, 6], [4, 6, 1]) == 0
    assert num_accepted([], [3]) == 0


def test_only_plain_greedy_requests_speculate():
    assert can_speculate(make_request(temperature=0.0))
    assert not can_speculate(make_request(temperature=0.8))
    assert not can_speculate(make_request(temperature=0.0, logprobs=2))
    assert not can_speculate(make_request(temperature=0.0, repetition_penalty=1.2))


def _run(hf_model, requests, speculative_tokens: int) -> tuple[int, object]:
    scheduler = make_scheduler(num_blocks=128, block_size=4, max_num_batched_tokens=64, max_model_len=400)
    scheduler.config.num_speculative_tokens = speculative_tokens
    runner = paged_runner(hf_model, 128, 4)
    for r in requests:
        scheduler.add_request(r)
    steps = 0
    while scheduler.num_unfinished:
        plan = scheduler.schedule()
        reqs, out = runner.execute(plan)
        scheduler.update_from_output(
            plan, dict(zip([r.request_id for r in reqs], out.token_ids, strict=True))
        )
        steps += 1
    assert scheduler.block_manager.num_used_blocks == 0
    return steps, scheduler


def test_speculation_gives_the_same_greedy_tokens_in_fewer_steps():
    hf_model = tiny_llama(seed=5)
    prompt = [3, 14, 15, 92, 65, 35, 89, 79] * 3
    plain = [make_request(prompt=prompt, max_tokens=60), make_request(num_prompt_tokens=7, max_tokens=45)]
    spec = [make_request(prompt=prompt, max_tokens=60), make_request(num_prompt_tokens=7, max_tokens=45)]
    plain_steps, _ = _run(hf_model, plain, 0)
    spec_steps, _ = _run(hf_model, spec, 4)
    assert [r.output_token_ids for r in spec] == [r.output_token_ids for r in plain]
    assert [len(r.output_token_ids) for r in spec] == [60, 45]  # max_tokens is never overshot
    assert spec_steps < plain_steps
