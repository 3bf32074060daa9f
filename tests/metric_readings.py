"""What the OpenTelemetry SDK's in-memory reader received: tenure's metrics, read as deltas.

The first use sets this process's meter provider (once: OpenTelemetry allows
it once per process) with an in-memory reader, and makes tenure look for it
at once. Every later test of the process is measured too: a test reads the
difference its own scenario made (:class:`Readings`), one test at a time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tenure._backends import telemetry, tracing
from tenure._core.telemetry import Instrument

_READER: InMemoryMetricReader | None = None
_SPANS: InMemorySpanExporter | None = None

Point = tuple[str, frozenset[tuple[str, Any]]]


def reader() -> InMemoryMetricReader:
    """The process's in-memory reader (its provider set on first use)."""
    global _READER
    if _READER is None:
        _READER = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))
    telemetry.refresh()
    return _READER


def span_exporter() -> InMemorySpanExporter:
    """The process's in-memory span exporter (its tracer provider set on first use)."""
    global _SPANS
    if _SPANS is None:
        _SPANS = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_SPANS))
        trace.set_tracer_provider(provider)
    tracing._traced = float("-inf")  # tenure looks for it at once
    return _SPANS


def tenure_spans(since: int = 0) -> list[ReadableSpan]:
    """tenure's finished spans, from the ``since``-th on."""
    finished = span_exporter().get_finished_spans()[since:]
    return [
        s for s in finished if s.instrumentation_scope and s.instrumentation_scope.name == "tenure"
    ]


def _snapshot() -> tuple[Counter[Point], Counter[Point]]:
    """(counts, sums) of every point so far: a histogram's count and sum, a counter's value."""
    telemetry.flush()  # what tenure noted, handed to the SDK now
    counts: Counter[Point] = Counter()
    sums: Counter[Point] = Counter()  # (floats: Counter adds any numbers)
    data = reader().get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            if scope.scope.name != "tenure":
                continue
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    key = (metric.name, frozenset(dict(point.attributes or {}).items()))
                    found: Any = point
                    if hasattr(found, "count"):  # a histogram
                        counts[key] += int(found.count)
                        sums[key] += found.sum
                    else:
                        counts[key] += found.value
                        sums[key] += found.value
    return counts, sums


class Readings:
    """The metrics recorded since it was made: ``count(instrument, **attributes)``."""

    def __init__(self) -> None:
        self._counts, self._sums = _snapshot()

    def points(self) -> list[Point]:
        """Every point recorded so far (its instrument's name and attributes)."""
        counts, _ = _snapshot()
        return list(counts)

    def count(self, instrument: Instrument, **attributes: str) -> int:
        """A counter's increase, or a histogram's new points, with these attributes."""
        counts, _ = _snapshot()
        return int(self._matching(counts, instrument, attributes, self._counts))

    def total(self, instrument: Instrument, **attributes: str) -> float:
        """The sum of a histogram's new points (or a counter's increase) with these attributes."""
        _, sums = _snapshot()
        return float(self._matching(sums, instrument, attributes, self._sums))

    @staticmethod
    def _matching(
        now: Counter[Point], instrument: Instrument, attributes: Mapping[str, str],
        before: Counter[Point],
    ) -> float:  # fmt: skip
        wanted = {f"tenure.{key}": value for key, value in attributes.items()}
        return sum(
            value - before[key]
            for key, value in now.items()
            if key[0] == instrument.name and wanted.items() <= dict(key[1]).items()
        )
