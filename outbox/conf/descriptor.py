"""One ``OUTBOX_*`` setting as a typed, checked descriptor, with a cache of read values.

A value is read from ``django.conf.settings`` once and kept until a setting changes:
until Django announces a change (`setting_changed`) or puts other settings in place
(``override_settings``, pytest-django's ``settings`` fixture). Reading a setting on the
write path then costs a dict lookup. A value that fails its check is never kept: it
raises on every access.
"""

from __future__ import annotations

import math
from typing import Any, Generic, TypeVar, cast, overload

from django.conf import settings as django_settings
from django.core.signals import setting_changed

from outbox.exceptions import OutboxConfigurationError

T = TypeVar("T")

PREFIX = "OUTBOX_"


class _Cache:
    generation = 0  # counts setting changes, so a read that raced one is not kept
    # The settings object the values were read from: override_settings (and the
    # settings fixture, even where it deletes a setting without announcing it) puts a
    # new one in place on entry and the old one back on exit.
    source: object = None


_cache = _Cache()
_values: dict[str, Any] = {}  # checked values by name without the prefix


def _forget(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith(PREFIX):
        _cache.generation += 1
        _values.clear()


setting_changed.connect(_forget, dispatch_uid="outbox.conf.forget")

_KIND_NAMES = {
    bool: "True or False",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list of strings",
}


class Setting(Generic[T]):
    """One ``OUTBOX_*`` setting: a descriptor on `OutboxSettings` returning its value.

    `kind` is the Python type of the value (`bool`, `int`, `float`, `str` or `list`, of
    strings, where a tuple is fine too; taken from the default unless the default is
    None, which also allows None). `above` and `at_least` bound numbers; strings and
    lists must not be empty unless `blank`.
    """

    name: str

    def __init__(
        self,
        default: T,
        doc: str,
        *,
        kind: type | None = None,
        above: float | None = None,
        at_least: float | None = None,
        blank: bool = False,
    ) -> None:
        self.default = default
        self.doc = doc
        self.nullable = default is None
        self.kind: type = kind or type(default)
        if self.kind not in _KIND_NAMES:
            raise TypeError(f"unsupported setting kind {self.kind!r}")
        self.above = above
        self.at_least = at_least
        self.blank = blank

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @property
    def setting_name(self) -> str:
        """The name in Django's settings, e.g. ``OUTBOX_LEASE_SECONDS``."""
        return PREFIX + self.name

    @property
    def expected(self) -> str:
        """The values this setting takes, in words ("a number above 0")."""
        words = _KIND_NAMES[self.kind]
        if self.above is not None:
            words += f" above {self.above:g}"
        if self.at_least is not None:
            words += f" of at least {self.at_least:g}"
        if self.kind in (str, list) and not self.blank:
            words = words.replace("a ", "a non-empty ", 1)
        return words + (", or None" if self.nullable else "")

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> Setting[T]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> T: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> Setting[T] | T:
        if instance is None:
            return self
        source = django_settings._wrapped  # type: ignore[misc]
        if source is not _cache.source:
            _forget(setting=PREFIX)
            _cache.source = source
        try:
            return cast(T, _values[self.name])
        except KeyError:
            pass
        generation = _cache.generation
        value = self.configured()
        problem = self.problem(value)
        if problem:
            raise OutboxConfigurationError(f"{self.setting_name} {problem}.")
        if self.kind is float and value is not None:
            value = float(value)  # an int is fine where a float is expected
        if generation == _cache.generation:  # no setting changed while it was read
            _values[self.name] = value
        return cast(T, value)

    def configured(self) -> Any:
        """The value as set in Django's settings, or the default; not checked."""
        return getattr(django_settings, self.setting_name, self.default)

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` for this setting, or None if nothing is."""
        return self.type_problem(value) or self.value_problem(value)

    def type_problem(self, value: Any) -> str | None:
        """Why `value` has the wrong type for this setting, or None if it has not."""
        if value is None and self.nullable:
            return None
        if isinstance(value, bool):  # bool is an int subclass: True is no count
            fits = self.kind is bool
        elif self.kind is float:
            fits = isinstance(value, (int, float))
        elif self.kind is list:
            fits = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        else:
            fits = isinstance(value, self.kind)
        if fits:
            return None
        return f"is {value!r} ({type(value).__name__}); it must be {self.expected}"

    def value_problem(self, value: Any) -> str | None:
        """Why a value of the right type is out of range, or None if it is not."""
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, (str, list, tuple)):
            return None if value or self.blank else f"is empty; it must be {self.expected}"
        out_of_range = (
            (isinstance(value, float) and not math.isfinite(value))
            or (self.above is not None and not value > self.above)
            or (self.at_least is not None and not value >= self.at_least)
        )
        return f"is {value!r}; it must be {self.expected}" if out_of_range else None
