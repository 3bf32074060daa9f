"""The marketplace of Redis in Action (sections 4.4, 6.2 and 11.3), three ways.

Listers move items from their inventory (a set) to the market (one sorted set
of ``"item.seller"`` scored by price); buyers pick a listed item, check its
price against their funds (a hash field), move the money to the seller and
the item to their own inventory. The whole market is one hot key, which is
what the book's Table 6.2 measures. Each operation exists in three
:data:`MODES`:

* ``watch``: optimistic WATCH/MULTI/EXEC, retried when a watched key
  changed (book listings 4.5 and 4.6);
* ``lock``: a :class:`tenure.Lock` around the market, as the book's
  ``purchase_item_with_lock`` (listing 6.9), which still WATCHes the buyer;
* ``script``: one Lua script per operation (book section 11.3.2).

Each process runs one :class:`Trader` in one role; the counts it keeps are
what the demo reports. :func:`audit` checks afterwards that no money and no
item was created or lost, whatever the mode.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

import redis
from redis.exceptions import WatchError

from tenure import ArgumentError, Lock
from tenure._tooling import load_script, registry_for, to_text

__all__ = ["MODES", "Audit", "Market", "Tally", "Trader", "audit"]

MODES = ("watch", "lock", "script")
SCRIPTS = "tenure._tools.demo"  # the package whose lua folder holds market_*.lua
BUYER_FUNDS = 10**12  # never the limit: the demo measures contention, not poverty


@dataclass(frozen=True)
class Market:
    """The key names of one marketplace, all under ``prefix``."""

    prefix: str

    @property
    def market(self) -> str:
        """The sorted set of listings."""
        return f"{self.prefix}market:"

    @property
    def lock_prefix(self) -> str:
        """Where the tenure lock around the market (``lock`` mode) keeps its keys."""
        return f"{self.prefix}lock:"

    def user(self, user: str) -> str:
        """A user's hash (field ``funds``)."""
        return f"{self.prefix}users:{user}"

    def inventory(self, user: str) -> str:
        """A user's set of item ids."""
        return f"{self.prefix}inventory:{user}"


@dataclass
class Tally:
    """What one trader did: the demo's counters for one process."""

    created: int = 0
    listed: int = 0
    bought: int = 0
    missed: int = 0  # the item was sold to someone else first
    retries: int = 0
    attempts: int = 0  # purchases tried (bought + missed + cut off by the deadline)
    waited: float = 0.0  # seconds spent inside purchase attempts that bought the item

    @classmethod
    def total(cls, tallies: Iterable[Tally]) -> Tally:
        """The counters of several traders added together."""
        whole = cls()
        for tally in tallies:
            for field in fields(cls):
                setattr(whole, field.name, getattr(whole, field.name) + getattr(tally, field.name))
        return whole


class Trader:
    """One lister or buyer working the market in one mode."""

    def __init__(self, client: redis.Redis, market: Market, mode: str, user: str) -> None:
        if mode not in MODES:
            raise ArgumentError("mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
        self.client = client
        self.market = market
        self.mode = mode
        self.user = user
        self.tally = Tally()
        self._lock = Lock(client, "market", timeout=10, prefix=market.lock_prefix)
        self._scripts = registry_for(client)
        self._random = random.Random()
        self._list: Callable[[str, int, float], bool] = getattr(self, f"_list_{mode}")
        self._buy: Callable[[str, str, float], bool | None] = getattr(self, f"_buy_{mode}")

    # -- listing ---------------------------------------------------------------

    def list_new_item(self, deadline: float) -> None:
        """Make an item in this user's inventory, then list it in the market."""
        item = f"{self.user}-{self.tally.created}"  # unique across sellers
        inventory = self.market.inventory(self.user)
        self.client.sadd(inventory, item)
        self.tally.created += 1
        price = self._random.randint(1, 100)
        listed = self._list(item, price, deadline)
        self.tally.listed += listed

    def _list_watch(self, item: str, price: int, deadline: float) -> bool:
        with self.client.pipeline() as pipe:
            return bool(self._retrying(lambda: self._list_once(pipe, item, price), deadline))

    def _list_once(self, pipe: Any, item: str, price: int) -> bool:
        """The book's listing: WATCH the inventory, check the item, then MULTI/EXEC the move."""
        inventory = self.market.inventory(self.user)
        pipe.watch(inventory)
        if not pipe.sismember(inventory, item):
            pipe.unwatch()
            return False
        pipe.multi()
        pipe.zadd(self.market.market, {f"{item}.{self.user}": price})
        pipe.srem(inventory, item)
        pipe.execute()
        return True

    def _list_lock(self, item: str, price: int, deadline: float) -> bool:
        with self._lock:  # the book's listing, now under the market lock
            return self._list_watch(item, price, deadline)

    def _list_script(self, item: str, price: int, deadline: float) -> bool:
        keys = (self.market.inventory(self.user), self.market.market)
        return bool(
            self._scripts.run(load_script("market_list", SCRIPTS), keys, (item, self.user, price))
        )

    # -- buying ----------------------------------------------------------------

    def buy_something(self, deadline: float) -> bool:
        """Buy one listed item, if any; False when the market was empty."""
        listing = self.client.zrandmember(self.market.market)
        if listing is None:
            return False
        item, _, seller = to_text(listing).rpartition(".")
        began = time.monotonic()
        outcome = self._buy(item, seller, deadline)
        self.tally.attempts += 1
        if outcome is True:
            self.tally.bought += 1
            self.tally.waited += time.monotonic() - began
        elif outcome is False:
            self.tally.missed += 1
        return True

    def _buy_watch(self, item: str, seller: str, deadline: float) -> bool | None:
        watched = (self.market.market, self.market.user(self.user))
        with self.client.pipeline() as pipe:
            return self._retrying(lambda: self._purchase(pipe, watched, item, seller), deadline)

    def _buy_lock(self, item: str, seller: str, deadline: float) -> bool | None:
        watched = (self.market.user(self.user),)  # the lock guards the market itself
        with self._lock, self.client.pipeline() as pipe:
            return self._retrying(lambda: self._purchase(pipe, watched, item, seller), deadline)

    def _retrying(self, attempt: Callable[[], bool], deadline: float) -> bool | None:
        """Run ``attempt`` until no watched key changed under it, or None at the deadline."""
        while time.monotonic() < deadline:
            try:
                return attempt()
            except WatchError:
                self.tally.retries += 1
        return None

    def _purchase(self, pipe: Any, watched: tuple[str, ...], item: str, seller: str) -> bool:
        """The book's purchase: WATCH, read price and funds, then MULTI/EXEC the transfer."""
        market, buyer = self.market.market, self.market.user(self.user)
        pipe.watch(*watched)
        price = pipe.zscore(market, f"{item}.{seller}")
        funds = int(pipe.hget(buyer, "funds") or 0)
        if price is None or price > funds:
            pipe.unwatch()
            return False
        pipe.multi()
        pipe.hincrby(self.market.user(seller), "funds", int(price))
        pipe.hincrby(buyer, "funds", -int(price))
        pipe.sadd(self.market.inventory(self.user), item)
        pipe.zrem(market, f"{item}.{seller}")
        pipe.execute()
        return True

    def _buy_script(self, item: str, seller: str, deadline: float) -> bool | None:
        keys = (
            self.market.market,
            self.market.user(self.user),
            self.market.user(seller),
            self.market.inventory(self.user),
        )
        return (
            int(self._scripts.run(load_script("market_purchase", SCRIPTS), keys, (item, seller)))
            == 1
        )


def open_market(client: redis.Redis, market: Market, sellers: list[str], buyers: list[str]) -> None:
    """Give every buyer its funds and every seller an empty purse."""
    with client.pipeline() as pipe:
        for seller in sellers:
            pipe.hset(market.user(seller), "funds", 0)
        for buyer in buyers:
            pipe.hset(market.user(buyer), "funds", BUYER_FUNDS)
        pipe.execute()


@dataclass(frozen=True)
class Audit:
    """The books after a run: the money and the items found, and those expected."""

    funds: int
    expected_funds: int
    items: int
    expected_items: int

    @property
    def consistent(self) -> bool:
        """True when no money and no item appeared or vanished."""
        return self.funds == self.expected_funds and self.items == self.expected_items


def audit(
    client: redis.Redis, market: Market, sellers: list[str], buyers: list[str], created: int
) -> Audit:
    """Count the money and the items of a market after its traders stopped."""
    users = sellers + buyers
    with client.pipeline(transaction=False) as pipe:
        for user in users:
            pipe.hget(market.user(user), "funds")
        for user in users:
            pipe.scard(market.inventory(user))
        pipe.zcard(market.market)
        replies = pipe.execute()
    funds = sum(int(value or 0) for value in replies[: len(users)])
    items = sum(int(count) for count in replies[len(users) :])
    return Audit(
        funds=funds,
        expected_funds=BUYER_FUNDS * len(buyers),
        items=items,
        expected_items=created,
    )


def close_market(client: redis.Redis, market: Market) -> None:
    """Delete every key of ``market`` (found with SCAN, never KEYS)."""
    keys = list(client.scan_iter(match=f"{market.prefix}*", count=500))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])
