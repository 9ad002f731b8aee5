"""The migration that adds message ids is safe on a table with rows, and reversible."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("outbox", "0001_initial")]
AFTER = [("outbox", "0002_message_identity")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def latest():
    """Every app's newest migration: what the rest of the suite runs on."""
    loader = MigrationExecutor(connection).loader
    loader.build_graph()
    return loader.graph.leaf_nodes()


def table_columns():
    with connection.cursor() as cursor:
        description = connection.introspection.get_table_description(cursor, "outbox_regionoutbox")
    return {column.name for column in description}


@pytest.mark.django_db(transaction=True)
def test_rows_written_before_the_upgrade_each_get_their_own_id_and_it_reverses():
    try:
        migrate(BEFORE)
        assert "message_id" not in table_columns()
        with connection.cursor() as cursor:
            for n in range(20):  # as the previous release writes them
                cursor.execute(
                    "INSERT INTO outbox_regionoutbox (shard_scope, shard_identifier, "
                    "category, object_identifier, payload, attempts, last_error) "
                    "VALUES (1, %s, 1, %s, NULL, 0, '')",
                    [n % 3, n],
                )
        migrate(AFTER)
        from outbox.models import RegionOutbox

        ids = list(RegionOutbox.objects.values_list("message_id", flat=True))
        assert len(ids) == 20 and None not in ids and len(set(ids)) == 20
        # A release still running the old code during a rolling deploy leaves the id
        # to the database default.
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO outbox_regionoutbox (shard_scope, shard_identifier, category, "
                "object_identifier, payload, attempts, last_error, last_traceback, "
                "delivered_to, scheduled_from, scheduled_for, date_added) "
                "VALUES (1, 9, 1, 99, NULL, 0, '', '', '', %s, %s, %s)",
                [connection.ops.adapt_datetimefield_value(_now())] * 3,
            )
        late = RegionOutbox.objects.get(object_identifier=99).message_id
        assert late not in ids
        migrate(BEFORE)
        assert "message_id" not in table_columns() and "headers" not in table_columns()
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM outbox_regionoutbox")
            assert cursor.fetchone()[0] == 21
    finally:
        migrate(latest())  # not AFTER: the later migrations' tables must come back too
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM outbox_regionoutbox")


def _now():
    from django.utils import timezone

    return timezone.now()
