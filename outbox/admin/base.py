"""What every outbox admin shares: who may act (permissions checked per outbox model),
and the admin log of what was done."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth import get_permission_codename
from django.contrib.contenttypes.models import ContentType
from django.db.models import Model
from django.http import HttpRequest

from outbox.admin.bulk import MAX_KEYS, Outcome


def has_model_permission(request: HttpRequest, action: str, model: type[Model]) -> bool:
    """Whether the user has Django's `action` permission ("view", "change", "delete") on
    `model`: each outbox table's rows are shown and acted on under that table's own
    permissions, whichever admin page shows them."""
    opts = model._meta
    return request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")


def may_view(request: HttpRequest, model: type[Model]) -> bool:
    """Django's view permission on `model`: its view or its change permission."""
    return has_model_permission(request, "view", model) or has_model_permission(
        request, "change", model
    )


class OperatorAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Rows are the engine's: nobody adds, edits or deletes one through a form, so the
    add, change and delete permissions of the admin are always False (one row's page
    is read-only, Django's "delete selected" action is never offered).

    Operators act through actions with their own permissions, which Django checks with
    `has_<name>_permission` for an action's `permissions=[...]`: "retry" needs the
    model's change permission, "discard" its delete permission. A view-only user is
    offered no action, and Django's changelist ignores a posted action it does not offer.
    """

    # A model field shown on one row's page by a read-only display method instead, in
    # its place (e.g. a scope's number by its name): {field: method}.
    shown_as: dict[str, str] = {}

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [*super().get_readonly_fields(request, obj), *self.shown_as.values()]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        shown: list[Any] = []
        for field in super().get_fields(request, obj):
            field = self.shown_as.get(field, field) if isinstance(field, str) else field
            if field not in shown:  # each once, where its field was
                shown.append(field)
        return shown

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self._has_model_permission(request, "change")

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return self._has_model_permission(request, "delete")

    def _has_model_permission(self, request: HttpRequest, action: str) -> bool:
        return has_model_permission(request, action, self.model)

    def report(self, request: HttpRequest, did: str, outcome: Outcome, *, deleted: bool) -> None:
        """Tell the operator what an action did, and write it to the admin log."""
        held, capped = outcome.held_shards, outcome.capped
        text = f"{did}: {outcome.rows} message(s)"
        if not deleted or outcome.lifted:
            text += f", {outcome.lifted} back-off(s) lifted"
        if held:
            text += f"; {held} shard(s) held by a worker left alone"
        self.message_user(request, f"{text}.", messages.SUCCESS)
        if held:
            self.message_user(
                request,
                f"{held} shard(s) held by a worker right now: left alone. "
                "Retry once it has finished with them.",
                messages.WARNING,
            )
        if capped:
            self.message_user(
                request,
                f"Only the first {MAX_KEYS} shards or groups were handled: "
                "run the action again for the rest.",
                messages.WARNING,
            )
        self.log(request, f"{text}{' (capped)' if capped else ''}.", deleted=deleted)

    def log(self, request: HttpRequest, text: str, *, deleted: bool) -> None:
        """One admin log entry per action, naming the table and what was done (a
        select-all may cover many rows: no entry per row)."""
        content_type = ContentType.objects.get_for_model(self.model, for_concrete_model=False)
        LogEntry.objects.create(
            user_id=request.user.pk,
            content_type=content_type,
            object_id=None,
            object_repr=f"{self.model._meta.verbose_name_plural}"[:200],
            action_flag=DELETION if deleted else CHANGE,
            change_message=text,
        )
