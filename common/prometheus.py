"""Prometheus exposition as vLLM's, for all three services: no `<name>_created` series (one more series per
counter and histogram that no dashboard reads), and every label value a dashboard sums over present at 0
from the start, so a panel shows 0 rather than "no data" until the first event."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import disable_created_metrics
from prometheus_client.metrics import MetricWrapperBase

# Process-wide and read at export time (as PROMETHEUS_DISABLE_CREATED_SERIES=true would): importing this
# module before the first scrape is enough.
disable_created_metrics()


def init_labels(metric: MetricWrapperBase, values: Iterable[str | tuple[str, ...]]) -> None:
    """Create the child of each label value (a tuple for several labels), so it is exported at 0."""
    for value in values:
        metric.labels(*(value if isinstance(value, tuple) else (value,)))
