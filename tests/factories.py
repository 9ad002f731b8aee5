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
