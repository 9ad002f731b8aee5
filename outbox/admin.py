"""Admin views of the backlog, of failing messages and of shard leases, with retry actions."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest

from outbox.categories import registry
from outbox.models import ControlOutbox, OutboxBase, RegionOutbox, ShardLease


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
        "scheduled_for",
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

    @admin.display(description="last error")
    def short_error(self, obj: OutboxBase) -> str:
        return obj.last_error[:120]

    @admin.action(description="Retry the selected messages' shards now")
    def retry_now(self, request: HttpRequest, queryset: QuerySet[OutboxBase]) -> None:
        """Make the rows due now and lift their shards' back-off (leases held stay)."""
        model = queryset.model
        keys = {row.shard_key for row in queryset}
        queryset.update(scheduled_for=Now())
        backing_off = ShardLease._default_manager.using(queryset.db).filter(
            outbox=model._meta.label_lower, token__isnull=True
        )
        lifted = 0
        for key in keys:
            lifted += backing_off.filter(
                region_name=key.region_name,
                shard_scope=key.shard_scope,
                shard_identifier=key.shard_identifier,
            ).delete()[0]
        self.message_user(
            request, f"{len(keys)} shard(s) due now; {lifted} back-off(s) lifted.", messages.SUCCESS
        )


@admin.register(RegionOutbox)
class RegionOutboxAdmin(OutboxAdmin):
    pass


@admin.register(ControlOutbox)
class ControlOutboxAdmin(OutboxAdmin):
    list_display = ["id", "region_name", *OutboxAdmin.list_display[1:]]
    list_filter = ["region_name", *OutboxAdmin.list_filter]


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
    list_filter = ["outbox", "shard_scope"]
    search_fields = ["=shard_identifier", "holder"]
    actions = ["lift_backoff"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="state")
    def state(self, obj: ShardLease) -> str:
        return "held" if obj.token else "backing off"

    @admin.action(description="Lift the back-off of the selected shards (retry now)")
    def lift_backoff(self, request: HttpRequest, queryset: QuerySet[ShardLease]) -> None:
        lifted = queryset.filter(token__isnull=True).delete()[0]
        self.message_user(request, f"{lifted} shard(s) may be retried now.", messages.SUCCESS)
