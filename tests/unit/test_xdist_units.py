"""`make test`'s units of work (tests/conftest.py): whole files, those sharing a pair of workers joined."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import SHARED_UNITS, SLOW_UNITS, slowest_first, unit_of

ROOT = Path(__file__).resolve().parents[2]


def test_every_shared_file_exists() -> None:
    """A renamed file would silently run apart again (and start its processes twice)."""
    assert SHARED_UNITS
    for path in SHARED_UNITS:
        assert (ROOT / path).is_file(), path
    for unit in SLOW_UNITS:
        assert unit in SHARED_UNITS.values() or (ROOT / unit).is_file(), unit


def test_shared_files_are_one_unit_and_others_their_own() -> None:
    fleet, scale_out = (f"{path}::test_x" for path in SHARED_UNITS)
    assert unit_of(fleet) == unit_of(scale_out) == "worker_pair"
    assert unit_of("tests/unit/test_heap.py::test_y[a::b]") == "tests/unit/test_heap.py"


def test_slow_units_go_first_then_the_largest_with_each_units_tests_together_in_order() -> None:
    nodeids = [
        "tests/unit/test_small.py::one",
        "tests/unit/test_big.py::one",
        f"{SLOW_UNITS[2]}::first",
        "tests/unit/test_big.py::two",
        f"{SLOW_UNITS[0]}::only",
        f"{SLOW_UNITS[2]}::second",
    ]
    assert slowest_first(nodeids) == [
        f"{SLOW_UNITS[0]}::only",
        f"{SLOW_UNITS[2]}::first",
        f"{SLOW_UNITS[2]}::second",
        "tests/unit/test_big.py::one",
        "tests/unit/test_big.py::two",
        "tests/unit/test_small.py::one",
    ]
    # A file of a shared unit goes where the unit is named.
    fleet = f"{next(iter(SHARED_UNITS))}::t"
    assert slowest_first(["tests/unit/test_big.py::one", fleet])[0] == fleet
