"""The public API: documented, flat, and the same in its sync and asyncio halves."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys

import pytest
import redis

import tenure
import tenure.inspection
import tenure.server
import tenure.testing


@pytest.mark.parametrize("module", [tenure, tenure.inspection, tenure.server, tenure.testing])
def test_every_public_name_is_documented(module: object) -> None:
    names: list[str] = getattr(module, "__all__")  # noqa: B009
    assert names == sorted(names, key=str.lower) or names == sorted(names)
    missing = []
    for name in names:
        if name.startswith("__"):
            continue
        obj = getattr(module, name)
        if not (inspect.getdoc(obj) or "").strip():
            missing.append(name)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or (
                    not callable(member) and not isinstance(member, property)
                ):
                    continue
                if not (inspect.getdoc(member) or "").strip():
                    missing.append(f"{name}.{attr}")
    assert missing == []


def _twins() -> list[tuple[type, type]]:
    """Every public asyncio class with its sync twin (``AsyncX`` and ``X``)."""
    names = set(tenure.__all__)
    return [
        (getattr(tenure, name[5:]), getattr(tenure, name))
        for name in sorted(names)
        if name.startswith("Async") and name[5:] in names and inspect.isclass(getattr(tenure, name))
    ]


def test_every_asyncio_class_has_its_twin() -> None:
    names = set(tenure.__all__)
    alone = [n for n in names if n.startswith("Async") and n[5:] not in names]
    assert alone == []
    assert len(_twins()) >= 16


@pytest.mark.parametrize(("sync", "asynchronous"), _twins(), ids=lambda cls: cls.__name__)
def test_sync_and_async_twins_match(sync: type, asynchronous: type) -> None:
    def public(cls: type) -> dict[str, inspect.Signature]:
        return {
            name: inspect.signature(member)
            for name, member in inspect.getmembers(cls)
            if not name.startswith("_") and inspect.isfunction(member)
        }

    sync_api, async_api = public(sync), public(asynchronous)
    assert sync_api.keys() == async_api.keys()
    for name, signature in sync_api.items():
        if name == "acquire":  # redis-py's two orders: sleep first (sync), keyword-only (asyncio)
            assert set(signature.parameters) == set(async_api[name].parameters), name
            continue
        assert list(signature.parameters) == list(async_api[name].parameters), name
    for name in async_api:
        member = getattr(asynchronous, name)
        # plain in both worlds: counters, a key's name, a source's description, and a
        # consumer's stop() and stopping() (a flag: stop() is callable from a signal handler)
        if name in {"statistics", "key_of", "describe", "stop", "stopping"}:
            continue
        if name == "rows" and getattr(asynchronous, "_is_protocol", False):
            continue  # AsyncRowSource declares a method that returns an async iterator
        assert inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member), (
            f"{asynchronous.__name__}.{name}"
        )
    async_only = {"cancel_on_lost"}  # threads cannot be cancelled
    assert list(inspect.signature(sync).parameters) == [
        name for name in inspect.signature(asynchronous).parameters if name not in async_only
    ]


ASYNC_WORDS = re.compile(r"\basyncio\b|\bevent\s+loops?\b|\btasks?\b|\bcoroutines?\b|\bawait\b")


@pytest.mark.parametrize("cls", [sync for sync, _ in _twins()], ids=lambda cls: cls.__name__)
def test_sync_docs_speak_of_threads_only(cls: type) -> None:
    texts = {cls.__name__: inspect.getdoc(cls) or ""}
    for name, member in inspect.getmembers(cls):
        if not name.startswith("_") and (
            inspect.isfunction(member) or isinstance(member, property)
        ):
            texts[f"{cls.__name__}.{name}"] = inspect.getdoc(member) or ""
    found = {where: ASYNC_WORDS.findall(text) for where, text in texts.items()}
    assert {where: words for where, words in found.items() if words} == {}


def test_error_tree_has_one_root() -> None:
    errors = [
        getattr(tenure, name)
        for name in tenure.__all__
        if name.endswith("Error") and inspect.isclass(getattr(tenure, name))
    ]
    assert len(errors) >= 10
    for error in errors:
        assert issubclass(error, tenure.TenureError)
    assert issubclass(tenure.ArgumentError, ValueError)
    assert issubclass(tenure.ClientTypeError, TypeError)
    assert "TenureError" in (tenure._core.exceptions.__doc__ or "")


def test_the_backend_pair_has_the_same_names_and_signatures() -> None:
    from tenure._backends import for_asyncio as on_asyncio
    from tenure._backends import for_threads as on_threads

    assert on_asyncio.__all__ == on_threads.__all__
    for name in on_asyncio.__all__:
        mine, theirs = getattr(on_asyncio, name), getattr(on_threads, name)
        if inspect.isclass(mine):
            methods = {m for m in vars(mine) if not m.startswith("_")}
            assert methods == {m for m in vars(theirs) if not m.startswith("_")}, name
            for method in methods:
                assert list(inspect.signature(getattr(mine, method)).parameters) == list(
                    inspect.signature(getattr(theirs, method)).parameters
                ), f"{name}.{method}"
        elif callable(mine):
            assert list(inspect.signature(mine).parameters) == list(
                inspect.signature(theirs).parameters
            ), name


def test_read_write_sides_have_no_semaphore_only_api() -> None:
    for side in (tenure.ReadLock, tenure.WriteLock, tenure.AsyncReadLock, tenure.AsyncWriteLock):
        for name in ("refresh", "holders", "set_limit", "limit"):
            assert not hasattr(side, name), f"{side.__name__}.{name}"
    for semaphore in (tenure.Semaphore, tenure.AsyncSemaphore):
        for name in ("refresh", "holders", "set_limit", "limit"):
            assert hasattr(semaphore, name)


def test_statistics_are_immutable_and_of_their_kind() -> None:
    import dataclasses

    client = redis.Redis(port=1)  # statistics need no server
    lock = tenure.Lock(client, "s").statistics()
    semaphore = tenure.Semaphore(client, "s", limit=3).statistics()
    side = tenure.ReadWriteLock(client, "s").write.statistics()
    assert type(lock) is tenure.LockStatistics
    assert isinstance(semaphore, tenure.SemaphoreStatistics) and semaphore.limit == 3
    assert isinstance(side, tenure.ReadWriteStatistics) and side.mode == "write"
    with pytest.raises(dataclasses.FrozenInstanceError):
        lock.acquisitions = 5  # type: ignore[misc]


_LOCK_LIKE = [
    tenure.Lock,
    tenure.ReentrantLock,
    tenure.ClusterLock,
    tenure.Redlock,
    tenure.ReadWriteLock,
    tenure.AsyncLock,
    tenure.AsyncReentrantLock,
    tenure.AsyncClusterLock,
    tenure.AsyncRedlock,
    tenure.AsyncReadWriteLock,
]


def _positional(cls: type) -> list[tuple[str, object]]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    parameters = inspect.signature(cls).parameters.values()
    return [(p.name, p.default) for p in parameters if p.kind in kinds]


@pytest.mark.parametrize("cls", _LOCK_LIKE, ids=lambda cls: cls.__name__)
def test_lock_like_primitives_take_redis_py_locks_positional_arguments(cls: type) -> None:
    """redis-py's eight, in its order with its defaults; everything else keyword-only."""
    import redis.asyncio.lock
    import redis.lock

    theirs = _positional(redis.lock.Lock)
    assert theirs == _positional(redis.asyncio.lock.Lock)
    assert [name for name, _ in theirs][:2] == ["redis", "name"]
    ours = _positional(cls)
    client = "clients" if "Redlock" in cls.__name__ else "client"
    assert ours == [(client, inspect.Parameter.empty), *theirs[1:]]


@pytest.mark.parametrize("cls", [tenure.Semaphore, tenure.AsyncSemaphore], ids=lambda c: c.__name__)
def test_a_semaphore_takes_its_limit_third_and_the_rest_by_keyword(cls: type) -> None:
    """``Semaphore(client, name, 5)``, as every semaphore API has it; the lease and the
    lock's other arguments are keywords, so no number can be taken for another."""
    empty = inspect.Parameter.empty
    assert _positional(cls) == [("client", empty), ("name", empty), ("limit", empty)]
    with pytest.raises(TypeError):
        cls(object(), "n", 3, 30)  # a lease after the limit: refused, not taken as one


def test_a_connection_lock_takes_only_client_and_name_positionally() -> None:
    for cls in (tenure.ConnectionLock, tenure.AsyncConnectionLock):
        assert [name for name, _ in _positional(cls)] == ["client", "name"]


@pytest.mark.parametrize(
    "cls",
    [
        tenure.Lock,
        tenure.ReentrantLock,
        tenure.ClusterLock,
        tenure.Redlock,
        tenure.Semaphore,
        tenure.ReadWriteLock,
        tenure.ConnectionLock,
    ],
    ids=lambda cls: cls.__name__,
)
def test_owner_name_is_keyword_only_and_checked(cls: type) -> None:
    """Every primitive inspect shows takes owner_name=, and refuses a bad one by name."""
    named = inspect.signature(cls).parameters.get("owner_name")
    assert named is None or named.kind is inspect.Parameter.KEYWORD_ONLY  # else in **kwargs
    client = redis.Redis()  # never connects: the arguments are checked first
    first = [client] if cls is tenure.Redlock else client
    extra = {"limit": 1} if cls is tenure.Semaphore else {}
    made = cls(first, "n", owner_name="billing-worker", **extra)
    holder = made.read if cls is tenure.ReadWriteLock else made
    assert holder.owner_name == "billing-worker"
    host_pid = cls(first, "n", **extra)
    default = (host_pid.read if cls is tenure.ReadWriteLock else host_pid).owner_name
    assert default.endswith(f":{__import__('os').getpid()}")
    for bad, why in [
        ("", "must not be empty"),
        (7, "must be a str"),
        ("x" * 201, "at most 200 characters"),
        ("tab\there", "printable"),
    ]:
        with pytest.raises(tenure.ArgumentError, match=f"owner_name.*{why}"):
            cls(first, "n", owner_name=bad, **extra)
    client.close()


def test_the_default_owner_name_follows_a_fork() -> None:
    import os
    import socket

    from tenure._backends.owners import default_owner_name

    assert default_owner_name() == f"{socket.gethostname()}:{os.getpid()}"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, default_owner_name().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 200).decode() == f"{socket.gethostname()}:{pid}"
    os.close(read)
    os.close(write)


def test_tokens_are_unique_and_a_forked_child_draws_its_own() -> None:
    import os
    import re

    from tenure._backends.owners import new_token

    made = [new_token() for _ in range(1000)]
    assert len(set(made)) == 1000
    assert all(re.fullmatch("[0-9a-f]{32}", token) for token in made)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, " ".join(new_token() for _ in range(3)).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 1000).decode().split()
    mine = [new_token() for _ in range(3)]  # the same count as the child's: another prefix
    assert len(child) == 3 and not set(child) & set(mine)
    assert {token[:16] for token in child} != {token[:16] for token in mine}
    os.close(read)
    os.close(write)


@pytest.mark.parametrize(
    ("missing", "statement", "says"),
    [
        ("msgpack", "tenure.MsgpackSerializer()", 'pip install msgpack (or "tenure[msgpack]")'),
        ("zstandard", "tenure.ZstdCompressor()", 'pip install zstandard (or "tenure[zstd]")'),
        ("pyroaring", "tenure.IdSet", '(pyroaring is missing): pip install "tenure[idsets]"'),
        ("numpy", "tenure.AsyncIdSet", '(numpy is missing): pip install "tenure[idsets]"'),
    ],
)
def test_a_missing_optional_package_is_one_typed_error(
    missing: str, statement: str, says: str
) -> None:
    """Every optional package missing is a MissingDependencyError naming the pip command."""
    code = (
        f"import sys; sys.modules[{missing!r}] = None\n"
        "import tenure\n"
        f"try:\n    {statement}\n"
        "except tenure.MissingDependencyError as exc:\n"
        "    print(type(exc).__name__, exc, isinstance(exc, ImportError))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("MissingDependencyError "), done.stdout + done.stderr
    assert says in done.stdout and done.stdout.endswith(" True\n")


@pytest.mark.parametrize("missing", ["numpy", "pyroaring", None])
def test_a_star_import_works_without_the_extras(missing: str | None) -> None:
    """``from tenure import *`` takes what is installed; the id sets only with their extra."""
    block = "" if missing is None else f"import sys; sys.modules[{missing!r}] = None\n"
    code = block + "from tenure import *\nprint('Lock' in dir(), 'IdSet' in dir())\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("True True\n" if missing is None else "True False\n")
