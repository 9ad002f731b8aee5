"""Receivers of every category. Each must be idempotent: delivery is at least once.

Mirrors are upserts of the newest payload (a replay writes the same row again); deletions
arrive as a None payload. The audit export is a transactional receiver, so its row commits
together with the outbox delete and exists exactly once per event.
"""

from __future__ import annotations

from typing import Any

from accounts.billing import billing_api
from accounts.models import OrganizationMirror, ProjectMirror, UserMirror, WebhookCall
from accounts.outboxes import Category
from outbox import transactional_receiver
from outbox.signals import process_control_outbox, process_region_outbox

AUDIT_SINK = "audit-sink"

Payload = dict[str, Any] | None


def sync_organization(
    sender: Category, object_identifier: int, payload: Payload, **kwargs: Any
) -> None:
    """Upsert (or delete, with its projects) the control silo's copy of an organization."""
    if payload is None:
        OrganizationMirror.objects.filter(id=object_identifier).delete()
        return
    OrganizationMirror.objects.update_or_create(id=object_identifier, defaults=payload)


def notify_billing(
    sender: Category, object_identifier: int, payload: Payload, **kwargs: Any
) -> None:
    """Push the organization to billing; raises during an outage, and is retried.

    It runs after `sync_organization`, so a retry upserts the mirror again: harmless.
    """
    billing_api.push_organization(object_identifier, payload)


def sync_project(sender: Category, object_identifier: int, payload: Payload, **kwargs: Any) -> None:
    """Upsert or delete the control silo's copy of a project.

    Projects share their organization's shard, so an organization's messages and its
    projects' are delivered in order. A missing organization mirror therefore means the
    organization was deleted, and the project went with it.
    """
    if payload is None:
        ProjectMirror.objects.filter(id=object_identifier).delete()
        return
    if not OrganizationMirror.objects.filter(id=payload["organization_id"]).exists():
        return
    ProjectMirror.objects.update_or_create(id=object_identifier, defaults=payload)


def export_audit_event(sender: Category, payload: Payload, **kwargs: Any) -> None:
    """Append the event to the audit sink, inside the transaction that retires its row."""
    assert payload is not None
    WebhookCall.objects.create(endpoint=AUDIT_SINK, object_id=payload["entry_id"], payload=payload)


def replicate_user(
    sender: Category, object_identifier: int, region_name: str, payload: Payload, **kwargs: Any
) -> None:
    """Upsert or delete the user's copy in the region the message is addressed to."""
    mirrors = UserMirror.objects.filter(region=region_name, user_id=object_identifier)
    if payload is None:
        mirrors.delete()
        return
    UserMirror.objects.update_or_create(
        region=region_name, user_id=object_identifier, defaults=payload
    )


def connect_receivers() -> None:
    """Connect every receiver (idempotent: dispatch_uid guards against double connects)."""
    region = process_region_outbox
    # Receivers of one category run in connection order: mirror first, then billing.
    region.connect(
        sync_organization, sender=Category.ORGANIZATION_UPDATE, dispatch_uid="accounts.org"
    )
    region.connect(
        notify_billing, sender=Category.ORGANIZATION_UPDATE, dispatch_uid="accounts.billing"
    )
    region.connect(sync_project, sender=Category.PROJECT_UPDATE, dispatch_uid="accounts.project")
    # The audit sink lives on the outbox's own database ("default"): exactly-once export.
    transactional_receiver(region, sender=Category.AUDIT_LOG_EVENT, dispatch_uid="accounts.audit")(
        export_audit_event
    )
    process_control_outbox.connect(
        replicate_user, sender=Category.USER_UPDATE, dispatch_uid="accounts.user"
    )
