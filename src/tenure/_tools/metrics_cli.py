"""``tenure metrics``: Prometheus text of what the server holds, read at each scrape.

A collector of a registry of its own reads the server whenever Prometheus
scrapes, through :mod:`tenure.inspection` (primitives, ingestion jobs,
stream groups, id sets): every scrape is fresh, and the clients change
nothing. Every server call has a bounded timeout and no retry, so a scrape
while the server is down answers ``tenure_up 0`` at once; stderr says so in
one line, once, and again in one line when the server answers again.
SIGTERM and Ctrl-C stop it (exit 0, as ``tenure server``): the HTTP server
closes, then the client.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from tenure import ArgumentError, MissingDependencyError
from tenure._tools.server_urls import connect, shown
from tenure.inspection import Primitive, idset_sizes, ingest_jobs, inspect, stream_groups

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector
else:  # prometheus-client is optional (the metrics extra): the command starts without it
    Collector = object

__all__ = ["OTHER", "Exporter", "MetricsCollector", "add_metrics", "read_metrics", "run_metrics"]

OTHER = "_other"
"""The ``name`` label of the series that sums a kind's names past ``--max-names``."""

Client = redis.Redis | redis.cluster.RedisCluster


def add_metrics(commands: Any, positive_int: Any, positive_float: Any, port: Any) -> None:
    """The ``metrics`` command's options (``port``: the argparse type of ``--port``)."""
    metrics = commands.add_parser(
        "metrics",
        help="serve Prometheus metrics read from the server (holds, waits, ingestion, streams)",
        description="Serve Prometheus text at http://HOST:PORT/metrics, read from the server "
        "at each scrape (SCAN; on every primary of a cluster): per primitive tenure_held, "
        "tenure_waiters and tenure_oldest_wait_seconds; per ingestion job tenure_ingest_chunks "
        "and tenure_ingest_rows; per stream group tenure_stream_pending, tenure_stream_lag and "
        "tenure_stream_dead_letters; per id set tenure_idset_ids and tenure_idset_pending; and "
        "tenure_up (0 when the last read failed). Runs until Ctrl-C or SIGTERM.",
    )
    metrics.add_argument("--url", help="server URL (default: $REDIS_URL)")
    metrics.add_argument("--cluster", action="store_true", help="the URL is a cluster node")
    metrics.add_argument(
        "--port", type=port, required=True, help="TCP port to serve on (0: a free one, printed)"
    )
    metrics.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default: %(default)s)"
    )
    metrics.add_argument(
        "--max-names", type=positive_int, default=100, metavar="N",
        help=f"names listed per kind of primitive, most waiters then most holders first; the "
        f"rest summed in one series named {OTHER} (default: %(default)s)",
    )  # fmt: skip
    metrics.add_argument("--prefix", default="", help="only primitives and id sets named so")
    metrics.add_argument(
        "--ingest-prefix", default="tenure:ingest:",
        help="the key prefix of the ingestion jobs (IngestJob's prefix=; default: %(default)s)",
    )  # fmt: skip
    metrics.add_argument(
        "--streams", default="*", metavar="PATTERN",
        help="SCAN pattern of the streams whose groups are listed (default: every stream)",
    )  # fmt: skip
    metrics.add_argument(
        "--timeout", type=positive_float, default=3.0, metavar="SECONDS",
        help="seconds each server call may take before a scrape answers tenure_up 0 "
        "(default: %(default)s)",
    )  # fmt: skip


def _gauge(name: str, documentation: str, labels: list[str]) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(name, documentation, labels=labels)


def _bounded(rows: list[Primitive], limit: int) -> list[tuple[str, int, int, float]]:
    """(name, holders, waiters, oldest wait in s): the ``limit`` busiest, then the rest summed."""
    figures = [
        (
            row.name,
            len(row.holders),
            len(row.waiters),
            max((int(w["waited_ms"]) for w in row.waiters), default=0) / 1000,
        )
        for row in rows
    ]
    figures.sort(key=lambda f: (-f[2], -f[1], f[0]))
    kept, rest = figures[:limit], figures[limit:]
    if rest:
        held, waiting = sum(f[1] for f in rest), sum(f[2] for f in rest)
        kept.append((OTHER, held, waiting, max(f[3] for f in rest)))
    return kept


def read_metrics(client: Client, options: argparse.Namespace) -> list[Metric]:
    """One read of the server, as metric families (raises what the server raised)."""
    labels = ["kind", "name"]
    held = _gauge(
        "tenure_held", "Holders of a primitive now (a semaphore's permits in use)", labels
    )
    waiters = _gauge("tenure_waiters", "Callers waiting in line for a primitive", labels)
    oldest = _gauge(
        "tenure_oldest_wait_seconds", "How long the first in line has waited (0: nobody)", labels
    )
    by_kind: dict[str, list[Primitive]] = {}
    for row in inspect(client, options.prefix):
        by_kind.setdefault(row.kind, []).append(row)
    for kind, rows in by_kind.items():
        for name, holders, waiting, wait in _bounded(rows, options.max_names):
            held.add_metric([kind, name], holders)
            waiters.add_metric([kind, name], waiting)
            oldest.add_metric([kind, name], wait)
    # (ingest_job, not job: Prometheus gives every series a job label of its own)
    job_labels = ["ingest_job", "state"]
    chunks = _gauge("tenure_ingest_chunks", "An ingestion job's chunks by state", job_labels)
    rows_done = _gauge("tenure_ingest_rows", "Rows an ingestion job has committed", ["ingest_job"])
    for job, status in ingest_jobs(client, options.ingest_prefix).items():
        for state in ("done", "claimed", "free"):
            chunks.add_metric([job, state], getattr(status, state))
        rows_done.add_metric([job], status.rows)
    group_labels = ["stream", "group"]
    pending = _gauge("tenure_stream_pending", "Messages delivered, not acknowledged", group_labels)
    lag = _gauge("tenure_stream_lag", "Entries not delivered to the group yet", group_labels)
    dead = _gauge("tenure_stream_dead_letters", "The group's dead-lettered messages", group_labels)
    for group in stream_groups(client, options.streams):
        pending.add_metric([group.stream, group.group], group.pending)
        if group.lag is not None:
            lag.add_metric([group.stream, group.group], group.lag)
        dead.add_metric([group.stream, group.group], group.dead_letters)
    ids = _gauge("tenure_idset_ids", "Ids in an id set's compact form", ["name"])
    unfolded = _gauge("tenure_idset_pending", "Ids written to an id set, not compacted", ["name"])
    for size in idset_sizes(client, options.prefix):
        ids.add_metric([size.name], size.ids)
        unfolded.add_metric([size.name], size.pending)
    return [held, waiters, oldest, chunks, rows_done, pending, lag, dead, ids, unfolded]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


class MetricsCollector(Collector):
    """Reads the server at each scrape (one at a time); a failed read answers ``tenure_up 0``."""

    def __init__(
        self, client: Client, options: argparse.Namespace, say: Callable[[str], None]
    ) -> None:
        self.client = client
        self.options = options
        self.say = say
        self._reading = threading.Lock()
        self._down = False

    def describe(self) -> Iterable[Metric]:
        """Nothing: the registry must not read the server when the collector is registered."""
        return []

    def collect(self) -> Iterable[Metric]:
        """The server's metrics now, and ``tenure_up``."""
        with self._reading:
            try:
                families = read_metrics(self.client, self.options)
            except Exception as exc:  # every failure is a scrape that says tenure_up 0
                families = []
                if not self._down:
                    why = _first_line(exc)
                    if isinstance(exc, redis.exceptions.ConnectionError):
                        self.say(f"tenure: metrics: cannot reach the server: {why}")
                    elif isinstance(exc, redis.exceptions.TimeoutError):
                        seconds = f"{self.options.timeout:g} s (--timeout)"
                        self.say(f"tenure: metrics: the server did not answer in {seconds}: {why}")
                    else:
                        self.say(
                            f"tenure: metrics: reading the server: {type(exc).__name__}: {why}"
                        )
                self._down = True
            else:
                if self._down:
                    self.say("tenure: metrics: the server answers again")
                self._down = False
            up = _gauge("tenure_up", "1 when this read of the server succeeded, else 0", [])
            up.add_metric([], 0 if self._down else 1)
        return [*families, up]


def _connect(url: str, source: str, cluster: bool, timeout: float) -> Client:
    settings: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),  # a scrape answers at once: no retry, no backoff
    }
    return connect(url, source, cluster, **settings)


class _QuietHandler(WSGIRequestHandler):
    timeout = 30  # a client that stalls mid-request frees its thread

    def log_message(self, format: str, *args: Any) -> None:
        """No line per request."""


def _http_server(host: str, port: int, app: Any) -> WSGIServer:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except OSError as exc:
        raise ArgumentError("--host", f"cannot serve on {host!r}: {exc.strerror or exc}") from None

    class Server(ThreadingMixIn, WSGIServer):
        address_family = family
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            """A client gone mid-answer: nothing to say."""

    try:
        return make_server(host, port, app, Server, handler_class=_QuietHandler)
    except OSError as exc:
        raise ArgumentError(
            "--port", f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None


def _only_metrics(app: Any) -> Any:
    """``app`` at ``/metrics``; any other path is 404 Not Found."""

    def answer(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO", "") in ("/metrics", "/metrics/"):
            return app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"tenure metrics: the metrics are at /metrics\n"]

    return answer


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Exporter:
    """A running exporter: its HTTP server answering in a thread, on a client of its own.

    Made from ``tenure metrics``' options; refuses with one-line errors what
    cannot work (a bad URL, ``--cluster`` on a plain server or none on a
    cluster node, a busy port, a server out of reach). ``url`` is where it
    serves; :meth:`close` (or the ``with`` block's end) stops it.
    """

    def __init__(self, options: argparse.Namespace, say: Callable[[str], None] = _say) -> None:
        try:
            from prometheus_client import CollectorRegistry, make_wsgi_app
        except ImportError:
            raise MissingDependencyError(
                'tenure metrics needs prometheus-client: pip install "tenure[metrics]"'
            ) from None
        url = options.url or os.environ.get("REDIS_URL")
        if not url:
            raise ArgumentError("--url", "give --url or set REDIS_URL")
        source = "--url" if options.url else "REDIS_URL"
        self.server_url = shown(url)
        self.client = _connect(url, source, options.cluster, options.timeout)
        try:
            self.client.ping()
            if not options.cluster and self.client.info("cluster").get("cluster_enabled"):
                raise ArgumentError(
                    "--cluster", f"{self.server_url} is a cluster node: give --cluster"
                )
            registry = CollectorRegistry()
            registry.register(MetricsCollector(self.client, options, say))
            app = _only_metrics(make_wsgi_app(registry))
            self.httpd = _http_server(options.host, options.port, app)
        except BaseException:
            self.client.close()
            raise
        host = f"[{options.host}]" if ":" in options.host else options.host
        self.url = f"http://{host}:{self.httpd.server_port}/metrics"
        self._serving = threading.Thread(
            target=self.httpd.serve_forever, args=(0.2,), name="tenure-metrics", daemon=True
        )
        self._serving.start()

    def close(self) -> None:
        """Stop answering, close the HTTP server, then the client."""
        try:
            self.httpd.shutdown()
            self._serving.join(5)
            self.httpd.server_close()
        finally:
            self.client.close()

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_metrics(options: argparse.Namespace) -> int:
    """Run ``tenure metrics`` until SIGTERM or Ctrl-C (exit 0, as ``tenure server``)."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with Exporter(options) as exporter:
        print(
            f"serving tenure metrics of {exporter.server_url} at {exporter.url}; Ctrl-C to stop",
            flush=True,
        )
        while not stop.wait(0.5):
            pass
    try:
        print("metrics stopped", flush=True)
    except BrokenPipeError:  # nobody reads the output any more: no error for that at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
