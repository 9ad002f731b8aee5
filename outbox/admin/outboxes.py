"""The messages of each outbox table, by name, with retry and discard actions; their dead
letters by cause on a page of their own (`outbox.admin.dead_letter_causes`)."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

import outbox.admin.bulk as bulk
from outbox.admin.dead_letter_causes import DeadLetterCausesAdmin
from outbox.admin.filters import CategoryFilter, DeliveryStateFilter, ScopeFilter
from outbox.categories import registry
from outbox.models import ControlOutbox, OutboxBase, RegionOutbox
from outbox.models.audit import WITH_GROUP, WITH_SHARD, Audit

Rows = QuerySet[Any]


class OutboxAdmin(DeadLetterCausesAdmin):
    list_display = [
        "id",
        "message_id",
        "scope",
        "shard_identifier",
        "category_name",
        "object_identifier",
        "delivery_state",
        "attempts",
        "backoff",
        "short_error",
    ]
    list_filter = [DeliveryStateFilter, ScopeFilter, CategoryFilter, "attempts"]
    search_fields = ["=shard_identifier", "=object_identifier"]
    search_help_text = "A shard or object identifier, or a message id."
    # The message id and the write time are not form fields (editable=False): named
    # here so that one row's page shows them.
    readonly_fields = ["message_id", "date_added"]
    # One row's page names the scope and the category, with their values.
    shown_as = {"shard_scope": "scope_shown", "category": "category_shown"}
    ordering = ["id"]
    actions = [
        "retry_messages",
        "retry_groups",
        "retry_shards",
        "discard_messages",
        "discard_groups",
    ]

    def get_search_results(
        self, request: HttpRequest, queryset: Rows, search_term: str
    ) -> tuple[Rows, bool]:
        """A message id (as receivers and logs show it) finds its row; any other term
        searches the identifiers."""
        try:
            message_id = uuid.UUID(search_term.strip())
        except ValueError:
            return super().get_search_results(request, queryset, search_term)
        return queryset.filter(message_id=message_id), False

    @admin.display(description="scope", ordering="shard_scope")
    def scope(self, obj: OutboxBase) -> str:
        return registry.scope_name(obj.shard_scope, "noted")

    @admin.display(description="category", ordering="category")
    def category_name(self, obj: OutboxBase) -> str:
        return registry.category_name(obj.category, "noted")

    @admin.display(description="shard scope")
    def scope_shown(self, obj: OutboxBase) -> str:
        return registry.scope_name(obj.shard_scope, "labelled")

    @admin.display(description="category")
    def category_shown(self, obj: OutboxBase) -> str:
        return registry.category_name(obj.category, "labelled")

    @admin.display(description="state")
    def delivery_state(self, obj: OutboxBase) -> str:
        if getattr(obj, "dead_at", None) is not None:
            return "dead"
        return "failing" if obj.attempts else "pending"

    @admin.display(description="scheduled for", ordering="scheduled_for")
    def backoff(self, obj: OutboxBase) -> str:
        """When the row is due, and for a failed row the back-off it is waiting out
        (from `scheduled_from`, the time that schedule was set), in the current time zone
        as the admin shows every other time."""
        due = timezone.localtime(obj.scheduled_for) if settings.USE_TZ else obj.scheduled_for
        if not obj.attempts:
            return f"{due:%Y-%m-%d %H:%M:%S}"
        waited = (due - obj.scheduled_from).total_seconds()
        return f"{due:%Y-%m-%d %H:%M:%S} (back-off {waited:.0f}s)"

    @admin.display(description="last error")
    def short_error(self, obj: OutboxBase) -> str:
        return obj.last_error[:120]

    @admin.action(description="Retry the selected messages now", permissions=["retry"])
    def retry_messages(self, request: HttpRequest, queryset: Rows) -> None:
        outcome = bulk.retry_rows(queryset, Audit(request.user.pk))
        self.report(request, "Retried now", outcome, deleted=False)

    @admin.action(
        description="Retry the selected messages' coalescing groups now", permissions=["retry"]
    )
    def retry_groups(self, request: HttpRequest, queryset: Rows) -> None:
        fields = bulk.group_fields(queryset.model)
        outcome = bulk.retry_keys(queryset, fields, Audit(request.user.pk, WITH_GROUP))
        self.report(request, "Retried their groups now", outcome, deleted=False)

    @admin.action(description="Retry the selected messages' shards now", permissions=["retry"])
    def retry_shards(self, request: HttpRequest, queryset: Rows) -> None:
        audit = Audit(request.user.pk, WITH_SHARD)
        outcome = bulk.retry_keys(queryset, queryset.model.shard_fields, audit)
        self.report(request, "Retried their shards now", outcome, deleted=False)

    @admin.action(description="Discard the selected messages", permissions=["discard"])
    def discard_messages(self, request: HttpRequest, queryset: Rows) -> None:
        outcome = bulk.discard_rows(queryset, Audit(request.user.pk))
        self.report(request, "Discarded", outcome, deleted=True)

    @admin.action(
        description="Discard the selected messages' coalescing groups", permissions=["discard"]
    )
    def discard_groups(self, request: HttpRequest, queryset: Rows) -> None:
        audit = Audit(request.user.pk, WITH_GROUP)
        outcome = bulk.discard_keys(queryset, bulk.group_fields(queryset.model), audit)
        self.report(request, "Discarded their groups", outcome, deleted=True)


@admin.register(RegionOutbox)
class RegionOutboxAdmin(OutboxAdmin):
    pass


@admin.register(ControlOutbox)
class ControlOutboxAdmin(OutboxAdmin):
    list_display = ["id", "region_name", *OutboxAdmin.list_display[1:]]
    list_filter = ["region_name", *OutboxAdmin.list_filter]
