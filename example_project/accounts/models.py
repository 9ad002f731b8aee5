"""The example's models.

Region silo ("default" database): Organization, Project and AuditLogEntry produce
RegionOutbox messages; UserMirror and WebhookCall are written by receivers.
Control silo ("control" database): UserAccount produces ControlOutbox messages for its
region; OrganizationMirror and ProjectMirror are written by receivers.

Every producer emits exactly one message per changed object, whose payload is the
object's whole current state (None once deleted), so a receiver only needs the newest one.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from accounts.outboxes import Category, Scope
from outbox import unique_object_identifier
from outbox.models import ControlOutbox, OutboxBase, RegionOutbox
from outbox.writes.producers import OutboxProducer

REGIONS = ("us", "eu")


class Organization(OutboxProducer):
    """A customer organization; its state is mirrored to the control silo and billing."""

    class Plan(models.TextChoices):
        FREE = "free"
        TEAM = "team"
        BUSINESS = "business"

    name = models.CharField(max_length=100)
    plan = models.CharField(max_length=20, choices=Plan.choices, default=Plan.FREE)
    version = models.PositiveIntegerField(default=1)

    def __str__(self) -> str:
        return self.name

    def state(self) -> dict[str, Any]:
        return {"name": self.name, "plan": self.plan, "version": self.version}

    def outboxes_for_update(self) -> list[OutboxBase]:
        return [self._message(self.state())]

    def outboxes_for_delete(self) -> list[OutboxBase]:
        # Projects deleted by the cascade send nothing: receivers drop them with the org.
        return [self._message(None)]

    def _message(self, payload: dict[str, Any] | None) -> RegionOutbox:
        return RegionOutbox(
            shard_scope=Scope.ORGANIZATION,
            shard_identifier=self.id,
            category=Category.ORGANIZATION_UPDATE,
            object_identifier=self.id,
            payload=payload,
        )


class Project(OutboxProducer):
    """A project of an organization; its messages share the organization's shard."""

    class Status(models.TextChoices):
        ACTIVE = "active"
        ARCHIVED = "archived"

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.ACTIVE)
    version = models.PositiveIntegerField(default=1)

    def __str__(self) -> str:
        return self.name

    def state(self) -> dict[str, Any]:
        return {
            "organization_id": self.organization_id,
            "name": self.name,
            "status": self.status,
            "version": self.version,
        }

    def outboxes_for_update(self) -> list[OutboxBase]:
        return [self._message(self.state())]

    def outboxes_for_delete(self) -> list[OutboxBase]:
        return [self._message(None)]

    def _message(self, payload: dict[str, Any] | None) -> RegionOutbox:
        return RegionOutbox(
            shard_scope=Scope.ORGANIZATION,
            # Keyed by organization: a project is delivered in order with its organization.
            shard_identifier=self.organization_id,
            category=Category.PROJECT_UPDATE,
            object_identifier=self.id,
            payload=payload,
        )


class AuditLogEntry(OutboxProducer):
    """An append-only audit event, exported once to the audit sink.

    `organization_id` is a plain id, not a foreign key: the log outlives the organization.
    """

    organization_id = models.BigIntegerField(db_index=True)
    event = models.CharField(max_length=50)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "audit log entries"

    def __str__(self) -> str:
        return f"{self.event} #{self.pk}"

    def outboxes_for_update(self) -> list[OutboxBase]:
        return [
            RegionOutbox(
                shard_scope=Scope.ORGANIZATION,
                shard_identifier=self.organization_id,
                category=Category.AUDIT_LOG_EVENT,
                # A fresh identifier per message: audit events must never coalesce.
                object_identifier=unique_object_identifier(),
                payload={
                    "entry_id": self.id,
                    "organization_id": self.organization_id,
                    "event": self.event,
                    "data": self.data,
                    "created_at": self.created_at.isoformat(),
                },
            )
        ]


class UserAccount(OutboxProducer):
    """A user, owned by the control silo and replicated to the user's home region."""

    email = models.EmailField()
    name = models.CharField(max_length=100)
    region = models.CharField(max_length=48, choices=[(r, r) for r in REGIONS])
    version = models.PositiveIntegerField(default=1)

    def __str__(self) -> str:
        return self.email

    def state(self) -> dict[str, Any]:
        return {"email": self.email, "name": self.name, "version": self.version}

    def outboxes_for_update(self) -> list[OutboxBase]:
        return [self._message(self.state())]

    def outboxes_for_delete(self) -> list[OutboxBase]:
        return [self._message(None)]

    def _message(self, payload: dict[str, Any] | None) -> ControlOutbox:
        return ControlOutbox(
            region_name=self.region,
            shard_scope=Scope.USER,
            shard_identifier=self.id,
            category=Category.USER_UPDATE,
            object_identifier=self.id,
            payload=payload,
        )


class OrganizationMirror(models.Model):
    """The control silo's copy of an organization (same id), kept by a receiver."""

    id = models.BigIntegerField(primary_key=True)
    name = models.CharField(max_length=100)
    plan = models.CharField(max_length=20)
    version = models.PositiveIntegerField()

    def __str__(self) -> str:
        return self.name

    def state(self) -> dict[str, Any]:
        return {"name": self.name, "plan": self.plan, "version": self.version}


class ProjectMirror(models.Model):
    """The control silo's copy of a project; goes away with its organization's mirror."""

    id = models.BigIntegerField(primary_key=True)
    organization = models.ForeignKey(OrganizationMirror, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    status = models.CharField(max_length=20)
    version = models.PositiveIntegerField()

    def __str__(self) -> str:
        return self.name

    def state(self) -> dict[str, Any]:
        return {
            "organization_id": self.organization_id,
            "name": self.name,
            "status": self.status,
            "version": self.version,
        }


class UserMirror(models.Model):
    """A region's copy of a user account, kept by a receiver of the control outbox."""

    region = models.CharField(max_length=48)
    user_id = models.BigIntegerField()
    email = models.EmailField()
    name = models.CharField(max_length=100)
    version = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["region", "user_id"], name="usermirror_region_user")
        ]

    def __str__(self) -> str:
        return f"{self.email} ({self.region})"

    def state(self) -> dict[str, Any]:
        return {"email": self.email, "name": self.name, "version": self.version}


class WebhookCall(models.Model):
    """A call that reached a (fake) external endpoint: billing or the audit sink."""

    endpoint = models.CharField(max_length=50)
    object_id = models.BigIntegerField()
    payload = models.JSONField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["endpoint", "object_id"], name="webhookcall_target")]

    def __str__(self) -> str:
        return f"{self.endpoint} {self.object_id}"
