"""Control commands on redis-py clients: raw calls, parsed ``INFO``, ``SHUTDOWN``.

The servers' own control connections (readiness probes, topology assembly,
health checks) go through these helpers: :func:`execute` runs a raw command,
:func:`parse_info` reads ``INFO`` / ``CLUSTER INFO`` text, :func:`raw_reply`
and :func:`no_retry` configure a control client, :func:`answers_as` probes a
starting server, :func:`shutdown_now` stops one without saving.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["answers_as", "execute", "no_retry", "parse_info", "raw_reply", "shutdown_now"]


def execute(client: redis.Redis, *args: Any) -> Any:
    """Run a raw command on a sync client (redis-py's ``execute_command`` is untyped)."""
    run: Callable[..., Any] = client.execute_command
    return run(*args)


def parse_info(text: str) -> dict[str, str]:
    """Parse ``INFO`` / ``CLUSTER INFO`` text into a flat ``{field: value}`` dict."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def raw_reply(response: Any, **options: Any) -> Any:
    """A response callback that keeps the reply as it came (``INFO`` as text)."""
    return response


def no_retry() -> Retry:
    """A redis-py retry policy that never retries."""
    return Retry(NoBackoff(), 0)


def answers_as(client: redis.Redis, pid: int) -> bool:
    """Whether the server answers PING and reports process ``pid`` as its own."""
    try:
        if execute(client, "PING") in (True, "PONG"):
            fields = parse_info(str(execute(client, "INFO", "server")))
            return fields.get("process_id") == str(pid)
    except redis.RedisError:
        pass
    return False


def shutdown_now(client: redis.Redis) -> bool:
    """Send SHUTDOWN NOSAVE NOW after a PING; ``True`` if the server took it."""
    try:
        execute(client, "PING")
    except redis.RedisError:
        return False
    try:
        execute(client, "SHUTDOWN", "NOSAVE", "NOW")
    except (redis.ConnectionError, redis.TimeoutError):
        return True  # the server closed the connection: it is going down
    except redis.RedisError:
        return False
    return True
