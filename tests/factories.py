import factory

from outbox.models import ControlOutbox, RegionOutbox
from tests.testapp.categories import Category, Scope


class RegionOutboxFactory(factory.django.DjangoModelFactory):
    """A region message; outside outbox_context it is left for the drain."""

    class Meta:
        model = RegionOutbox

    shard_scope = Scope.ORGANIZATION
    shard_identifier = 1
    category = Category.AUDIT_EVENT
    object_identifier = factory.Sequence(lambda n: n)
    payload = factory.Sequence(lambda n: {"n": n})


class ControlOutboxFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ControlOutbox

    region_name = "us"
    shard_scope = Scope.USER
    shard_identifier = 1
    category = Category.USER_UPDATE
    object_identifier = factory.Sequence(lambda n: n)
    payload = factory.Sequence(lambda n: {"n": n})


def failed_region_row(shard_identifier, *, backoff_minutes=5, **fields):
    """A region row as the engine leaves it after a failed delivery: an attempt, an
    error, due after its back-off, and its shard's back-off lease (no holder)."""
    from datetime import timedelta

    from django.utils import timezone

    from outbox.models import ShardLease

    due = timezone.now() + timedelta(minutes=backoff_minutes)
    fields = {"attempts": 1, "last_error": "RuntimeError: receiver failed", **fields}
    row = RegionOutboxFactory(shard_identifier=shard_identifier, scheduled_for=due, **fields)
    ShardLease.objects.update_or_create(
        outbox="outbox.regionoutbox",
        shard_scope=row.shard_scope,
        shard_identifier=shard_identifier,
        defaults={"token": None, "expires_at": due},
    )
    return row
