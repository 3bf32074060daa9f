"""What asyncio does differently from threads: the hand-written half of a pair.

``tenure._backends.for_threads`` has the same names with the same meanings; the
generated sync code imports that module wherever the async source imports
this one. Keep the two side by side and small.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import itertools
import math
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Iterator,
    Sequence,
)
from typing import Any, TypeVar

from tenure._backends.owners import BaseOwnerSlot, generation

__all__ = [
    "CAN_CANCEL_HOLDER",
    "IS_ASYNC",
    "Event",
    "Mutex",
    "OwnerSlot",
    "TwinHints",
    "absorb_guard_cancel",
    "before_waiting",
    "cancel_holder",
    "current_holder",
    "dropped_on_loop",
    "guarded",
    "in_batches",
    "is_cancellation",
    "node_pipeline",
    "on_signals",
    "race",
    "refuse_awaited_call",
    "scope_key",
    "shielded",
    "sleep",
    "source_call",
    "start_background",
    "taken_on_loop",
]

IS_ASYNC = True
CAN_CANCEL_HOLDER = True

T = TypeVar("T")


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` ends a call from outside (a cancellation, Ctrl-C), not as its failure."""
    return isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, SystemExit))


async def sleep(seconds: float) -> None:
    """Sleep without blocking the event loop."""
    await asyncio.sleep(seconds)


class Event:
    """An event a background job waits on with a timeout.

    Built on bare futures rather than ``asyncio.wait_for``, which before
    Python 3.12 can swallow a cancellation that races with its timeout and
    leave a background task running through event-loop shutdown. Small: a
    process can have 10,000 waiting tasks, each with one (one future slot,
    no per-event set; timers run in a bare context, not a copy).
    """

    __slots__ = ("_flag", "_others", "_waiter")

    def __init__(self) -> None:
        self._flag = False
        self._waiter: asyncio.Future[None] | None = None  # the one waiting now (the usual case)
        self._others: set[asyncio.Future[None]] | None = None  # more at once (rare)

    def set(self) -> None:
        """Wake the waiter."""
        self._flag = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        for other in self._others or ():
            if not other.done():
                other.set_result(None)

    def clear(self) -> None:
        """Reset, so the next wait blocks."""
        self._flag = False

    def is_set(self) -> bool:
        """Whether the event is set."""
        return self._flag

    async def wait(self, timeout: float | None) -> bool:
        """Wait until set or ``timeout`` seconds pass (None: no limit); True if it was set."""
        if self._flag:
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        timer = None
        if timeout is not None:
            timer = loop.call_later(max(0.0, timeout), _resolve, waiter, context=_BARE)
        alone = self._waiter is None
        if alone:
            self._waiter = waiter
        else:
            if self._others is None:
                self._others = set()
            self._others.add(waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            if alone:
                self._waiter = None
            elif self._others is not None:
                self._others.discard(waiter)
        return self._flag


_BARE = contextvars.Context()
"""The context of timers that only resolve a future (no copy of the caller's)."""


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Mutex:
    """No-op: asyncio code runs in one thread, so shared state needs no lock (one shared)."""

    __slots__ = ()

    def __new__(cls) -> Mutex:
        return _NO_LOCK

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


_NO_LOCK: Mutex = object.__new__(Mutex)


_background: set[asyncio.Task[object]] = set()
"""Background tasks, referenced until they end (the loop keeps only weak references)."""


def start_background(job: Callable[[], Coroutine[Any, Any, object]], name: str) -> Any:
    """Run ``job`` as a task on the running loop; return the task (kept alive until it ends)."""
    task = asyncio.get_running_loop().create_task(job(), name=name)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


def scope_key() -> object:
    """What a background service is shared by: the running event loop (in this process).

    A fork's child that went on running its parent's loop gets services of its own.
    """
    return (asyncio.get_running_loop(), generation())


SPARED_FOR = 2.0
"""Seconds a call that :func:`shielded` drives may still take once its caller was cancelled.

A server that answers never (paused, cut off) would otherwise hold the
cancelled caller, and an event loop shutting down, for as long as the
client waits; past this the call is cancelled as by a second cancel."""


class _Spare:
    """What a task waits on while :func:`shielded` drives a call: the call's future, spared.

    The task registers its wake-up on the call's own future (so a reply wakes
    it at once, with no loop turn in between), and its ``cancel()`` reaches
    this object rather than that future: the first is refused (the task
    marks itself to be cancelled at its next step, as for any refused
    cancel, and the call runs on to its reply, for at most
    :data:`SPARED_FOR`); a second goes through to the call.
    """

    __slots__ = ("_asyncio_future_blocking", "_future", "_spent")

    def __init__(self, future: Any, spent: bool) -> None:
        self._asyncio_future_blocking = True
        self._future = future
        self._spent = spent  # a cancellation was already spared for this call

    def get_loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop = self._future.get_loop()
        return loop

    def add_done_callback(self, callback: Callable[..., object], *, context: Any = None) -> None:
        self._future.add_done_callback(callback, context=context)

    def cancel(self, msg: Any = None) -> bool:
        if self._spent:
            return bool(self._future.cancel(msg))
        self._spent = True
        # (a future done by then ignores it)
        self.get_loop().call_later(SPARED_FOR, self._future.cancel)
        return False


def _driven(call: Coroutine[Any, Any, T]) -> Generator[Any, None, T]:
    """Run ``call`` in the awaiting task, sparing it the task's first cancellation.

    Each future the call awaits is handed to the task wrapped in a
    :class:`_Spare`; what the task throws back (the future's error, a
    cancellation) goes into the call, but for the first cancellation: that
    one is kept (the call runs on) and raised when the call ends, whatever
    its outcome, unless the call itself took it back (``uncancel()``: a
    timeout of the client's own, inside the call, that expired). One more
    cancellation goes into the call.
    """
    task: Any = asyncio.current_task()
    # How many cancellations were asked of the task before the call (Python
    # 3.10 does not count them: a spared one is always raised there).
    asked = getattr(task, "cancelling", _uncounted)
    before = asked()
    spared: BaseException | None = None
    spare = True  # whether a cancellation may still be spared
    # When the call is cancelled (0: not planned): SPARED_FOR after a spared
    # cancellation, or after its start when its task is being cancelled already
    # (the clean-up after a cancellation: no more cancellations may come to end it).
    patience = 0.0
    if 0 < before < math.inf:
        patience = asyncio.get_running_loop().time() + SPARED_FOR
    value: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                yielded = call.send(value) if error is None else call.throw(error)
            except StopIteration as stop:
                if spared is not None and asked() >= before + 1:
                    raise spared from None
                result: T = stop.value
                return result
            except BaseException:
                if spared is not None and error is None and asked() >= before + 1:
                    raise spared from None  # the call failed after: the cancellation wins
                raise
            value = error = None
            if spared is not None and asked() < before + 1:
                # Taken back by the call: its own timeout (the client's socket_timeout)
                # that expired, not the caller's cancellation. None is spared from now
                # on: the call's next timeouts end it as they would unshielded.
                spared, spare = None, False
            if getattr(yielded, "_asyncio_future_blocking", None) is None:
                waited: Any = yielded  # a bare yield (a loop turn): passed on as it is
            else:
                yielded._asyncio_future_blocking = False  # (as a task does with one it takes)
                if patience and not yielded.done():
                    yielded.get_loop().call_at(patience, yielded.cancel)
                waited = _Spare(yielded, spared is not None or not spare)
            try:
                value = yield waited
            except asyncio.CancelledError as exc:
                if spared is None and spare:
                    spared = exc
                    patience = patience or asyncio.get_running_loop().time() + SPARED_FOR
                else:  # into the call (whose future, cancelled or not, is done)
                    error = exc
            except GeneratorExit:
                raise
            except BaseException as exc:  # the future's error: the call reads it
                error = exc
    except GeneratorExit:
        call.close()
        raise


def _uncounted() -> float:
    """Python 3.10's stand-in for ``Task.cancelling()``: never taken back."""
    return math.inf


class _Shielded:
    """The awaitable :func:`shielded` returns (see :func:`_driven`)."""

    __slots__ = ("_call",)

    def __init__(self, call: Coroutine[Any, Any, T]) -> None:
        self._call = call

    def __await__(self) -> Generator[Any, None, Any]:
        return _driven(self._call)


def shielded(call: Coroutine[Any, Any, T]) -> Awaitable[T]:
    """Finish ``call`` even if the caller is cancelled meanwhile.

    Cleanup that must reach the server (give up a place in a queue, hand a
    lock on) runs to completion; the cancellation is re-raised afterwards.
    A second cancellation of the caller while it waits cancels the call, as
    does the end of :data:`SPARED_FOR` seconds after the first; a call made
    while its task is being cancelled already (clean-up) is cancelled
    :data:`SPARED_FOR` seconds after it starts. The call runs in the
    caller's own task (no task of its own, no loop turn more than awaiting
    it directly).
    """
    return _Shielded(call)


def current_holder() -> object:
    """Who owns a token taken now: the current task."""
    task = asyncio.current_task()
    if task is None:  # pragma: no cover - asyncio code always runs in a task
        raise RuntimeError("tenure's asyncio primitives must be used from a task")
    return task


def cancel_holder(holder: object) -> None:
    """Cancel the task that holds a lost primitive (the opt-in guard)."""
    if isinstance(holder, asyncio.Task) and not holder.done():
        holder.cancel(msg="tenure: lock lost")


def absorb_guard_cancel(holder: object, exc: BaseException | None) -> bool:
    """True if ``exc`` is the cancellation the lost-lock guard sent to ``holder``.

    The task's pending cancellation is withdrawn (``Task.uncancel``), so the
    caller can raise :class:`~tenure.LockLostError` in its place.
    """
    if not isinstance(exc, asyncio.CancelledError) or holder is not asyncio.current_task():
        return False
    if isinstance(holder, asyncio.Task) and hasattr(holder, "uncancel"):
        holder.uncancel()
    return True


def _current_task() -> object | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop (e.g. repr from a plain thread)
        return None


def _task_finished(task: object) -> bool:
    return isinstance(task, asyncio.Future) and task.done()


class OwnerSlot(BaseOwnerSlot[T]):
    """Per-task storage of a primitive's holds (see :mod:`tenure._backends.owners`).

    With ``per_owner=False`` every task shares one slot (redis-py's
    ``thread_local=False``: acquire in one task, release in another).
    """

    def __init__(self, per_owner: bool) -> None:
        super().__init__(per_owner, _current_task, _task_finished)


async def guarded(call: Awaitable[T], undo: Callable[[T], Coroutine[Any, Any, object]]) -> T:
    """Await ``call``; if the caller is cancelled meanwhile, let it finish and undo it.

    For a call whose effect on the server must not be left without a local
    owner (a re-entry counted on the server): the call runs to its reply,
    ``undo(reply)`` runs, shielded too, and the cancellation is re-raised.
    """
    task = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        try:
            result = await task
        except BaseException:  # the call itself failed: nothing happened to undo
            raise
        else:
            await shielded(undo(result))
        raise


@contextlib.contextmanager
def on_signals(signals: tuple[int, ...], callback: Callable[[], None]) -> Iterator[None]:
    """Call ``callback`` on each of ``signals`` while the block runs (the running loop's handlers).

    When the block ends the signals get their default handling back (asyncio's rule).
    """
    loop = asyncio.get_running_loop()
    for number in signals:
        loop.add_signal_handler(number, callback)
    try:
        yield
    finally:
        for number in signals:
            loop.remove_signal_handler(number)


async def source_call(call: Callable[[], Any]) -> Any:
    """A source's call, run in a worker thread so a blocking source never stalls the loop.

    A coroutine function's result is awaited on the loop instead.
    """
    if inspect.iscoroutinefunction(call):
        return await call()
    return await asyncio.to_thread(call)


async def in_batches(rows: Iterable[T] | AsyncIterable[T], size: int) -> AsyncIterator[list[T]]:
    """``rows`` as lists of up to ``size``.

    An async iterable is awaited; a plain one is read a batch at a time in a
    worker thread, so a blocking source never stalls the loop.
    """
    if isinstance(rows, AsyncIterable):
        batch: list[T] = []
        async for row in rows:
            batch.append(row)
            if len(batch) >= size:
                yield batch
                batch = []
        if batch:
            yield batch
        return
    iterator = iter(rows)
    while batch := await asyncio.to_thread(lambda: list(itertools.islice(iterator, size))):
        yield batch


async def node_pipeline(node: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Send ``commands`` to one cluster node on one connection; replies or errors, in order.

    An asyncio cluster node has no client of its own: a connection is taken
    from the node's pool and given back. A connection interrupted mid-reply
    (cancelled, timed out) is closed, never reused out of step.
    """
    from redis.exceptions import ResponseError

    connection = node.acquire_connection()
    try:
        await connection.send_packed_command(connection.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await connection.read_response())
            except ResponseError as exc:
                replies.append(exc)
    except BaseException:
        await connection.disconnect()
        raise
    finally:
        node.release(connection)
    return replies


_racing: set[asyncio.Task[Any]] = set()  # calls that outlived their race, until they end


def _outcome(task: asyncio.Task[T]) -> T | BaseException:
    if task.cancelled():
        return asyncio.CancelledError()
    error = task.exception()
    return task.result() if error is None else error


async def race(
    calls: Sequence[Callable[[], Awaitable[T]]],
    timeout: float,
    settled: Callable[[dict[int, T | BaseException]], bool | float],
    late: Callable[[int, T | BaseException], None],
    lanes: Sequence[object] | None = None,
) -> dict[int, T | BaseException]:
    """Start every call at once; return the outcomes in by ``settled`` or ``timeout``.

    Outcomes (a result or the exception raised) are keyed by the call's
    index. The race ends as soon as ``settled(outcomes)`` is true (a number
    instead: wait at most that many seconds more) or ``timeout`` seconds
    passed; calls still running are not cancelled (their
    effect on a server must not go unseen): each one's outcome goes to
    ``late(index, outcome)`` when it comes. If the caller is cancelled, every
    call still running is handed to ``late`` the same way. A call cancelled
    itself is handed to nobody: only its event loop's end cancels what runs,
    and no loop is left then to act on it (what it took ends with its lease).
    ``lanes`` (the server of each call) matters only to the threads' twin.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    tasks = {asyncio.ensure_future(call()): index for index, call in enumerate(calls)}
    outcomes: dict[int, T | BaseException] = {}
    pending = set(tasks)
    try:
        while pending:
            verdict = settled(outcomes)
            if verdict is True:
                break
            if verdict is not False:  # a number: wait at most that much longer
                deadline = min(deadline, loop.time() + verdict)
            left = deadline - loop.time()
            if left <= 0:
                break
            done, pending = await asyncio.wait(
                pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                outcomes[tasks[task]] = _outcome(task)
    finally:
        for task in pending:
            index = tasks[task]
            _racing.add(task)

            def finished(task: asyncio.Task[T], index: int = index) -> None:
                _racing.discard(task)
                if not task.cancelled():
                    late(index, _outcome(task))

            task.add_done_callback(finished)
    return outcomes


# -- a sync primitive on a thread whose event loop runs (see _backends.event_loops) --------


class TwinHints:
    """Nothing under asyncio (the threads twin refuses ``async with``, naming the twin)."""

    __slots__ = ()


def taken_on_loop(key: str) -> int:
    """Nothing to note under asyncio (a task's wait never blocks its loop): 0."""
    return 0


def dropped_on_loop(ident: int, key: str) -> None:
    """Nothing to forget under asyncio."""


def before_waiting(kind: str, key: str, name: str) -> None:
    """Nothing to refuse under asyncio: waiting yields to the loop."""


def refuse_awaited_call(kind: str, method: str, depth: int) -> None:
    """Nothing to refuse under asyncio: its calls are meant to be awaited."""
