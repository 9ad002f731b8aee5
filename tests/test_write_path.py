"""The default write path: an outbox row saved in outbox_context behaves like Model.save.

It is INSERTed at save(), gets its primary key, sends pre_save and post_save in order
around the INSERT, and the transaction's own queries see it; its shard is flushed after
commit. (The opt-in deferred writer is tested in tests/test_deferred.py.)
"""

import pytest
from django.db import transaction
from django.db.models.signals import post_save, pre_save

from outbox import outbox_context
from outbox.models import RegionOutbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory

pytestmark = committing


def test_save_inserts_at_once_sets_the_pk_and_is_visible_in_the_transaction(calls):
    with outbox_context(transaction.atomic(), flush=False):
        row = RegionOutboxFactory(payload={"v": 1})
        assert row.pk is not None
        assert RegionOutbox.objects.filter(pk=row.pk).exists()
        assert RegionOutbox.objects.get(pk=row.pk).payload == {"v": 1}
    assert RegionOutbox.objects.get().pk == row.pk


def test_pre_save_and_post_save_run_in_order_around_the_insert():
    seen: list[tuple[str, object, bool]] = []

    def before(sender, instance, **kwargs):
        seen.append(("pre_save", instance.pk, RegionOutbox.objects.exists()))

    def after(sender, instance, created, **kwargs):
        seen.append(("post_save", instance.pk, created))

    pre_save.connect(before, sender=RegionOutbox)
    post_save.connect(after, sender=RegionOutbox)
    try:
        with outbox_context(transaction.atomic(), flush=False):
            first = RegionOutboxFactory()
            # Both signals have run before save() returns, as for any model.
            assert seen == [("pre_save", None, False), ("post_save", first.pk, True)]
            second = RegionOutboxFactory()
        assert seen == [
            ("pre_save", None, False),
            ("post_save", first.pk, True),
            ("pre_save", None, True),
            ("post_save", second.pk, True),
        ]
    finally:
        pre_save.disconnect(before, sender=RegionOutbox)
        post_save.disconnect(after, sender=RegionOutbox)


def test_bulk_create_inserts_at_once_with_pks(calls):
    with outbox_context(transaction.atomic(), flush=False):
        rows = RegionOutbox.objects.bulk_create(
            [RegionOutboxFactory.build(object_identifier=n) for n in range(3)]
        )
        assert RegionOutbox.objects.count() == 3
    assert RegionOutbox.objects.count() == 3
    # pks are returned where the database can (PostgreSQL, SQLite, MariaDB).
    assert sorted(row.pk for row in rows) == sorted(
        RegionOutbox.objects.values_list("pk", flat=True)
    )


def test_saved_rows_are_flushed_after_commit_and_nothing_after_rollback(calls):
    with outbox_context(transaction.atomic()):
        RegionOutboxFactory(shard_identifier=3, payload={"v": "kept"})
    assert calls.payloads() == [{"v": "kept"}]
    assert not RegionOutbox.objects.exists()
    with outbox_context(transaction.atomic()):
        RegionOutboxFactory(shard_identifier=4, payload={"v": "gone"})
        transaction.set_rollback(True)
    assert calls.payloads() == [{"v": "kept"}]
    assert not RegionOutbox.objects.exists()


def test_a_second_save_updates_the_row_it_inserted():
    with outbox_context(transaction.atomic(), flush=False):
        row = RegionOutboxFactory(payload={"v": 1})
        row.payload = {"v": 2}
        row.save()
    assert list(RegionOutbox.objects.values_list("pk", "payload")) == [(row.pk, {"v": 2})]


@pytest.mark.parametrize("defer", [False, True], ids=["saved at once", "deferred writer"])
def test_messages_saved_is_sent_once_per_write_with_the_written_rows(defer):
    from outbox.signals import messages_saved

    seen = []

    def saved(sender, rows, using, **kwargs):
        seen.append((sender, [row.pk for row in rows], using))

    messages_saved.connect(saved)
    try:
        with outbox_context(transaction.atomic(), flush=False, defer=defer):
            one = RegionOutboxFactory()
            many = RegionOutbox.objects.bulk_create(
                [RegionOutboxFactory.build(object_identifier=n) for n in range(2)]
            )
    finally:
        messages_saved.disconnect(saved)
    pks = [one.pk, *(row.pk for row in many)]
    assert None not in pks
    if defer:  # written together as the block ends
        assert seen == [(RegionOutbox, pks, "default")]
    else:
        assert seen == [(RegionOutbox, pks[:1], "default"), (RegionOutbox, pks[1:], "default")]
