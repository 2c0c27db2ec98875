"""The compiled one-pass draw (worker/kernels/sampling.cpp) against the torch sampler it stands in for."""

from __future__ import annotations

import pytest
import torch

from tests.engine.factories import make_request
from worker.kernels import native_ops
from worker.model import sampler
from worker.model.sampler import build_batch, sample


@pytest.fixture(scope="module")
def ops():
    loaded = native_ops()
    assert loaded is not None, "the kernels are built by `make kernels`, a dependency of `make test`"
    return loaded


def _draw(ops, logits: torch.Tensor, inv_temperature: list[float], uniforms: list[float]) -> list[int]:
    out = torch.empty(logits.shape[0], dtype=torch.long)
    ops.sample_rows(logits, torch.tensor(inv_temperature), torch.tensor(uniforms), out)
    return out.tolist()


def _inverse_cdf(logits: torch.Tensor, inv_t: float, u: float) -> int:
    """The torch sampler's draw for one row and one uniform, in float64 (the reference)."""
    probs = (logits.double() * inv_t).softmax(-1)
    cdf = probs.cumsum(-1)
    return int(
        torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64)).clamp(
            max=len(cdf) - 1
        )
    )


@pytest.mark.parametrize("vocab", [1, 7, 8, 50, 49152 + 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_rows_are_torch_argmax_ties_first(ops, vocab, dtype):
    gen = torch.Generator().manual_seed(vocab)
    logits = (torch.randn(6, vocab, generator=gen) * 4).to(dtype)
    logits[1] = 0.0  # all tied: the first
    if vocab > 3:
        logits[2, vocab - 1] = logits[2, 1] = 50.0  # two maxima: the first
    assert _draw(ops, logits, [0.0] * 6, [0.5] * 6) == logits.float().argmax(-1).tolist()


def test_a_nan_counts_as_largest_as_in_torch(ops):
    logits = torch.zeros(2, 40)
    logits[0, 5] = 100.0
    logits[0, 17] = float("nan")
    logits[1, 33] = float("nan")
    logits[1, 2] = float("nan")
    assert _draw(ops, logits, [0.0, 1.0], [0.5, 0.5]) == [17, 2]


@pytest.mark.parametrize("inv_t", [1.0, 0.5, 2.0])
def test_each_uniform_lands_on_the_token_the_cdf_gives(ops, inv_t):
    """Against the float64 inverse CDF: the same token for every uniform except where u * total falls
    within float32 rounding of a boundary (rare; at most 2 of 400 here)."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(1, 1003, generator=gen) * 2
    uniforms = torch.rand(400, generator=gen).clamp_(min=2.0**-30).tolist()
    drawn = [_draw(ops, logits, [inv_t], [u])[0] for u in uniforms]
    expected = [_inverse_cdf(logits[0], inv_t, u) for u in uniforms]
    assert sum(a != b for a, b in zip(drawn, expected, strict=True)) <= 2


def test_the_ends_of_the_uniform_range_and_impossible_tokens(ops):
    """A token of probability 0 (-inf) is never drawn, even at u just above 0 or just below 1."""
    logits = torch.full((1, 29), float("-inf"))
    logits[0, 3], logits[0, 20] = 1.0, 2.0
    assert _draw(ops, logits, [1.0], [2.0**-30]) == [3]
    assert _draw(ops, logits, [1.0], [1.0 - 2.0**-24]) == [20]
    everything_impossible = torch.full((1, 9), float("-inf"))
    assert _draw(ops, everything_impossible, [1.0], [0.5]) == [0]


def test_bfloat16_and_float32_logits_draw_the_same_tokens(ops):
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(16, 2051, generator=gen) * 3).bfloat16()
    uniforms = torch.rand(16, generator=gen).tolist()
    inv_t = [1.0, 0.0, 1.4, 0.7] * 4
    assert _draw(ops, logits, inv_t, uniforms) == _draw(ops, logits.float(), inv_t, uniforms)


def _nucleus_inverse_cdf(
    logits: torch.Tensor, inv_t: float, top_p: float, uniforms: list[float]
) -> list[int]:
    """The torch sampler's top-p draws for one row, in float64: the most likely tokens, each kept while the
    mass before it is at most p, then the inverse CDF over them in vocabulary order, for each uniform."""
    probs = (logits.double() * inv_t).softmax(-1)
    ordered, order = probs.sort(descending=True)
    removed = (ordered.cumsum(-1) - ordered) > top_p
    removed[0] = False
    kept = probs.clone()
    kept[order[removed]] = 0.0
    cdf = kept.cumsum(-1)
    return torch.searchsorted(cdf, torch.tensor(uniforms, dtype=torch.float64) * cdf[-1]).tolist()


@pytest.mark.parametrize("top_p", [1e-6, 0.3, 0.9, 0.999])
@pytest.mark.parametrize("scale", [0.5, 4.0])  # a flat row (a wide nucleus) and a peaked one
def test_top_p_rows_draw_from_the_nucleus_the_torch_path_keeps(ops, top_p, scale):
    """Against the float64 reference, 300 uniforms over one row of SmolLM2's vocabulary size. Every token
    drawn is in the nucleus up to float32 rounding of the running mass. On a peaked row it is the
    reference's token but within rounding of a boundary (at most 2); on a flat one the nucleus holds tens of
    thousands of tokens, the float32 sums move its edge by a few, and every draw past that shifts by as
    many, so only membership is checked there."""
    gen = torch.Generator().manual_seed(int(scale * 10) + int(top_p * 1000))
    logits = torch.randn(1, 49152, generator=gen) * scale
    uniforms = torch.rand(300, generator=gen).clamp_(min=2.0**-30).tolist()
    out = torch.empty(1, dtype=torch.long)
    drawn = []
    for u in uniforms:
        ops.sample_rows(logits, torch.tensor([1.0]), torch.tensor([u]), out, torch.tensor([top_p]))
        drawn.append(int(out[0]))
    probs = logits[0].double().softmax(-1)
    ordered, order = probs.sort(descending=True)
    mass_before = torch.empty_like(probs)
    mass_before[order] = ordered.cumsum(-1) - ordered
    assert all(float(mass_before[token]) <= top_p + 1e-4 for token in drawn)
    if scale > 1:
        expected = _nucleus_inverse_cdf(logits[0], 1.0, top_p, uniforms)
        assert sum(a != b for a, b in zip(drawn, expected, strict=True)) <= 2
    if top_p == 1e-6:
        assert set(drawn) == {int(logits[0].argmax())}


def test_top_p_of_one_and_greedy_rows_ignore_the_nucleus(ops):
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(3, 500, generator=gen)
    uniforms = torch.rand(3, generator=gen)
    out_plain, out_top_p = torch.empty(3, dtype=torch.long), torch.empty(3, dtype=torch.long)
    inv_t = torch.tensor([1.0, 0.0, 1.0])
    ops.sample_rows(logits, inv_t, uniforms, out_plain)
    ops.sample_rows(logits, inv_t, uniforms, out_top_p, torch.tensor([1.0, 0.2, 1.0]))
    assert out_top_p.tolist() == out_plain.tolist()
    assert int(out_top_p[1]) == int(logits[1].argmax())


def _kept_by_torch_path(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> set[int]:
    """The tokens the torch sampler's truncation keeps for one row (worker/model/sampler.py, float64)."""
    row = logits.double().unsqueeze(0)
    batch = build_batch(
        [make_request(temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p)],
        {},
        logits.shape[0],
        torch.device("cpu"),
    )
    kept = sampler._apply_truncation(row, batch)[0]
    return set(torch.isfinite(kept).nonzero().squeeze(1).tolist())


@pytest.mark.parametrize(
    "top_k, top_p, min_p",
    [
        (1, 1.0, 0.0),
        (50, 1.0, 0.0),
        (3000, 1.0, 0.0),
        (50, 0.5, 0.0),
        (0, 1.0, 0.05),
        (40, 0.9, 0.2),
        (0, 0.7, 0.01),
    ],
)
@pytest.mark.parametrize("scale", [0.5, 4.0])  # a flat row and a peaked one
def test_top_k_and_min_p_rows_draw_from_what_the_torch_path_keeps(ops, top_k, top_p, min_p, scale):
    """min-p, then top-k, then top-p over what they keep, in the torch path's order: every draw of 300
    uniforms is a token the torch path keeps (top-p's edge within float32 rounding of the running mass, as
    above), and top-k's k-th token, the row's largest and nothing past k are drawn as they should be."""
    gen = torch.Generator().manual_seed(int(scale * 10) + top_k + int(top_p * 100) + int(min_p * 1000))
    logits = torch.randn(1, 49152, generator=gen) * scale
    uniforms = torch.rand(300, generator=gen).clamp_(min=2.0**-30).tolist()
    out = torch.empty(1, dtype=torch.long)
    drawn = []
    for u in uniforms:
        ops.sample_rows(
            logits, torch.tensor([1.0]), torch.tensor([u]), out, torch.tensor([top_p]), torch.tensor([top_k]),
            torch.tensor([min_p]),
        )  # fmt: skip
        drawn.append(int(out[0]))
    kept = _kept_by_torch_path(logits[0], top_k, top_p, min_p)
    if top_p < 1.0:  # top-p's edge may move by float32 rounding: allow the next few tokens past it
        order = logits[0].argsort(descending=True)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order))
        edge = int(rank[list(kept)].max())
        kept |= set(order[: edge + 4].tolist())
    assert set(drawn) <= kept
    if top_k and top_p == 1.0 and min_p == 0.0:
        assert len(set(drawn)) <= top_k
        if top_k == 1:
            assert set(drawn) == {int(logits[0].argmax())}
        if top_k == 50 and scale < 1:  # a flat row: the 50 kept tokens are near-equally likely
            assert len(set(drawn)) >= 40


def test_min_p_and_top_k_follow_the_distribution_they_leave(ops):
    """Draw shares over a row of four likely tokens: top-k 2 keeps the first two in proportion, min-p 0.4
    drops those below 0.4 times the largest."""
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1] + [1e-9] * 60)
    logits = probs.log().unsqueeze(0)
    gen = torch.Generator().manual_seed(5)
    counts = {"top_k": torch.zeros(64), "min_p": torch.zeros(64)}
    out = torch.empty(1, dtype=torch.long)
    for u in torch.rand(3000, generator=gen).clamp_(min=2.0**-30).tolist():
        args = (logits, torch.tensor([1.0]), torch.tensor([u]), out)
        ops.sample_rows(*args, None, torch.tensor([2]), None)
        counts["top_k"][int(out[0])] += 1
        ops.sample_rows(*args, None, None, torch.tensor([0.4]))
        counts["min_p"][int(out[0])] += 1
    torch.testing.assert_close(
        counts["top_k"][:4] / 3000, torch.tensor([4 / 7, 3 / 7, 0, 0]), atol=0.03, rtol=0
    )
    torch.testing.assert_close(
        counts["min_p"][:4] / 3000, torch.tensor([4 / 9, 3 / 9, 2 / 9, 0]), atol=0.03, rtol=0
    )
    assert counts["top_k"][4:].sum() == 0 and counts["min_p"][4:].sum() == 0


def test_min_p_goes_before_top_p_as_in_vllm(ops):
    """min-p first, then top-p over the mass it kept (vLLM's sampler order). Over [0.35, 0.25, 0.2, 0.2],
    min-p 0.6 keeps the first two ([0.58, 0.42] of what is left) and top-p 0.5 then keeps only the first;
    top-p first (over the whole row) kept two, and both were drawn."""
    probs = torch.tensor([0.35, 0.25, 0.2, 0.2] + [1e-9] * 60)
    logits = probs.log().unsqueeze(0)
    assert _kept_by_torch_path(logits[0], 0, 0.5, 0.6) == {0}
    out = torch.empty(1, dtype=torch.long)
    drawn = set()
    for u in torch.rand(300, generator=torch.Generator().manual_seed(7)).clamp_(min=2.0**-30).tolist():
        args = (logits, torch.tensor([1.0]), torch.tensor([u]), out)
        ops.sample_rows(*args, torch.tensor([0.5]), None, torch.tensor([0.6]))
        drawn.add(int(out[0]))
    assert drawn == {0}


def test_the_kernel_refuses_a_negative_top_k(ops):
    out = torch.empty(1, dtype=torch.long)
    with pytest.raises(RuntimeError, match="top_k must be >= 0"):
        ops.sample_rows(
            torch.zeros(1, 8), torch.tensor([1.0]), torch.tensor([0.5]), out, None, torch.tensor([-1])
        )


def test_the_kernel_draws_every_row_the_changed_ones_on_their_own_copies(monkeypatch):
    """Rows with a temperature and truncation (top-k, top-p, min-p) only, seeded or not, go to the kernel in
    the logits' own dtype; a row with a penalty, a bias or a ban goes to it alone, without its neighbours, on
    a float32 copy with its changes made. The torch path is not taken on the CPU."""
    calls = []
    real = {name: getattr(sampler, name) for name in ("_native_draw", "_torch_draw")}
    for name, fn in real.items():
        monkeypatch.setattr(
            sampler,
            name,
            lambda logits, batch, uniforms, name=name, fn=fn: (
                calls.append((name, logits.shape[0], logits.dtype)) or fn(logits, batch, uniforms)
            ),
        )
    vocab, cpu = 256, torch.device("cpu")  # above the test prompts' token ids
    logits = torch.randn(4, vocab).bfloat16()
    plain = [
        make_request(temperature=0.0),
        make_request(temperature=0.8, top_p=0.5, top_k=3),
        make_request(temperature=1.0, seed=3, min_p=0.1),
    ]
    generators = {plain[2].request_id: torch.Generator().manual_seed(3)}
    out = sample(logits[:3], build_batch(plain, generators, vocab, cpu))
    assert calls == [("_native_draw", 3, torch.bfloat16)] and out.token_ids[0] == int(
        logits[0].float().argmax()
    )
    assert out.token_ids[1] in logits[1].float().topk(3).indices.tolist()
    for changed in (
        dict(presence_penalty=0.5),
        dict(repetition_penalty=1.2),
        dict(logit_bias={5: 100.0}),
        dict(min_tokens=2, stop_token_ids=[7]),
    ):
        calls.clear()
        mixed = [
            make_request(temperature=1.0),
            make_request(temperature=1.0, **changed),
            make_request(temperature=0.0),
        ]
        out = sample(logits[:3], build_batch(mixed, {}, vocab, cpu))
        assert sorted(calls) == [("_native_draw", 1, torch.float32), ("_native_draw", 2, torch.bfloat16)], (
            changed
        )
        assert out.token_ids[2] == int(logits[2].float().argmax())
        if "logit_bias" in changed:  # the changed row's draw is its own row's, renumbered
            assert out.token_ids[1] == 5


def test_a_mixed_batch_follows_each_rows_distribution_through_the_kernel():
    """Greedy and sampled rows at different temperatures in one call, as a serving step has them. The
    global generator (unseeded rows draw from it) is seeded so the verdict does not depend on test order."""
    torch.manual_seed(0)
    vocab = 40
    base = torch.log(torch.tensor([0.6, 0.3, 0.1] + [1e-12] * (vocab - 3)))
    logits = torch.stack([base] * 3)
    requests = [make_request(temperature=0.0), make_request(temperature=1.0), make_request(temperature=0.5)]
    counts = torch.zeros(3, 3)
    for _ in range(1500):
        tokens = sample(logits, build_batch(requests, {}, vocab, torch.device("cpu"))).token_ids
        for row, token in enumerate(tokens):
            counts[row, token] += 1
    share = counts / 1500
    sharpened = torch.tensor([0.6, 0.3, 0.1]) ** 2
    torch.testing.assert_close(share[0], torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(share[1], torch.tensor([0.6, 0.3, 0.1]), atol=0.04, rtol=0)
    torch.testing.assert_close(share[2], sharpened / sharpened.sum(), atol=0.04, rtol=0)
