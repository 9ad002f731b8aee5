"""Scopes and categories, declared by the project as enums.

A project subclasses :class:`OutboxCategory` for its message kinds and
:class:`OutboxScope` for its shard scopes; each scope member lists its categories::

    class Category(OutboxCategory):
        ORGANIZATION_UPDATE = 1
        AUDIT_LOG_EVENT = 2

    class Scope(OutboxScope):
        ORGANIZATION = 0, {Category.ORGANIZATION_UPDATE, Category.AUDIT_LOG_EVENT}

A category belongs to exactly one scope; declaring it in two raises at import time, and
so do the other declaration mistakes, each naming both declarations (module, class and
member) and the fix: two members of one enum with one value (Python would silently make
the second an alias of the first), two categories or two scopes of different enums, apps
or modules with one value, and a value that does not fit its 32-bit column. A category
enum is checked as its class is created, whether or not a scope lists it yet. Category
members are the ``sender`` of the process signals.
"""

from __future__ import annotations

import enum
import itertools
import os
import secrets
import time
from collections.abc import Iterable
from typing import Any, Literal, Protocol, cast

from outbox.exceptions import InvalidOutboxMessage, OutboxConfigurationError
from outbox.shards import ShardKey


class RetryPolicyLike(Protocol):
    """What `OutboxCategory.retry_policy` returns: an `outbox.retry.RetryPolicy`,
    named here by the two decisions the engine asks of it, because `outbox.retry` reads
    this module's registry (a category's own `max_attempts`) and this module must not
    import it back. Which object it is, is checked when the checks run and at the
    first failure (`outbox.retry.declared_policy`)."""

    def is_final(self, failure: Any) -> bool: ...

    def row_delays(self, failure: Any) -> list[float]: ...


# How a stored scope or category value is shown: "plain", its name (the number when no
# enum declares it: metrics labels, status, summaries); "noted", its name or `7 (not
# declared)` (log lines, admin lists); "labelled", `ORGANIZATION (0)` or `7 (not
# declared)` (one row's admin page).
NameForm = Literal["plain", "noted", "labelled"]


def _named(member: enum.Enum | None, value: int, form: NameForm) -> str:
    if member is None:
        return str(value) if form == "plain" else f"{value} (not declared)"
    return f"{member.name} ({value})" if form == "labelled" else member.name


def _label(member: enum.Enum) -> str:
    return f"{type(member).__name__}.{member.name}"


def _where(member: enum.Enum) -> str:
    """The member with its module, so two apps' `Category` classes can be told apart."""
    cls = type(member)
    return f"{cls.__module__}.{cls.__qualname__}.{member.name}"


def _check_fits(member: enum.IntEnum, column: str) -> None:
    """shard_scope and category are IntegerField columns: the range every database
    stores, the one validation applies to saved rows."""
    from django.db.backends.base.operations import BaseDatabaseOperations

    low, high = BaseDatabaseOperations.integer_field_ranges["IntegerField"]
    if not low <= member.value <= high:
        raise OutboxConfigurationError(
            f"{_label(member)} = {member.value} does not fit the {column} column, which "
            f"holds {low} to {high}."
        )


def _refuse_aliases(cls: type[enum.Enum]) -> None:
    """Two members of one enum with one value are one member (the second an alias of the
    first): its name would resolve to the other member, and for a scope its categories
    would be dropped without a word."""
    for name, member in cls.__members__.items():
        if member.name != name:
            raise OutboxConfigurationError(
                f"{cls.__module__}.{cls.__qualname__}.{name} = {member.value} repeats the "
                f"value of {cls.__name__}.{member.name}, so Python makes it an alias "
                f"of {member.name} and it would be silently dropped. Give "
                f"{cls.__name__}.{name} a value of its own."
            )


class _DeclarationMeta(enum.EnumMeta):
    # Checked once the enum class is complete: Python 3.10 does not show members to
    # __init_subclass__ yet.
    def __new__(mcls, *args: Any, **kwargs: Any) -> Any:
        cls = super().__new__(mcls, *args, **kwargs)
        _refuse_aliases(cast("type[enum.Enum]", cls))
        return cls


class _CategoryMeta(_DeclarationMeta):
    # Claimed once the enum class is complete and its members checked.
    def __new__(mcls, *args: Any, **kwargs: Any) -> Any:
        cls = super().__new__(mcls, *args, **kwargs)
        if cls.__members__:
            registry.declare(cast("type[OutboxCategory]", cls))
        return cls


class OutboxCategory(enum.IntEnum, metaclass=_CategoryMeta):
    """Base class of a project's categories (values unique across the project)."""

    @property
    def scope(self) -> OutboxScope:
        return registry.scope_of(self)

    def max_attempts(self) -> int | None:
        """Failed attempts after which a message of this category becomes a dead letter:
        0 never gives up, None (the default) follows OUTBOX_MAX_ATTEMPTS. Override it on
        the project's category enum to give some categories their own limit::

            class Category(OutboxCategory):
                PAYMENT = 5

                def max_attempts(self) -> int | None:
                    return 3 if self is Category.PAYMENT else None

        The stock retry policy reads it (`outbox.retry.RetryPolicy.max_attempts`).
        """
        return None

    def retry_policy(self) -> RetryPolicyLike | type[RetryPolicyLike] | None:
        """The retry policy of this category's failures, an `outbox.retry.RetryPolicy`
        subclass or instance; None (the default) follows OUTBOX_RETRY_POLICY::

            def retry_policy(self) -> type[RetryPolicy] | None:
                return QuickRetries if self is Category.PAYMENT else None
        """
        return None


class _ScopeMeta(_DeclarationMeta):
    # Registration happens once the enum class is complete and its members checked.
    def __new__(mcls, *args: Any, **kwargs: Any) -> Any:
        cls = super().__new__(mcls, *args, **kwargs)
        if cls.__members__:
            registry.add_scopes(cast("type[OutboxScope]", cls))
        return cls


class OutboxScope(enum.IntEnum, metaclass=_ScopeMeta):
    """Base class of a project's scopes: each member is ``value, {categories}``."""

    categories: frozenset[OutboxCategory]

    def __new__(cls, value: int, categories: Iterable[OutboxCategory] = ()) -> OutboxScope:
        member = int.__new__(cls, value)
        member._value_ = value
        member.categories = frozenset(categories)
        return member


def _collision(kind: str, known: enum.IntEnum, new: enum.IntEnum, free: int) -> str:
    """Two declarations share one stored integer: name both, and a value that is free."""
    message = (
        f"{kind} value {new.value} is declared twice: by {_where(known)} and by "
        f"{_where(new)}. {kind} values are stored as integers, so each must be unique "
        f"across the project, in every app and module. Give one of them another value "
        f"(for instance {free}, the next unused one)."
    )
    if _where(known) == _where(new):
        message += " Both names are the same: is that module imported under two names, or reloaded?"
    return message


class Registry:
    """Where every declared scope and category is looked up by its stored integer."""

    def __init__(self) -> None:
        self.scopes: dict[int, OutboxScope] = {}
        self.categories: dict[int, OutboxCategory] = {}  # those a scope lists
        self.declared: dict[int, OutboxCategory] = {}  # every category, listed or not
        self._scope_of: dict[OutboxCategory, OutboxScope] = {}

    def declare(self, category_enum: type[OutboxCategory]) -> None:
        """Claim the values of a category enum's members, or none of them: each must
        fit the category column and be unique across the project."""
        for category in category_enum:
            _check_fits(category, "category")
            known = self.declared.get(category.value)
            if known is not None and known is not category:
                free = max(self.declared) + 1
                raise OutboxConfigurationError(_collision("Category", known, category, free))
        self.declared.update((category.value, category) for category in category_enum)

    def add_scopes(self, scope_enum: type[OutboxScope]) -> None:
        """Register every member of a scope enum, or none of them."""
        saved = (dict(self.scopes), dict(self.categories), dict(self._scope_of))
        try:
            for scope in scope_enum:
                self._add_scope(scope)
        except BaseException:
            self.scopes, self.categories, self._scope_of = saved
            raise

    def _add_scope(self, scope: OutboxScope) -> None:
        _check_fits(scope, "shard_scope")
        for category in scope.categories:
            _check_listed(scope, category)
        known = self.scopes.get(scope.value)
        if known is not None and known is not scope:
            raise OutboxConfigurationError(_collision("Scope", known, scope, max(self.scopes) + 1))
        self.scopes[scope.value] = scope
        # Sorted, so which of two bad categories is reported does not vary between runs.
        for category in sorted(scope.categories, key=_where):
            self._add_category(scope, category)

    def _add_category(self, scope: OutboxScope, category: OutboxCategory) -> None:
        # Values are unique (`declare`), so an equal category is the same one.
        owner = self._scope_of.get(category)
        if owner is not None and owner is not scope:
            raise OutboxConfigurationError(
                f"Category {_label(category)} is declared in two scopes: "
                f"{_label(owner)} and {_label(scope)} ({_where(owner)} and "
                f"{_where(scope)}). A category belongs to exactly one scope: remove it "
                f"from one of them, or declare a second category for the other."
            )
        self._scope_of[category] = scope
        self.categories[category.value] = category

    def scope(self, value: int) -> OutboxScope:
        try:
            return self.scopes[int(value)]
        except (KeyError, TypeError, ValueError):
            raise InvalidOutboxMessage(
                f"Unknown shard_scope {value!r}: no OutboxScope declares it."
            ) from None

    def category(self, value: int) -> OutboxCategory:
        try:
            return self.categories[int(value)]
        except (KeyError, TypeError, ValueError):
            raise InvalidOutboxMessage(
                f"Unknown category {value!r}: no OutboxScope lists a category with this value."
            ) from None

    def scope_name(self, value: int, form: NameForm = "plain") -> str:
        """A stored scope value as `form` shows it (see `NameForm`). Never raises: log
        lines and admin pages show values no enum declares (any more) too."""
        return _named(self.scopes.get(value) if isinstance(value, int) else None, value, form)

    def category_name(self, value: int, form: NameForm = "plain") -> str:
        """A stored category value as `form` shows it (see `NameForm`), declared by an
        enum whether or not a scope lists it. Never raises."""
        member = None
        if isinstance(value, int):
            member = self.categories.get(value)
            member = self.declared.get(value) if member is None else member
        return _named(member, value, form)

    def shard_name(self, key: ShardKey, form: NameForm = "plain") -> str:
        """`eu/ORGANIZATION/3`: the region (if any), the scope as `form` shows it, the
        identifier. `str(key)` is the same shard in numbers only."""
        region = f"{key.region_name}/" if key.region_name else ""
        return f"{region}{self.scope_name(key.shard_scope, form)}/{key.shard_identifier}"

    def scope_of(self, category: OutboxCategory) -> OutboxScope:
        return self._scope_of[category]

    def check_pair(self, scope_value: int, category_value: int) -> None:
        """Raise InvalidOutboxMessage unless the category belongs to the scope."""
        scope = self.scope(scope_value)
        category = self.category(category_value)
        owner = self._scope_of[category]
        if owner is not scope:
            raise InvalidOutboxMessage(
                f"Category {_label(category)} belongs to scope {_label(owner)}, "
                f"not to {_label(scope)}."
            )

    def scope_by_name(self, name: str) -> OutboxScope:
        """Find a scope by member name (``ORGANIZATION``) or by value (``"0"``)."""
        if name.lstrip("-").isdigit():
            return self.scope(int(name))
        for scope in self.scopes.values():
            if scope.name == name.upper():
                return scope
        raise InvalidOutboxMessage(f"Unknown scope {name!r}.")


def _check_listed(scope: OutboxScope, category: object) -> None:
    if not isinstance(category, OutboxCategory):
        raise OutboxConfigurationError(
            f"{_where(scope)} lists {category!r}, which is not an OutboxCategory member. "
            f"List members of an OutboxCategory subclass, e.g. "
            f"{scope.name} = {scope.value}, {{Category.SOME_UPDATE}}."
        )


registry = Registry()


def unique_object_identifier() -> int:
    """Return an object_identifier that no other message will share, so it never coalesces.

    Milliseconds since 2024 in the high bits keep the values roughly time-ordered (and
    positive, fitting a signed 64-bit column until 2093). The low 22 bits are a counter
    of this process starting at a random point (re-drawn in forked children), so one
    process never repeats itself and two processes collide only if they hit the same
    millisecond and the same counter value.
    """
    millis = time.time_ns() // 1_000_000 - _EPOCH_2024_MS
    return millis << 22 | next(_counter) & _LOW_MASK


def _reseed_counter() -> None:
    global _counter
    _counter = itertools.count(secrets.randbits(22))


_EPOCH_2024_MS = 1_704_067_200_000
_LOW_MASK = (1 << 22) - 1
_counter = itertools.count(secrets.randbits(22))
os.register_at_fork(after_in_child=_reseed_counter)
