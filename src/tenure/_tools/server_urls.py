"""The CLI's clients of a server's URL (``--url``, ``REDIS_URL``), and how a URL is shown.

One way for every command that takes a URL: a bad URL is an argument error
naming where it came from; ``--cluster`` on a server that is not a cluster
node is one too, but a server that cannot be reached at all is said as such
(exit 1, not a usage error); and a URL is never shown with its password.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.cluster

from tenure import ArgumentError

__all__ = ["connect", "shown"]


def shown(url: str) -> str:
    """``url`` without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def connect(
    url: str, source: str, cluster: bool, **settings: Any
) -> redis.Redis | redis.cluster.RedisCluster:
    """A client of ``url`` (a cluster client with ``cluster``), ``settings`` passed on.

    ``source`` names where the URL came from (``--url`` or ``REDIS_URL``).
    Raises :class:`~tenure.ArgumentError` for a bad URL or ``--cluster`` on a
    plain server, and redis-py's ``ConnectionError`` when the server cannot be
    reached.
    """
    try:
        if not cluster:
            return redis.Redis.from_url(url, **settings)
        return redis.cluster.RedisCluster.from_url(url, **settings)
    except ValueError as exc:
        raise ArgumentError(source, f"{exc} (got {shown(url)!r})") from exc
    except redis.exceptions.RedisClusterException as exc:  # --cluster on a plain server
        with redis.Redis.from_url(url, **settings) as plain:
            plain.ping()  # (unreachable: say that instead)
        raise ArgumentError(
            "--cluster", f"cannot use {shown(url)} as a cluster node: {exc}"
        ) from None
