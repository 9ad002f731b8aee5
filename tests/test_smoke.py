import pytest
from django.db import transaction

from outbox import outbox_context
from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox
from tests.testapp.categories import Category, Scope
from tests.testapp.models import Organization

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def test_save_flushes_after_commit(clean_recorder):
    with outbox_context(transaction.atomic()):
        org = Organization.objects.create(name="a")
        org.name = "b"
        org.save()
        assert clean_recorder.calls == []
    assert clean_recorder.payloads() == [{"name": "b"}]
    assert RegionOutbox.objects.count() == 0


def test_drain(clean_recorder):
    with outbox_context(flush=False):
        for i in range(5):
            RegionOutbox(shard_scope=Scope.ORGANIZATION, shard_identifier=1, category=Category.AUDIT_EVENT, object_identifier=i, payload={"i": i}).save()
    stats = drain_outboxes()
    assert [p["i"] for p in clean_recorder.payloads()] == [0, 1, 2, 3, 4]
    assert stats.rows_retired == 5
