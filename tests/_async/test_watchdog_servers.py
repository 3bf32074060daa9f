"""One process's renewals on two servers: a server that stops answering delays only its own.

The watchdog renews every hold of the process; a renewal call stuck on a
paused server (a client without ``socket_timeout`` waits for ever) must not
hold up the renewals of locks on a healthy server.

Written once for asyncio (tasks) and generated for threads.
"""

from __future__ import annotations

import time

from tenure import AsyncLock
from tests._backend_asyncio import sleep
from tests.conftest import ServerFactory


async def test_a_paused_server_does_not_hold_up_renewals_on_another(
    tenure_server_factory: ServerFactory,
) -> None:
    stalled, healthy = tenure_server_factory(), tenure_server_factory()
    stuck_client = stalled.async_client()  # no socket_timeout: a call to it waits for ever
    client = healthy.async_client()
    stuck = AsyncLock(stuck_client, "on-the-paused-server", timeout=1.2, auto_renew=True)
    kept = AsyncLock(client, "on-the-healthy-server", timeout=1.2, auto_renew=True)
    try:
        assert await stuck.acquire()
        assert await kept.acquire()
        stalled.pause()  # the stuck lock's next renewal waits for an answer that never comes
        try:
            until_at = time.monotonic() + 4 * 1.2  # four leases of the healthy lock
            while time.monotonic() < until_at:
                assert not kept.lost, "the healthy server's lock was lost"
                await sleep(0.1)
            assert await kept.owned()
            assert kept.statistics().renewals >= 6
        finally:
            stalled.resume()
        await kept.release()
    finally:
        await client.aclose()
        await stuck_client.aclose()
