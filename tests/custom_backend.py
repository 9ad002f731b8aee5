"""A backend defined by a project, outside the `outbox` package: the portable path, with
a count of the statements it runs and a record of what the engine asked of it. Named in
`OUTBOX_BACKENDS` by the tests (tests/test_custom_backend.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import connections

from outbox.backends.portable import PortableBackend


class CountingBackend(PortableBackend):
    """The portable backend, counting the statements each of its steps runs."""

    statements: list[str] = []  # the SQL of every statement run, in order
    reads: list[bool] = []  # per window read: whether the engine asked for `timed`

    @classmethod
    def reset(cls) -> None:
        cls.statements.clear()
        cls.reads.clear()

    @contextmanager
    def _counted(self) -> Any:
        def count(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
            type(self).statements.append(sql)
            return execute(sql, *args)

        with connections[self.using].execute_wrapper(count):
            yield

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        with self._counted():
            return super().claim(*args, **kwargs)

    def read_window(self, *args: Any, timed: bool = False, **kwargs: Any) -> Any:
        type(self).reads.append(timed)
        with self._counted():
            return super().read_window(*args, timed=timed, **kwargs)

    def settle(self, *args: Any, **kwargs: Any) -> Any:
        with self._counted():
            return super().settle(*args, **kwargs)

    def renew(self, *args: Any, **kwargs: Any) -> Any:
        with self._counted():
            return super().renew(*args, **kwargs)

    def release(self, *args: Any, **kwargs: Any) -> Any:
        with self._counted():
            return super().release(*args, **kwargs)

    def wake(self, *args: Any, **kwargs: Any) -> Any:
        with self._counted():
            return super().wake(*args, **kwargs)


class Deadlocked(Exception):
    """An error this project's database calls a lock error (as a driver would by code)."""


class FlakyBackend(CountingBackend):
    """Its first claim fails with an error only this backend knows to be transient."""

    failures: list[int] = []  # the claims that failed so far (their attempt numbers)

    @classmethod
    def lock_error(cls, error: BaseException) -> bool:
        return isinstance(error, Deadlocked) or super().lock_error(error)

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        if not type(self).failures:
            type(self).failures.append(1)
            raise Deadlocked("deadlock detected (a test's)")
        return super().claim(*args, **kwargs)


NOT_A_BACKEND: Sequence[str] = ()  # a dotted path to something that is no backend class
