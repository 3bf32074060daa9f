"""The metrics seam costs nothing unless an application configured OpenTelemetry."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tenure._core import telemetry as table
from tenure._core.telemetry import primitive_label

pytestmark = pytest.mark.engine_blind

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_tenure_imports_no_opentelemetry_and_records_nothing_unasked() -> None:
    # (redis-py 8 imports some OpenTelemetry modules itself when they are installed)
    said = _run(
        """
        import sys
        import redis
        def otel(): return {m for m in sys.modules if m.startswith("opentelemetry")}
        before = otel()
        import tenure
        from tenure._backends import telemetry
        from tenure.server import ServerProcess
        with ServerProcess() as server:
            with tenure.Lock(server.client(), "quiet"):
                pass
        print(telemetry.metrics() is None, sorted(otel() - before))
        """
    )
    assert said == "True []"


def test_the_api_without_a_provider_records_nothing() -> None:
    said = _run(
        """
        import opentelemetry.metrics
        from tenure._backends import telemetry
        print(telemetry.refresh() is None)
        """
    )
    assert said == "True"


def test_a_provider_set_after_tenure_is_found_within_a_second() -> None:
    said = _run(
        """
        import time
        from tenure._backends import telemetry
        assert telemetry.metrics() is None
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        metrics.set_meter_provider(MeterProvider())
        deadline = time.monotonic() + 3
        while telemetry.metrics() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        print(telemetry.metrics() is not None)
        """
    )
    assert said == "True"


def test_every_primitive_has_its_label() -> None:
    assert [
        primitive_label(kind)
        for kind in ("AsyncLock", "ReentrantLock", "Semaphore", "ReadLock", "AsyncWriteLock",
                     "ClusterLock", "Redlock", "AsyncConnectionLock")
    ] == ["lock", "reentrant_lock", "semaphore", "read_lock", "write_lock", "cluster_lock",
          "redlock", "connection_lock"]  # fmt: skip


def test_docs_list_every_instrument_as_the_table_has_it() -> None:
    text = (ROOT / "docs" / "observability.md").read_text()
    rows = re.findall(r"^\| `(tenure\.[a-z.]+)` \| (\w+) \| `([^`]+)` \|", text, re.M)
    assert rows == [(each.name, each.kind, each.unit) for each in table.INSTRUMENTS]


def test_durations_noted_just_before_exit_are_exported_at_exit() -> None:
    # tenure imported first, the provider set after (as the docs show): the SDK
    # shuts down at exit after tenure has handed over its last notes.
    said = _run(
        """
        import sys
        import tenure
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter, PeriodicExportingMetricReader,
        )
        from tenure.server import ServerProcess
        exporter = ConsoleMetricExporter(out=sys.stdout)
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=600_000)
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        with ServerProcess() as server:
            client = server.client()
            with tenure.Lock(client, "last"):
                pass
        """
    )
    assert "tenure.lock.hold.duration" in said and "tenure.lock.wait.duration" in said
