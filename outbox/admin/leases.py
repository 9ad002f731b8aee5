"""Shard leases with their state on the database clock, and the outbox dashboard page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.views.decorators.http import require_POST

import outbox.admin.bulk as bulk
from outbox.admin.base import OperatorAdmin, has_model_permission, may_view
from outbox.admin.dashboard import dashboard_tables
from outbox.admin.filters import LEASE_STATES, LeaseStateFilter, ScopeFilter
from outbox.admin.pauses import may_pause, may_resume, pause_choices, pause_or_resume
from outbox.categories import registry
from outbox.models import OutboxBase, ShardLease, ShardLeaseQuerySet, outbox_models
from outbox.models.audit import WITH_SHARD, Audit

DASHBOARD_URL_NAME = "outbox_dashboard"
PAUSE_URL_NAME = "outbox_pause"
# How often the dashboard reloads itself (a meta refresh), unless opened with ?refresh=0.
REFRESH_SECONDS = 10


@admin.register(ShardLease)
class ShardLeaseAdmin(OperatorAdmin):
    """Shards being drained (with a holder), shards backing off after a failure or whose
    back-off is over (retry due, waiting for a drain), and leases a worker left to expire
    (expired: stuck); the dashboard page of the outbox tables hangs off this admin's URLs.

    Retrying shards makes their messages due now: besides the action's own permission
    (the lease's change permission) it needs the change permission of every outbox
    table among the selected shards, and the dashboard shows only the tables the user
    may view."""

    list_display = [
        "outbox",
        "region_name",
        "scope",
        "shard_identifier",
        "state",
        "holder",
        "expires_at",
    ]
    list_filter = ["outbox", LeaseStateFilter, ScopeFilter]
    search_fields = ["=shard_identifier", "holder"]
    actions = ["lift_backoff"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[ShardLease]:
        # The state on the database clock, one Exists per state: no query per row.
        same = OuterRef("pk")
        leases: QuerySet[ShardLease] = (
            super()
            .get_queryset(request)
            .annotate(
                is_held=Exists(ShardLease.objects.held().filter(pk=same)),
                is_backing_off=Exists(ShardLease.objects.backing_off().filter(pk=same)),
                is_retry_due=Exists(ShardLease.objects.retry_due().filter(pk=same)),
            )
        )
        return leases

    @admin.display(description="scope", ordering="shard_scope")
    def scope(self, obj: ShardLease) -> str:
        return registry.scope_name(obj.shard_scope, "noted")

    @admin.display(description="state")
    def state(self, obj: ShardLease) -> str:
        if getattr(obj, "is_held", False):
            return LEASE_STATES["held"]
        if getattr(obj, "is_backing_off", False):
            return LEASE_STATES["backing_off"]
        if getattr(obj, "is_retry_due", False):
            return LEASE_STATES["retry_due"]
        return LEASE_STATES["expired"]

    @admin.action(
        description="Retry the selected shards now (lift their back-off)", permissions=["retry"]
    )
    def lift_backoff(self, request: HttpRequest, queryset: ShardLeaseQuerySet) -> None:
        refused = tables_not_changeable(request, queryset)
        if refused:
            self.message_user(request, refusal(refused), messages.ERROR)
            return
        selected, due = queryset.count(), queryset.retry_due().count()
        outcome = bulk.retry_leases(queryset.order_by(), Audit(request.user.pk, WITH_SHARD))
        held, lifted = outcome.held_shards, outcome.lifted
        text = f"{lifted} shard(s) may be retried now; {outcome.rows} message(s) due now."
        if lifted or outcome.rows:
            self.message_user(request, text, messages.SUCCESS)
        if held:
            self.message_user(
                request, f"{held} shard(s) held by a worker: left alone.", messages.WARNING
            )
        if due:
            self.message_user(
                request,
                f"{due} shard(s) whose back-off is over (retry due): nothing to lift, "
                "a drain may claim them now.",
                messages.INFO,
            )
        if selected - held - lifted - due:
            self.message_user(
                request,
                f"{selected - held - lifted - due} shard(s) not backing off (expired): "
                "nothing to lift, they may be claimed already.",
                messages.WARNING,
            )
        self.log(request, f"Retried shards: {text} {held} held left alone.", deleted=False)

    def get_urls(self) -> list[URLPattern]:
        dashboard = path(
            "dashboard/",
            self.admin_site.admin_view(self.dashboard_view),
            name=DASHBOARD_URL_NAME,
        )
        pause = path(
            "dashboard/pause/",
            self.admin_site.admin_view(require_POST(self.pause_view)),
            name=PAUSE_URL_NAME,
        )
        return [dashboard, pause, *super().get_urls()]

    def pause_view(self, request: HttpRequest) -> HttpResponseRedirect:
        """Pause or resume a part of a table (`outbox.admin.pauses`), then back to the
        dashboard."""
        pause_or_resume(request)
        return HttpResponseRedirect(reverse(f"{self.admin_site.name}:{DASHBOARD_URL_NAME}"))

    def dashboard_view(self, request: HttpRequest) -> TemplateResponse:
        tables = viewable_outboxes(request)
        if not tables:
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Outbox dashboard",
            "opts": self.model._meta,
            "tables": dashboard_tables(tables, self.admin_site.name),
            "lease_changelist": reverse(f"{self.admin_site.name}:outbox_shardlease_changelist"),
            "pause_url": reverse(f"{self.admin_site.name}:{PAUSE_URL_NAME}"),
            "may_pause": may_pause(request),
            "may_resume": may_resume(request),
            "pause_choices": pause_choices(),
            # ?refresh=0 turns the page's own refresh off.
            "refresh_seconds": 0 if request.GET.get("refresh") == "0" else REFRESH_SECONDS,
        }
        return TemplateResponse(request, "admin/outbox/dashboard.html", context)


def tables_not_changeable(request: HttpRequest, leases: ShardLeaseQuerySet) -> list[str]:
    """The outbox tables of `leases` (their labels, as the lease list shows them) whose
    messages the user may not change."""
    labels = leases.order_by().values_list("outbox", flat=True).distinct()
    return sorted(
        label
        for label in labels
        if not has_model_permission(request, "change", apps.get_model(label))
    )


def refusal(labels: list[str]) -> str:
    """Why a retry of shards did nothing: the whole selection is refused, as Django's
    "delete selected" is when some of what it would delete is not the user's to delete."""
    return (
        f"Nothing was retried: you may not change the messages of {', '.join(labels)}, "
        "and retrying a shard makes its messages due now. Select only the shards of "
        "tables you may change (filter by outbox) and run the action again."
    )


def viewable_outboxes(request: HttpRequest) -> list[type[OutboxBase]]:
    """The outbox tables the user may view (the view or change permission on that model):
    the only ones whose figures, worst shards and errors the dashboard shows."""
    return [model for model in outbox_models() if may_view(request, model)]


def can_view_dashboard(request: HttpRequest) -> bool:
    """Staff who may view an outbox table may view the dashboard (of those tables)."""
    return bool(viewable_outboxes(request))


def link_dashboard(site: AdminSite) -> None:
    """List the dashboard first in the outbox app on the admin index and sidebar.

    The admin index lists registered models only; this wraps the site's
    `get_app_list` (on this site instance only) to add one entry for the page."""
    build_app_list: Callable[..., list[dict[str, Any]]] = site.get_app_list

    def get_app_list(request: HttpRequest, app_label: str | None = None) -> list[dict[str, Any]]:
        app_list = build_app_list(request, app_label)
        for app in app_list:
            if app["app_label"] == "outbox" and can_view_dashboard(request):
                app["models"].insert(0, _dashboard_entry(site))
        return app_list

    site.get_app_list = get_app_list  # type: ignore[method-assign]


def _dashboard_entry(site: AdminSite) -> dict[str, Any]:
    return {
        "name": "Dashboard",
        "object_name": "Dashboard",
        "admin_url": reverse(f"{site.name}:{DASHBOARD_URL_NAME}"),
        "add_url": None,
        "view_only": True,
        "perms": {"view": True},
        "model": None,
    }
