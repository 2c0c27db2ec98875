"""`make test`'s units of work (tests/conftest.py): whole files, those sharing a pair of workers joined."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import SHARED_UNITS, unit_of

ROOT = Path(__file__).resolve().parents[2]


def test_every_shared_file_exists() -> None:
    """A renamed file would silently run apart again (and start its processes twice)."""
    assert SHARED_UNITS
    for path in SHARED_UNITS:
        assert (ROOT / path).is_file(), path


def test_shared_files_are_one_unit_and_others_their_own() -> None:
    fleet, scale_out = (f"{path}::test_x" for path in SHARED_UNITS)
    assert unit_of(fleet) == unit_of(scale_out) == "worker_pair"
    assert unit_of("tests/unit/test_heap.py::test_y[a::b]") == "tests/unit/test_heap.py"
