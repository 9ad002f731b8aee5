# Message identity: a message id on every row (existing rows get theirs from the
# column's database default) and the writer's headers. Safe on a table with rows.
# ruff: noqa: E501

from django.db import migrations, models

import outbox.columns

HELP = "The message's id, the same on every delivery attempt of this row: an idempotency key for receivers."


def message_id():
    return models.UUIDField(
        db_default=outbox.columns.RandomUUID(),
        default=outbox.columns.new_message_id,
        editable=False,
        help_text=HELP,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0001_initial"),
    ]

    operations = [
        operation
        for table in ("controloutbox", "regionoutbox")
        for operation in (
            migrations.AddField(
                model_name=table,
                name="headers",
                field=models.JSONField(blank=True, null=True),
            ),
            migrations.AddField(model_name=table, name="message_id", field=message_id()),
        )
    ]
