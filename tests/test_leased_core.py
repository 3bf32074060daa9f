"""The sans-IO core and the ownership rules, without a server."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar

import pytest
import redis
from hypothesis import assume, given
from hypothesis import strategies as st
from redis.crc import key_slot

import tenure
from tenure import ArgumentError
from tenure._backends.owners import BaseOwnerSlot
from tenure._core.leased import (
    Acquired,
    LockKeys,
    LockSettings,
    check_lock_name,
    lone_surrogate,
    name_from_key,
    parse_confirm,
    parse_grant,
)

T = TypeVar("T")

tokens = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)


@given(tokens, st.integers(1, 2**62), st.integers(1, 10**7), st.integers(0, 2**50))
def test_a_grant_message_parses_back(token: str, fence: int, lease: int, server_ms: int) -> None:
    message = f"{token}:{fence}:{lease}:{server_ms}"
    for raw in (message, message.encode()):
        parsed_token, grant = parse_grant(raw)
        assert parsed_token == token
        assert grant == Acquired(fence=fence, lease_ms=lease, server_ms=server_ms)


@given(st.text(max_size=30))
def test_a_message_that_is_no_grant_is_nobodys(text: str) -> None:
    token, grant = parse_grant(text)
    if grant is None:
        assert token == text


def test_confirm_replies() -> None:
    assert parse_confirm([1, 7, 30000]) == Acquired(fence=7, lease_ms=30000)
    assert parse_confirm([0]) is None


_NAME_TEXT = st.text(alphabet="ab{}:(", min_size=1, max_size=8) | st.text(min_size=1, max_size=20)


def _lock_name(text: str) -> str | None:
    try:
        return check_lock_name(text)
    except ArgumentError:
        return None


@given(_NAME_TEXT)
def test_every_key_shares_the_slot_of_redis_pys_key(text: str) -> None:
    name = _lock_name(text)
    assume(name is not None and lone_surrogate(text) is None)
    assert name is not None
    keys = LockKeys.for_name("tenure:lock:", name)
    slots = {key_slot(key.encode()) for key in (*keys, *keys.all)}
    assert slots == {key_slot(name.encode())}  # one slot, redis-py's key `name` included
    assert len(set(keys)) == len(keys)
    assert name_from_key(keys.queue, "tenure:lock:") == name


@given(_NAME_TEXT, _NAME_TEXT)
def test_two_names_never_share_a_key(first: str, second: str) -> None:
    a, b = _lock_name(first), _lock_name(second)
    assume(a is not None and b is not None and a != b)
    assert a is not None and b is not None
    assert not set(LockKeys.for_name("p:", a)) & set(LockKeys.for_name("p:", b))


def test_lock_names_are_text_bytes_or_refused_with_the_reason() -> None:
    assert check_lock_name(b"orders") == "orders"
    assert check_lock_name("lock:{user42}") == "lock:{user42}"
    assert LockKeys.for_name("t:", "lock:{user42}").queue == "t:(lock:{user42}):queue"
    assert LockKeys.for_name("t:", "orders").queue == "t:{orders}:queue"
    for bad, why in [
        (b"\xffx", "bytes must be UTF-8 text: byte 0"),
        ("", "must not be empty"),
        (b"", "must not be empty"),
        (7, "must be a str or bytes, got int"),
        ("a}b", "braces but no hash tag"),
        ("x{}", "braces but no hash tag"),
        ("{", "braces but no hash tag"),
        ("a\ud800", "lone surrogate at 1"),
    ]:
        with pytest.raises(ArgumentError, match=why):
            check_lock_name(bad)


def test_tenure_errors_are_redis_py_errors() -> None:
    assert issubclass(tenure.LockNotOwnedError, redis.exceptions.LockNotOwnedError)
    assert issubclass(tenure.LockLostError, tenure.LockNotOwnedError)
    assert issubclass(tenure.SemaphoreLostError, tenure.SemaphoreNotOwnedError)
    assert issubclass(tenure.AcquireTimeoutError, redis.exceptions.LockError)
    assert issubclass(tenure.AlreadyHeldError, redis.exceptions.LockError)
    assert issubclass(tenure.SemaphoreLimitError, redis.exceptions.LockError)
    assert issubclass(tenure.ServerUnavailableError, redis.exceptions.ConnectionError)
    assert issubclass(tenure.ConnectionPoolExhaustedError, redis.exceptions.MaxConnectionsError)
    assert issubclass(tenure.ConnectionPoolExhaustedError, redis.exceptions.ConnectionError)
    assert not issubclass(tenure.ConnectionPoolExhaustedError, tenure.ServerUnavailableError)
    assert issubclass(tenure.ScriptError, redis.exceptions.ResponseError)
    assert issubclass(tenure.PermissionDeniedError, redis.exceptions.NoPermissionError)
    assert issubclass(tenure.BackendError, redis.exceptions.RedisError)
    error = tenure.LockLostError("lost", name="orders")
    assert error.lock_name == "orders"
    assert str(error) == "lost (name 'orders')"
    assert repr(error) == "LockLostError(\"lost (name 'orders')\")"
    assert f"{type(error).__module__}.{type(error).__qualname__}" == "tenure.LockLostError"
    with pytest.raises(redis.exceptions.LockError):
        raise tenure.AcquireTimeoutError("busy", name="orders")


class _Hold:
    pass


def _slot() -> BaseOwnerSlot[_Hold]:
    return BaseOwnerSlot(
        True,
        threading.current_thread,
        lambda t: not t.is_alive(),  # type: ignore[attr-defined]
    )


def test_a_live_owners_hold_is_its_own() -> None:
    slot = _slot()
    hold = _Hold()
    seen: list[object] = []

    def take() -> None:
        slot.set(hold)
        seen.append(slot.get())
        started.set()
        finish.wait(5)

    started, finish = threading.Event(), threading.Event()
    owner = threading.Thread(target=take)
    owner.start()
    assert started.wait(5)
    assert seen == [hold]
    assert slot.get() is None  # another thread, its owner alive
    finish.set()
    owner.join()
    assert slot.get(adopt=False) is None  # acquire never takes it over
    assert slot.get() is hold  # orphaned: adopted by the next user
    assert slot.get() is hold  # now ours
    slot.clear(hold)
    assert slot.get() is None and not slot.holds(hold)


def test_two_orphans_are_nobodys() -> None:
    slot = _slot()
    holds = [_Hold(), _Hold()]
    for hold in holds:
        thread = threading.Thread(target=slot.set, args=(hold,))
        thread.start()
        thread.join()
    assert slot.get() is None
    assert slot.owners() == 2


def _in_thread(context: contextvars.Context, call: Callable[[], T]) -> T:
    """``call()`` in a new thread that runs in ``context`` (as ``asyncio.to_thread`` does)."""
    result: list[T] = []
    thread = threading.Thread(target=lambda: result.append(context.run(call)))
    thread.start()
    thread.join(5)
    return result[0]


def test_a_context_inherits_the_holds_taken_before_it_was_copied() -> None:
    first, second = _slot(), _slot()
    before = contextvars.copy_context()
    hold = _Hold()
    first.set(hold)
    after = contextvars.copy_context()
    later = _Hold()
    second.set(later)
    assert _in_thread(before, lambda: first.get(adopt=False)) is None  # started earlier
    assert _in_thread(after, lambda: first.get(adopt=False)) is hold  # started later
    assert _in_thread(after, lambda: second.get(adopt=False)) is None  # taken after the copy
    assert _in_thread(contextvars.copy_context(), lambda: second.get(adopt=False)) is later
    first.clear(hold)
    assert _in_thread(after, lambda: first.get(adopt=False)) is None  # released meanwhile
    second.clear(later)


def test_an_inheriting_thread_keeps_its_own_holds_to_itself() -> None:
    first, second = _slot(), _slot()
    hold = _Hold()
    first.set(hold)
    theirs = _Hold()

    def inherit_and_take() -> tuple[_Hold | None, contextvars.Context]:
        second.set(theirs)  # its own hold, in a frame of its own
        inner = contextvars.copy_context()  # what a thread it starts would copy
        return first.get(adopt=False), inner

    found, inner = _in_thread(contextvars.copy_context(), inherit_and_take)
    assert found is hold
    assert second.get(adopt=False) is None  # the owner does not see the thread's hold
    assert _in_thread(contextvars.copy_context(), lambda: second.get(adopt=False)) is None
    assert _in_thread(inner, lambda: (first.get(adopt=False), second.get(adopt=False))) == (
        hold,
        theirs,
    )  # a grandchild inherits both
    first.clear(hold)
    second.clear(theirs)


def test_shared_slot() -> None:
    slot: BaseOwnerSlot[_Hold] = BaseOwnerSlot(False, threading.current_thread, lambda t: False)
    hold = _Hold()
    thread = threading.Thread(target=slot.set, args=(hold,))
    thread.start()
    thread.join()
    assert slot.get() is hold
    slot.clear(hold)
    assert slot.get() is None


@pytest.mark.parametrize(
    "raised",
    [
        redis.exceptions.ConnectionError("Too many connections"),  # redis-py 5 to 6.3's pool
        redis.exceptions.MaxConnectionsError("Too many connections"),  # later ones
        redis.exceptions.MaxConnectionsError(),  # redis.asyncio.cluster's node
    ],
)
def test_an_exhausted_pool_is_told_apart_without_its_pool(raised: Exception) -> None:
    from tenure._core.clients import map_exceptions

    with (
        pytest.raises(tenure.ConnectionPoolExhaustedError) as caught,
        map_exceptions(name="n", doing="testing"),
    ):
        raise raised
    assert caught.value.max_connections is None  # no pool on the traceback to read it from
    assert "max_connections" in str(caught.value)
    assert "redis.BlockingConnectionPool" in str(caught.value)
    assert caught.value.__cause__ is raised


def test_a_pools_other_connection_errors_are_the_server_unavailable() -> None:
    from tenure._core.clients import map_exceptions

    for message in ["Connection not ready", "No connection available."]:
        with (
            pytest.raises(tenure.ServerUnavailableError),
            map_exceptions(name="n", doing="testing"),
        ):
            raise redis.exceptions.ConnectionError(message)  # raised here, not by a pool


def test_map_exceptions_translates_redis_errors_only() -> None:
    from tenure._core.clients import map_exceptions

    with (
        pytest.raises(tenure.ServerUnavailableError) as caught,
        map_exceptions(name="n", doing="testing"),
    ):
        raise redis.exceptions.ConnectionError("down")
    assert isinstance(caught.value.__cause__, redis.exceptions.ConnectionError)
    assert "while testing" in str(caught.value)
    assert not isinstance(caught.value, tenure.ConnectionPoolExhaustedError)
    original = tenure.LockNotOwnedError("mine", name="n")
    with pytest.raises(tenure.LockNotOwnedError) as kept, map_exceptions(name="n"):
        raise original  # tenure's own: untouched (it is a redis-py error too)
    assert kept.value is original
    with pytest.raises(KeyError), map_exceptions():
        raise KeyError("not redis")


seconds = st.floats(min_value=0.001, max_value=10_000, allow_nan=False)


@given(
    timeout=st.none() | seconds,
    blocking_timeout=st.none() | st.floats(min_value=0, max_value=10_000),
    waiter_lease=st.floats(min_value=0.2, max_value=600),
    handoff_lease=st.floats(min_value=0.05, max_value=600),
)
def test_settings_in_range_are_consistent(
    timeout: float | None, blocking_timeout: float | None, waiter_lease: float, handoff_lease: float
) -> None:
    settings = LockSettings.build(
        "n",
        timeout=timeout,
        blocking=True,
        blocking_timeout=blocking_timeout,
        auto_renew=None,
        reentrant=False,
        max_hold=None,
        waiter_lease=waiter_lease,
        handoff_lease=handoff_lease,
    )
    assert settings.lease_ms >= 1 and settings.lease_ms >= settings.lease * 1000
    assert 1 <= settings.handoff_ms <= settings.lease_ms  # never handed over for longer
    assert settings.auto_renew is (timeout is None)  # "until released" means renewed


@given(
    argument=st.sampled_from(["timeout", "blocking_timeout", "waiter_lease", "handoff_lease"]),
    value=st.floats(max_value=-0.001) | st.just(float("nan")) | st.just("1"),
)
def test_bad_settings_name_their_argument(argument: str, value: object) -> None:
    options: dict[str, object] = {
        "timeout": None,
        "blocking": True,
        "blocking_timeout": None,
        "auto_renew": None,
        "reentrant": False,
        "max_hold": None,
        "waiter_lease": 2.0,
        "handoff_lease": 1.0,
    }
    options[argument] = value
    with pytest.raises(tenure.ArgumentError) as caught:
        LockSettings.build("n", **options)  # type: ignore[arg-type]
    assert caught.value.argument == argument
