"""A page per outbox table of its dead letters grouped by cause (receiver, exception type,
normalised message: `outbox.models.causes`), with a retry and a discard per cause.

The page is reachable from the table's change list. Viewing it needs the permission to
view the table; a cause's retry and discard need what the change list's actions need
("retry": the change permission, "discard": the delete permission), and go through the
same `outbox.admin.bulk` functions and the same report and admin log. One click handles
up to `MAX_CAUSE_ROWS` dead letters, so that a request stays short; the page says when
some are left for another click.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

import outbox.admin.bulk as bulk
from outbox.admin.base import OperatorAdmin
from outbox.models import OutboxQuerySet
from outbox.models.audit import BY_CAUSE, Audit
from outbox.models.causes import is_cause_key
from outbox.models.dead_letter_groups import cause_ids, group_dead_letters, in_slices

MAX_CAUSE_ROWS = 10_000
VERBS = {"retry": "Retried", "discard": "Discarded"}


class DeadLetterCausesAdmin(OperatorAdmin):
    """The dead letters by cause page of an outbox table's admin, and its actions."""

    change_list_template = "admin/outbox/outbox_change_list.html"

    def get_urls(self) -> list[URLPattern]:
        causes = path(
            "dead-letters/causes/",
            self.admin_site.admin_view(self.causes_view),
            name=url_name(self.opts, "causes"),
        )
        return [causes, *super().get_urls()]

    def causes_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            return self.act_on_cause(request)
        grouping = group_dead_letters(self.rows(request))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Dead letters of {self.opts.verbose_name_plural} by cause",
            "opts": self.opts,
            "grouping": grouping,
            "can_retry": self.has_retry_permission(request),
            "can_discard": self.has_discard_permission(request),
            "changelist": self._reverse("changelist"),
        }
        return TemplateResponse(request, "admin/outbox/dead_letter_causes.html", context)

    def act_on_cause(self, request: HttpRequest) -> HttpResponse:
        """Retry or discard the dead letters of the posted cause, then back to the page."""
        verb, key = request.POST.get("verb", ""), request.POST.get("cause", "")
        allowed = {"retry": self.has_retry_permission, "discard": self.has_discard_permission}
        if verb not in allowed or not allowed[verb](request):
            raise PermissionDenied
        page = self._reverse("causes")
        if not is_cause_key(key):
            self.message_user(request, f"{key!r} is not a cause.", messages.ERROR)
            return HttpResponseRedirect(page)
        rows = self.rows(request)
        ids = cause_ids(rows, {key}, limit=MAX_CAUSE_ROWS + 1)
        if not ids:
            self.message_user(request, f"No dead letter of cause {key} left.", messages.WARNING)
            return HttpResponseRedirect(page)
        act = bulk.retry_rows if verb == "retry" else bulk.discard_rows
        audit = Audit(request.user.pk, f"{BY_CAUSE} {key}")
        outcome = bulk.Outcome()
        for selected in in_slices(rows, ids[:MAX_CAUSE_ROWS]):
            outcome += act(selected, audit)
        did = f"{VERBS[verb]} the dead letters of cause {key}"
        self.report(request, did, outcome, deleted=verb == "discard")
        if len(ids) > MAX_CAUSE_ROWS:
            self.message_user(
                request,
                f"Only the first {MAX_CAUSE_ROWS} dead letters of cause {key} were handled: "
                "do it again for the rest.",
                messages.WARNING,
            )
        return HttpResponseRedirect(page)

    def rows(self, request: HttpRequest) -> OutboxQuerySet[Any]:
        return cast("OutboxQuerySet[Any]", self.get_queryset(request))

    def _reverse(self, view: str) -> str:
        return reverse(f"{self.admin_site.name}:{url_name(self.opts, view)}")


def url_name(opts: Any, view: str) -> str:
    """The URL name of one of a table's admin views in the admin site's namespace: the
    dead letters by cause page of RegionOutbox is `outbox_regionoutbox_causes`."""
    return f"{opts.app_label}_{opts.model_name}_{view}"
