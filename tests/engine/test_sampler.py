"""Batched sampling: truncation, penalties, min_tokens, logprobs, and seeds that ignore the batch. Every test
runs on both draws: the compiled kernel (the CPU's) and the torch ops (CUDA's, or a build without the
kernels)."""

import pytest
import torch

from tests.engine.factories import make_request, make_scheduler, paged_runner, tiny_llama
from worker.model import sampler
from worker.model.sampler import build_batch, sample

VOCAB = 50


@pytest.fixture(autouse=True, params=["kernel", "torch"])
def draw(request, monkeypatch):
    """Unseeded rows draw from torch's global generator: seeded here, so the distribution checks (about 3
    sigma wide) give the same verdict in every order xdist runs the tests in, instead of failing one run
    in a hundred."""
    torch.manual_seed(0)
    if request.param == "torch":
        monkeypatch.setattr(sampler, "native_op", lambda name: None)
    return request.param


def _sample(logits, requests, generators=None):
    return sample(logits, build_batch(requests, generators or {}, VOCAB, torch.device("cpu")))


def _logits(rows: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    logits = _logits(4)
    out = _sample(logits, [make_request(temperature=0.0) for _ in range(4)])
    assert out.token_ids == logits.argmax(-1).tolist()


def test_top_k_and_top_p_only_draw_from_the_allowed_set():
    logits = _logits()
    top5 = set(logits[0].topk(5).indices.tolist())
    drawn_k = {_sample(logits, [make_request(temperature=1.5, top_k=5)]).token_ids[0] for _ in range(200)}
    assert drawn_k <= top5 and len(drawn_k) > 1
    drawn_p = {_sample(logits, [make_request(temperature=1.0, top_p=1e-6)]).token_ids[0] for _ in range(50)}
    assert drawn_p == {int(logits[0].argmax())}


def test_truncation_keeps_to_its_own_rows():
    """A top-p row and a top-k row beside rows that came to the torch path for a penalty or a min-p: each
    row keeps its own set, whichever rows are sorted."""
    logits = _logits(4, seed=2)
    requests = [
        make_request(temperature=1.0, top_p=1e-6),
        make_request(temperature=1.0, presence_penalty=0.5),
        make_request(temperature=1.5, top_k=3),
        make_request(temperature=1.0, min_p=0.05),
    ]
    drawn = [set() for _ in requests]
    for _ in range(300):
        for row, token in enumerate(_sample(logits, requests).token_ids):
            drawn[row].add(token)
    assert drawn[0] == {int(logits[0].argmax())}
    assert len(drawn[1]) > 5  # nothing truncated: the penalty row draws from its whole distribution
    assert drawn[2] <= set(logits[2].topk(3).indices.tolist()) and len(drawn[2]) > 1
    probs = logits[3].softmax(-1)
    assert drawn[3] <= set((probs >= 0.05 * probs.max()).nonzero().flatten().tolist())


def test_min_p_removes_unlikely_tokens():
    logits = _logits()
    probs = logits.softmax(-1)[0]
    allowed = set((probs >= 0.2 * probs.max()).nonzero().flatten().tolist())
    drawn = {_sample(logits, [make_request(temperature=1.0, min_p=0.2)]).token_ids[0] for _ in range(300)}
    assert drawn <= allowed


def test_temperature_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1] + [1e-9] * (VOCAB - 3)]))
    counts = torch.zeros(3)
    for _ in range(2000):
        counts[_sample(logits, [make_request(temperature=1.0)]).token_ids[0]] += 1
    torch.testing.assert_close(counts / 2000, torch.tensor([0.7, 0.2, 0.1]), atol=0.04, rtol=0)


def test_each_row_of_a_batch_draws_from_its_own_distribution():
    """The batched draw (one uniform per row against the row's running sum): rows with different
    distributions in one call, the last token of one row impossible (probability 0)."""
    first = torch.log(torch.tensor([0.5, 0.3, 0.2] + [0.0] * (VOCAB - 3)))
    second = torch.log(torch.tensor([0.0] * (VOCAB - 2) + [0.25, 0.75]))
    logits = torch.stack([first, second] * 8)
    counts = torch.zeros(2, VOCAB)
    for _ in range(250):
        for row, token in enumerate(
            _sample(logits.clone(), [make_request(temperature=1.0) for _ in range(16)]).token_ids
        ):
            counts[row % 2, token] += 1
    share = counts / counts.sum(-1, keepdim=True)
    torch.testing.assert_close(share[0, :3], torch.tensor([0.5, 0.3, 0.2]), atol=0.03, rtol=0)
    torch.testing.assert_close(share[1, -2:], torch.tensor([0.25, 0.75]), atol=0.03, rtol=0)
    assert counts[0, 3:].sum() == 0 and counts[1, :-2].sum() == 0


def test_penalties_push_repeated_tokens_down():
    logits = torch.zeros(1, VOCAB)
    logits[0, 3] = 1.0
    logits[0, 4] = 0.9
    request = make_request(prompt=[1, 2], temperature=0.0, frequency_penalty=0.5, presence_penalty=0.5)
    request.append_output_token(3)
    assert _sample(logits, [request]).token_ids == [4]  # 1.0 - 0.5 - 0.5 < 0.9
    repeat = make_request(prompt=[3], temperature=0.0, repetition_penalty=2.0)
    assert _sample(logits, [repeat]).token_ids == [4]  # 1.0 / 2 < 0.9


def test_penalties_change_exactly_the_tokens_that_occurred():
    """Against the formulas over the whole vocabulary: frequency x count + presence off each output token,
    repetition on each prompt or output token, nothing else touched; three rows with their own settings."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(3, VOCAB, generator=gen) * 3
    settings = [
        dict(frequency_penalty=0.7, presence_penalty=0.3),
        dict(repetition_penalty=1.5),
        dict(frequency_penalty=-0.4, presence_penalty=1.1, repetition_penalty=0.8),
    ]
    outputs = [[3, 3, 7, 49], [5, 6], [7, 7, 7, 0]]
    requests = []
    for i, (extra, output) in enumerate(zip(settings, outputs, strict=True)):
        request = make_request(prompt=[1 + i, 2, 3], temperature=1.0, **extra)
        for token in output:
            request.append_output_token(token)
        requests.append(request)
    batch = build_batch(requests, {}, VOCAB, torch.device("cpu"))
    changed = logits.clone()
    sampler._apply_penalties(changed, batch)
    expected = logits.clone()
    for row, request in enumerate(requests):  # vLLM's order: repetition first, then frequency and presence
        p = request.params
        seen = torch.zeros(VOCAB, dtype=torch.bool)
        seen[torch.tensor(request.all_token_ids)] = True
        values = expected[row]
        penalized = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
        expected[row] = torch.where(seen, penalized, values)
        counts = torch.bincount(torch.tensor(request.output_token_ids), minlength=VOCAB).float()
        expected[row] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
    torch.testing.assert_close(changed, expected)


def test_bias_and_penalties_combine_in_vllms_order():
    """vLLM's sampler: logit_bias, then the repetition penalty, then frequency and presence. The order shows
    when they meet on one token, as a greedy pick between token 3 (penalized) and token 4 (untouched)."""
    logits = torch.zeros(1, VOCAB)
    logits[0, 3] = 1.0
    logits[0, 4] = 0.05
    both = make_request(prompt=[3], temperature=0.0, repetition_penalty=2.0, presence_penalty=0.8)
    both.append_output_token(3)
    assert _sample(logits, [both]).token_ids == [4]  # 1 / 2 - 0.8 < 0.05 (the other way: (1 - 0.8) / 2)
    logits[0, 4] = 0.9
    biased = make_request(prompt=[3], temperature=0.0, repetition_penalty=4.0, logit_bias={3: 1.0})
    assert _sample(logits, [biased]).token_ids == [4]  # (1 + 1) / 4 < 0.9


def test_min_tokens_bans_eos_and_stop_ids_until_reached():
    logits = torch.zeros(1, VOCAB)
    logits[0, 7] = 10.0
    logits[0, 9] = 9.0
    request = make_request(temperature=0.0, min_tokens=2, stop_token_ids=[9])
    request.eos_token_id = 7
    assert _sample(logits, [request]).token_ids not in ([7], [9])
    request.append_output_token(1)
    request.append_output_token(1)
    assert _sample(logits, [request]).token_ids == [7]


def test_allowed_token_ids_are_the_only_tokens_a_row_samples():
    """vLLM's allowed_token_ids, on its own row: greedy takes the best of them, sampling draws only them."""
    logits = _logits(3, seed=5)
    allowed = [3, 17, 41]
    logits[:, allowed] = torch.tensor([0.5, 1.0, 0.0])
    logits[:, 8] = 10.0  # what every row would take without the mask
    greedy = make_request(temperature=0.0, allowed_token_ids=allowed)
    hot = make_request(temperature=2.0, allowed_token_ids=allowed)
    free = make_request(temperature=0.0)
    for _ in range(40):
        assert _sample(logits, [greedy, hot, free]).token_ids[::2] == [17, 8]
    drawn = [_sample(logits[1:2], [hot]).token_ids[0] for _ in range(200)]
    assert set(drawn) == set(allowed)  # each at ~30% at temperature 2: all three in 200 draws


def test_bad_words_mask_the_token_that_would_complete_one():
    """vLLM's bad_words, as token sequences: a one-token word is never sampled, a longer one's last token
    only where the output ends with the rest of it."""
    logits = torch.zeros(1, VOCAB)
    logits[0, 5] = 10.0
    logits[0, 9] = 9.0
    logits[0, 4] = 8.0
    request = make_request(temperature=0.0)
    request.bad_word_ids = [[5], [7, 9]]
    assert _sample(logits, [request]).token_ids == [9]  # 5 never; 9 is free after anything but 7
    request.append_output_token(7)
    assert _sample(logits, [request]).token_ids == [4]  # after 7, 9 would complete [7, 9]
    request.append_output_token(3)
    assert _sample(logits, [request]).token_ids == [9]


def test_logprobs_are_of_the_model_distribution_with_top_k_sorted():
    logits = _logits(2)
    requests = [make_request(temperature=0.0, logprobs=3), make_request(temperature=0.0)]
    out = _sample(logits, requests)
    chosen, top_ids, top_values = out.logprobs[0]
    expected = logits[0].log_softmax(-1)
    assert abs(chosen - expected[out.token_ids[0]].item()) < 1e-5
    assert top_ids == expected.topk(3).indices.tolist()
    assert top_values == sorted(top_values, reverse=True)
    assert out.logprobs[1] is None


def test_logprobs_of_the_rows_that_asked_whatever_their_place_in_the_batch():
    """Rows asking for different numbers of alternatives (0 included) among rows that ask for none, each
    given its own row's figures."""
    logits = _logits(5, seed=4)
    asks = [None, 2, None, 0, 4]
    out = _sample(logits, [make_request(temperature=0.0, logprobs=k) for k in asks])
    expected = logits.log_softmax(-1)
    for row, k in enumerate(asks):
        if k is None:
            assert out.logprobs[row] is None
            continue
        chosen, top_ids, top_values = out.logprobs[row]
        assert abs(chosen - expected[row, out.token_ids[row]].item()) < 1e-5
        best = expected[row].topk(k)
        assert top_ids == best.indices.tolist()
        torch.testing.assert_close(torch.tensor(top_values), best.values)


def _run_seeded(hf_model, requests) -> dict:
    scheduler = make_scheduler(num_blocks=256, block_size=16, max_num_batched_tokens=512)
    runner = paged_runner(hf_model, 256, 16)
    for r in requests:
        scheduler.add_request(r)
    while scheduler.num_unfinished:
        plan = scheduler.schedule()
        reqs, out = runner.execute(plan)
        scheduler.update_from_output(
            plan, {r.request_id: t for r, t in zip(reqs, out.token_ids, strict=True)}
        )
    return {r.request_id: r.output_token_ids for r in requests}


def test_seeded_sample_is_the_same_alone_and_in_a_batch():
    hf_model = tiny_llama(seed=3)
    prompt = [11, 12, 13, 14, 15]
    alone = make_request(prompt=prompt, max_tokens=20, temperature=1.0, seed=1234)
    in_batch = make_request(prompt=prompt, max_tokens=20, temperature=1.0, seed=1234)
    others = [make_request(num_prompt_tokens=n, max_tokens=20, temperature=1.0) for n in (3, 9, 17)]
    others.append(
        make_request(num_prompt_tokens=4, max_tokens=20, temperature=1.0, top_p=0.8)
    )  # the torch path
    others.append(make_request(num_prompt_tokens=6, max_tokens=20, temperature=0.7, seed=5))
    first = _run_seeded(hf_model, [alone])[alone.request_id]
    second = _run_seeded(hf_model, [others[0], in_batch, *others[1:]])[in_batch.request_id]
    assert first == second
    different_seed = make_request(prompt=prompt, max_tokens=20, temperature=1.0, seed=99)
    assert _run_seeded(hf_model, [different_seed])[different_seed.request_id] != first


def test_seeded_rows_draw_from_the_distribution():
    """A seed fixes the draw, not the distribution: over many seeds one row's tokens follow its softmax,
    on the kernel's path (temperature only) and on the torch path (with a penalty, here of no effect)."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2] + [1e-12] * (VOCAB - 3)]))
    for extra in ({}, {"presence_penalty": 0.5}):
        counts = torch.zeros(3)
        for seed in range(1500):
            request = make_request(temperature=1.0, seed=seed, **extra)
            generators = {request.request_id: torch.Generator().manual_seed(seed)}
            counts[_sample(logits, [request], generators).token_ids[0]] += 1
        torch.testing.assert_close(counts / 1500, torch.tensor([0.5, 0.3, 0.2]), atol=0.04, rtol=0)
