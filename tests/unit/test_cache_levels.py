"""X-Semantic-Cache on a request: bypass, or the widest tier it accepts (the service never widens it:
tests/cache/test_service.py::test_tiers_and_levels)."""

from __future__ import annotations

import pytest

from gateway.semantic import requested_level


@pytest.mark.parametrize(
    ("header", "level"),
    [
        ({"x-semantic-cache": "bypass"}, None),
        ({"x-semantic-cache": " BYPASS "}, None),
        ({"x-semantic-cache": "exact"}, "exact"),
        ({"x-semantic-cache": "Canonical"}, "canonical"),
        ({"x-semantic-cache": "semantic"}, "semantic"),
        ({"x-semantic-cache": "anything else"}, ""),
        ({}, ""),
    ],
)
def test_requested_level(header: dict[str, str], level: str | None) -> None:
    assert requested_level(header) == level
