"""The demo's marketplace: each mode lists and buys correctly and keeps the books."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from tenure import ArgumentError
from tenure._tools.demo.market import (
    BUYER_FUNDS,
    MODES,
    Market,
    Trader,
    audit,
    close_market,
    open_market,
)


@pytest.fixture
def market(tenure_client: redis.Redis) -> Market:
    shop = Market("test:market:")
    open_market(tenure_client, shop, ["s0", "s1"], ["b0"])
    return shop


@pytest.mark.parametrize("mode", MODES)
def test_list_then_buy_moves_item_and_money(
    tenure_client: redis.Redis, market: Market, mode: str
) -> None:
    seller = Trader(tenure_client, market, mode, "s0")
    buyer = Trader(tenure_client, market, mode, "b0")
    far = time.monotonic() + 10
    seller.list_new_item(far)
    assert seller.tally.listed == seller.tally.created == 1
    assert tenure_client.zrange(market.market, 0, -1) == [b"s0-0.s0"]
    price = tenure_client.zscore(market.market, "s0-0.s0")
    assert price is not None and 1 <= price <= 100
    assert tenure_client.scard(market.inventory("s0")) == 0

    assert buyer.buy_something(far)
    assert buyer.tally.bought == buyer.tally.attempts == 1
    assert buyer.tally.retries == 0
    assert tenure_client.zcard(market.market) == 0
    assert tenure_client.smembers(market.inventory("b0")) == {b"s0-0"}
    assert int(tenure_client.hget(market.user("s0"), "funds") or 0) == int(price)
    assert int(tenure_client.hget(market.user("b0"), "funds") or 0) == BUYER_FUNDS - int(price)
    assert audit(tenure_client, market, ["s0", "s1"], ["b0"], created=1).consistent

    assert not buyer.buy_something(far)  # an empty market: nothing to try
    assert buyer.tally.attempts == 1


@pytest.mark.parametrize("mode", MODES)
def test_a_sold_item_or_a_poor_buyer_changes_nothing(
    tenure_client: redis.Redis, market: Market, mode: str
) -> None:
    buyer = Trader(tenure_client, market, mode, "b0")
    far = time.monotonic() + 10
    assert buyer._buy("ghost", "s1", far) is False  # never listed, or already sold
    tenure_client.sadd(market.inventory("s1"), "gem")
    tenure_client.zadd(market.market, {"gem.s1": 50})
    tenure_client.hset(market.user("b0"), "funds", 49)
    assert buyer._buy("gem", "s1", far) is False  # cannot pay
    assert tenure_client.zscore(market.market, "gem.s1") == 50
    assert int(tenure_client.hget(market.user("b0"), "funds") or 0) == 49
    assert int(tenure_client.hget(market.user("s1"), "funds") or 0) == 0


@pytest.mark.parametrize("mode", MODES)
def test_concurrent_traders_keep_the_books(
    tenure_client: redis.Redis, market: Market, mode: str
) -> None:
    """Two listers and two buyers in threads for 0.5 s: nothing created or lost."""
    tenure_client.hset(market.user("b1"), "funds", BUYER_FUNDS)
    traders = [Trader(tenure_client, market, mode, user) for user in ("s0", "s1", "b0", "b1")]
    deadline = time.monotonic() + 0.5

    def work(trader: Trader) -> None:
        while time.monotonic() < deadline:
            if trader.user.startswith("s"):
                trader.list_new_item(deadline)
            else:  # nothing to buy yet: it tries again at once (each try asks the server)
                trader.buy_something(deadline)

    threads = [threading.Thread(target=work, args=(trader,)) for trader in traders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    created = sum(trader.tally.created for trader in traders)
    bought = sum(trader.tally.bought for trader in traders)
    assert created > 0 and bought > 0
    books = audit(tenure_client, market, ["s0", "s1"], ["b0", "b1"], created)
    assert books.consistent, books
    assert (
        tenure_client.scard(market.inventory("b0")) + tenure_client.scard(market.inventory("b1"))
        == bought
    )


def test_close_market_deletes_every_key(tenure_client: redis.Redis, market: Market) -> None:
    trader = Trader(tenure_client, market, "lock", "s0")
    trader.list_new_item(time.monotonic() + 10)
    tenure_client.set("test:other", 1)
    close_market(tenure_client, market)
    assert list(tenure_client.scan_iter(match=f"{market.prefix}*")) == []
    assert tenure_client.get("test:other") == b"1"


def test_unknown_mode_is_refused(tenure_client: redis.Redis, market: Market) -> None:
    with pytest.raises(ArgumentError, match="mode: must be one of watch, lock, script"):
        Trader(tenure_client, market, "hope", "s0")
