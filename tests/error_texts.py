"""What every error text tenure raises must be: one line, context said once, no script names.

Used by ``tests/test_error_texts.py`` and ``tests/_async/test_error_texts.py``
(and its generated sync twin) on the messages of every error path they drive.
"""

from __future__ import annotations

import re

from tenure._core.scripts import script_names

__all__ = ["SCRIPT_NAMES", "assert_clear", "repeated_fragment"]

SCRIPT_NAMES = frozenset(script_names() + script_names("tenure._tools.demo"))
"""Every Lua script tenure ships: a name the user never called, so never in a message."""

_REPEATED = re.compile(r"(?<!\S)(\S+ \S.{9,}?)(?!\w).*?(?<!\S)\1(?!\w)")
"""A fragment of 12 or more characters said twice: whole words, more than one.

Whole words, so that two words sharing a stem are no repeat ("its
connections ... the client's connection"); more than one, so that an
identifier a message rightly says twice is none either ("max_connections=1
... raise max_connections"). It catches a phrase said again, such as
``(name 'f') (name 'f')``."""

_LONG_WORD_AGAIN = re.compile(r"\b(\S{20,}?)\b.*?\b\1\b")
"""A long identifier said twice: a function's qualified name in the text and in
``(name 'module.qualified.name')``, a key, an address."""

_PREFIX_AGAIN = re.compile(r"^(?P<argument>[\w\[\].]+): .*(?<![\w\[\].])(?P=argument): ")
"""An :class:`~tenure.ArgumentError`'s ``argument:`` said again further on
(``client: @cached ... needs ...: client: HerdCache ...``)."""


_NAME_AGAIN = re.compile(r"(?P<name>'[^']+').*\(name (?P=name)\)$")
"""A primitive's name said in the message, and again by the ``(name ...)`` suffix."""


def repeated_fragment(message: str) -> str | None:
    """The first context said twice in ``message``, or None."""
    found = _REPEATED.search(message)
    if found is not None:
        return found.group(1)
    long_word = _LONG_WORD_AGAIN.search(message)
    if long_word is not None:
        return long_word.group(1)
    named = _NAME_AGAIN.search(message)
    if named is not None:
        return named.group("name")
    again = _PREFIX_AGAIN.search(message)
    return None if again is None else again.group("argument") + ": "


def assert_clear(error: BaseException) -> str:
    """Fail unless ``error``'s text is one line that says its context once and names no
    script; return the text."""
    message = str(error)
    assert message, f"{type(error).__name__} with no message"
    assert "\n" not in message, f"more than one line: {message!r}"
    named = sorted(name for name in SCRIPT_NAMES if re.search(rf"\b{name}\b", message))
    assert not named, f"names the script {named} rather than the operation: {message!r}"
    again = repeated_fragment(message)
    assert again is None, f"says {again!r} twice: {message!r}"
    return message
