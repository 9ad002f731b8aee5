"""Admin views of the backlog, of failing messages and of shard leases, with retry actions."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Exists, OuterRef, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest

from outbox.categories import registry
from outbox.models import (
    ControlOutbox,
    OutboxBase,
    RegionOutbox,
    ShardLease,
    ShardLeaseQuerySet,
)

# The lease states of the admin, by their ShardLeaseQuerySet method.
LEASE_STATES = {"held": "held", "backing_off": "backing off", "expired": "expired"}


def _name(lookup: dict[int, Any], value: int) -> str:
    member = lookup.get(value)
    return member.name if member is not None else str(value)


class OutboxAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = [
        "id",
        "scope",
        "shard_identifier",
        "category_name",
        "object_identifier",
        "attempts",
        "backoff",
        "short_error",
    ]
    list_filter = ["shard_scope", "category", "attempts"]
    search_fields = ["=shard_identifier", "=object_identifier"]
    ordering = ["id"]
    actions = ["retry_now"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="scope", ordering="shard_scope")
    def scope(self, obj: OutboxBase) -> str:
        return _name(registry.scopes, obj.shard_scope)

    @admin.display(description="category", ordering="category")
    def category_name(self, obj: OutboxBase) -> str:
        return _name(registry.categories, obj.category)

    @admin.display(description="scheduled for", ordering="scheduled_for")
    def backoff(self, obj: OutboxBase) -> str:
        """When the row is due, and for a failed row the back-off it is waiting out
        (from `scheduled_from`, the time that schedule was set)."""
        due = obj.scheduled_for
        if not obj.attempts:
            return f"{due:%Y-%m-%d %H:%M:%S}"
        waited = (due - obj.scheduled_from).total_seconds()
        return f"{due:%Y-%m-%d %H:%M:%S} (back-off {waited:.0f}s)"

    @admin.display(description="last error")
    def short_error(self, obj: OutboxBase) -> str:
        return obj.last_error[:120]

    @admin.action(description="Retry the selected messages' shards now")
    def retry_now(self, request: HttpRequest, queryset: QuerySet[OutboxBase]) -> None:
        """Make the selected rows due now and lift their shards' back-off. A shard that a
        worker holds right now is left alone: its holder settles it."""
        model = queryset.model
        leases = ShardLease.objects.using(queryset.db).of(model)
        keys = {row.shard_key for row in queryset}
        held = {key for key in keys if leases.of_shard(key).held().exists()}
        rows = lifted = 0
        for key in keys - held:
            rows += queryset.filter(**model.shard_lookup(key)).update(scheduled_for=Now())
            lifted += leases.of_shard(key).backing_off().delete()[0]
        if keys - held:
            self.message_user(
                request,
                f"{rows} message(s) in {len(keys - held)} shard(s) due now; "
                f"{lifted} back-off(s) lifted.",
                messages.SUCCESS,
            )
        if held:
            self.message_user(
                request,
                f"{len(held)} shard(s) held by a worker right now: left alone. "
                "Retry once it has finished with them.",
                messages.WARNING,
            )


@admin.register(RegionOutbox)
class RegionOutboxAdmin(OutboxAdmin):
    pass


@admin.register(ControlOutbox)
class ControlOutboxAdmin(OutboxAdmin):
    list_display = ["id", "region_name", *OutboxAdmin.list_display[1:]]
    list_filter = ["region_name", *OutboxAdmin.list_filter]


class LeaseStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(LEASE_STATES.items())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        state = self.value()
        if state in LEASE_STATES:
            return getattr(queryset, state)()  # type: ignore[no-any-return]
        return queryset


@admin.register(ShardLease)
class ShardLeaseAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Shards being drained (with a holder) and shards backing off after a failure."""

    list_display = [
        "outbox",
        "region_name",
        "shard_scope",
        "shard_identifier",
        "state",
        "holder",
        "expires_at",
    ]
    list_filter = ["outbox", LeaseStateFilter, "shard_scope"]
    search_fields = ["=shard_identifier", "holder"]
    actions = ["lift_backoff"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[ShardLease]:
        # The state on the database clock, one Exists per state: no query per row.
        same = OuterRef("pk")
        leases: QuerySet[ShardLease] = (
            super()
            .get_queryset(request)
            .annotate(
                is_held=Exists(ShardLease.objects.held().filter(pk=same)),
                is_backing_off=Exists(ShardLease.objects.backing_off().filter(pk=same)),
            )
        )
        return leases

    @admin.display(description="state")
    def state(self, obj: ShardLease) -> str:
        if getattr(obj, "is_held", False):
            return LEASE_STATES["held"]
        if getattr(obj, "is_backing_off", False):
            return LEASE_STATES["backing_off"]
        return LEASE_STATES["expired"]

    @admin.action(description="Lift the back-off of the selected shards (retry now)")
    def lift_backoff(self, request: HttpRequest, queryset: ShardLeaseQuerySet) -> None:
        selected = queryset.count()
        held = queryset.held().count()
        lifted = queryset.backing_off().delete()[0]
        if lifted:
            self.message_user(request, f"{lifted} shard(s) may be retried now.", messages.SUCCESS)
        if held:
            self.message_user(
                request, f"{held} shard(s) held by a worker: left alone.", messages.WARNING
            )
        if selected - held - lifted:
            self.message_user(
                request,
                f"{selected - held - lifted} shard(s) not backing off (expired): "
                "nothing to lift, they may be claimed already.",
                messages.WARNING,
            )
