"""Pausing and resuming from the dashboard: a scope, a shard or a category of one outbox
table (`outbox.models.pause`), by a POST from the dashboard's forms (a scope's button on
its line; per table, a form for a shard, by scope, identifier and region, and one for a
category, offering the declared scopes and categories by name: `pause_choices`).

Who may: a user who may view the table (as the dashboard shows it) and has the pause
model's own permission: `outbox.add_outboxpause` to pause, `outbox.delete_outboxpause`
to resume. Anything else, a forged POST included, is refused with 403 and changes
nothing. Each pause and resume writes one admin log entry (`record_pause`), in the
transaction that makes the change.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import BadRequest, PermissionDenied
from django.db import router, transaction
from django.http import HttpRequest

from outbox.admin.base import has_model_permission, may_view
from outbox.backends.select import notify_listeners
from outbox.categories import registry
from outbox.exceptions import InvalidOutboxMessage
from outbox.models import OutboxBase, OutboxPause, PausedPart, outbox_models
from outbox.models.audit import record_pause
from outbox.models.pause import pause, resume


def may_pause(request: HttpRequest) -> bool:
    return has_model_permission(request, "add", OutboxPause)


def may_resume(request: HttpRequest) -> bool:
    return has_model_permission(request, "delete", OutboxPause)


def pause_choices() -> dict[str, list[tuple[int, str]]]:
    """The scopes and categories the dashboard's pause forms offer: (value, name)."""
    return {
        "scopes": [(value, registry.scope_name(value)) for value in sorted(registry.scopes)],
        "categories": [
            (value, registry.category_name(value)) for value in sorted(registry.categories)
        ],
    }


def pause_or_resume(request: HttpRequest) -> None:
    """Apply the dashboard's POST (`action` pause or resume, `table`, `scope` and
    optionally `shard`, `region`, `category`, `reason`), or raise PermissionDenied."""
    action = request.POST.get("action")
    allowed = {"pause": may_pause, "resume": may_resume}.get(action or "")
    model = _table(request)
    if allowed is None or model is None or not allowed(request):
        raise PermissionDenied
    part = _part(request)
    using = router.db_for_write(model)
    with transaction.atomic(using=using):
        if action == "pause":
            reason = request.POST.get("reason", "")[:255]
            user = request.user.get_username()
            made, new = pause(model, part, using=using, paused_by=user, reason=reason)
            if new:
                record_pause(request.user.pk, made, resumed=False)
            done = f"{part} of {model._meta.label} paused" if new else f"{part} was paused already"
        else:
            found = resume(model, part, using=using)
            for resumed in found:
                record_pause(request.user.pk, resumed, resumed=True)
            if found:
                notify_listeners(model, using)  # idle loops look again at once
            done = (
                f"{part} of {model._meta.label} resumed: its messages are delivered again, "
                "in order, from where they stopped"
                if found
                else f"{part} was not paused"
            )
    messages.success(request, f"{done[0].upper()}{done[1:]}.")


def _table(request: HttpRequest) -> type[OutboxBase] | None:
    """The outbox table the POST names, if the user may view it."""
    label = request.POST.get("table", "")
    for model in outbox_models():
        if model._meta.label_lower == label.lower() and may_view(request, model):
            return model
    return None


def _part(request: HttpRequest) -> PausedPart:
    """The part the POST names; a malformed one is a bad request."""
    try:
        category = request.POST.get("category")
        if category:
            return PausedPart.of_category(int(category))
        scope = int(request.POST["scope"])
        shard = request.POST.get("shard")
        region = request.POST.get("region") or None
        return PausedPart(scope, int(shard) if shard else None, region if shard else None)
    except (KeyError, ValueError, InvalidOutboxMessage) as exc:
        raise BadRequest("No scope, shard or category of the outboxes named.") from exc
