"""List filters that show scopes, categories and lease states by name."""

from __future__ import annotations

import re
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import QuerySet
from django.http import HttpRequest

from outbox.categories import registry
from outbox.models import OutboxQuerySet

# The lease states of the admin: filter value -> label, and the ShardLeaseQuerySet
# method selecting it. "expired" is a worker's lease that ran out (stuck: `abandoned()`);
# a back-off that is over is "retry due", waiting for a drain.
LEASE_STATES = {
    "held": "held",
    "backing_off": "backing off",
    "retry_due": "retry due",
    "expired": "expired",
}
LEASE_STATE_METHODS = {
    "held": "held",
    "backing_off": "backing_off",
    "retry_due": "retry_due",
    "expired": "abandoned",
}

# An integer filter value in ASCII digits, at most as many as a 64-bit column holds:
# str.isdigit() also takes "²", which int() refuses, and int() takes "٣" (Arabic-Indic).
INTEGER_VALUE = re.compile(r"-?[0-9]{1,19}")


def integer_value(value: str) -> int:
    """The integer a filter value spells; anything else raises IncorrectLookupParameters,
    which the change list answers as it does any bad lookup: it redirects to itself
    with `?e=1`."""
    if INTEGER_VALUE.fullmatch(value) is None:
        raise IncorrectLookupParameters(f"{value[:30]!r} is not an integer")
    return int(value)


class _IntegerChoiceFilter(admin.SimpleListFilter):
    """Filter an integer column by the names of the registry's members."""

    field: str

    def members(self) -> dict[int, Any]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(value), member.name) for value, member in sorted(self.members().items())]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        selected: QuerySet[Any] = queryset.filter(**{self.field: integer_value(value)})
        return selected


class ScopeFilter(_IntegerChoiceFilter):
    title = "scope"
    parameter_name = field = "shard_scope"

    def members(self) -> dict[int, Any]:
        return dict(registry.scopes)


class CategoryFilter(_IntegerChoiceFilter):
    title = "category"
    parameter_name = field = "category"

    def members(self) -> dict[int, Any]:
        return dict(registry.categories)


class LeaseStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(LEASE_STATES.items())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        state = self.value()
        if state in LEASE_STATE_METHODS:
            return getattr(queryset, LEASE_STATE_METHODS[state])()  # type: ignore[no-any-return]
        return queryset


class DeliveryStateFilter(admin.SimpleListFilter):
    """Pending rows, the failing ones among them, and dead letters (the outbox QuerySet's
    `pending()` and `dead()`)."""

    title = "delivery state"
    parameter_name = "delivery"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("pending", "pending"), ("failing", "failing (backing off)"), ("dead", "dead")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        state = self.value()
        rows = cast("OutboxQuerySet[Any]", queryset)
        if state == "pending":
            return rows.pending()
        if state == "failing":
            failing: QuerySet[Any] = rows.pending().filter(attempts__gt=0)
            return failing
        if state == "dead":
            return rows.dead()
        return queryset
