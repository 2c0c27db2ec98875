"""The false-hit budget is a ceiling: the calibration accepts a threshold only where the one-sided 95%
upper bound of the tune split's false-hit rate is within it (tools/cache/ceiling.py), never where the point
estimate just meets it."""

from __future__ import annotations

import pytest

from tools.cache.ceiling import upper_bound, within
from tools.cache.evaluate import Lookup, at_matched_rates, calibrate, plain_at_matched_rate


def test_the_bound_is_clopper_pearsons() -> None:
    assert upper_bound(0, 100) == pytest.approx(1 - 0.05 ** (1 / 100))  # none seen: the closed form
    assert upper_bound(1, 100) == pytest.approx(0.0466, abs=1e-4)
    assert upper_bound(20, 1000) == pytest.approx(0.0291, abs=2e-4)
    assert upper_bound(0, 0) == 1.0 and upper_bound(5, 5) == 1.0
    bounds = [upper_bound(k, 500) for k in range(10)]
    assert bounds == sorted(bounds) and all(b > k / 500 for k, b in enumerate(bounds))


def test_a_point_estimate_at_the_budget_is_not_within_it() -> None:
    assert 20 / 1000 <= 0.02 and not within(20, 1000, 0.02)
    assert within(10, 1000, 0.02)


def traps_answered_above(cosines: list[float], kind: str = "scope") -> tuple[list[dict], list[Lookup]]:
    """One trap per cosine, each with a wrong neighbour at that cosine (answered at any lower threshold)."""
    rows = [{"should_hit": False, "kind": kind, "b_group": f"g{i}:trap"} for i in range(len(cosines))]
    lookups = [Lookup(None, None, [(c, f"g{i}", True, False, False)]) for i, c in enumerate(cosines)]
    return rows, lookups


def decide(lk: Lookup, threshold: float):
    return lk.shipped(threshold)


def test_calibration_keeps_the_bound_within_the_budget() -> None:
    # 1,000 traps: the i-th is answered by thresholds at or below 0.5 + i / 2000 (cosines 0.5 .. 0.9995)
    rows, lookups = traps_answered_above([0.5 + i / 2000 for i in range(1000)])
    threshold = calibrate(rows, lookups, decide, 0.02, per_kind=False)
    answered = sum(lk.semantic[0][0] >= threshold for lk in lookups)
    assert within(answered, 1000, 0.02)
    assert answered < 20  # the point-estimate rule would have spent the whole budget (20 answered)
    lower = max(t for t in (0.5 + 0.0025 * i for i in range(201)) if t < threshold - 1e-9)
    assert not within(sum(lk.semantic[0][0] >= lower for lk in lookups), 1000, 0.02)


def test_a_trap_kind_too_small_to_show_its_ceiling_turns_the_tier_off() -> None:
    """40 traps of a kind, none answered above 0.6: their bound (7.2%) is above 1.5 x 1%, so no threshold
    passes and the semantic tier stays off (1.0); pooled with 1,000 more, the pooled bound alone passes."""
    rows, lookups = traps_answered_above([0.6] * 40, kind="negation")
    more_rows, more_lookups = traps_answered_above([0.6] * 1000)
    assert calibrate(rows + more_rows, lookups + more_lookups, decide, 0.01, per_kind=True) == 1.0
    assert calibrate(rows + more_rows, lookups + more_lookups, decide, 0.01, per_kind=False) == 0.6025


def test_designs_compared_at_the_false_hit_rate_seen() -> None:
    """The matched-rate reading takes, per budget, the most pairs served with the false hits seen on the
    rows themselves within it: plain cosine at each of its own cosines, so a step between grid points is
    never skipped."""
    rows, lookups = traps_answered_above([0.99, 0.95, 0.9, 0.8])  # 4 traps
    pairs = [0.995, 0.97, 0.93, 0.85, 0.7]  # should-hit pairs, each answered right at its cosine
    for i, c in enumerate(pairs):
        rows.append({"should_hit": True, "kind": "paraphrase", "b_group": f"p{i}"})
        lookups.append(Lookup(None, None, [(c, f"p{i}", True, False, False)], plain=(c, f"p{i}")))
    for lk, c in zip(lookups[:4], [0.99, 0.95, 0.9, 0.8], strict=True):
        lk.plain = (c, "wrong")
    # one trap of four allowed: plain down to 0.97 (the trap at 0.99 answered, the next at 0.95 not)
    assert plain_at_matched_rate(rows, lookups, 0.25) == 0.97
    assert plain_at_matched_rate(rows, lookups, 0.0) == 0.995
    assert plain_at_matched_rate(rows, lookups, 0.5) == 0.93
    grid = [round(0.5 + 0.005 * i, 4) for i in range(101)]
    best = at_matched_rates(rows, lookups, decide, (0.0, 0.25, 0.5), grid)
    assert [best[b][0].served()[0] for b in (0.0, 0.25, 0.5)] == [1, 2, 3]
    assert [best[b][1] for b in (0.0, 0.25, 0.5)] == [0.995, 0.955, 0.905]
    assert all(best[b][0].false_hits()[0] <= b * 4 for b in (0.0, 0.25, 0.5))
