# The initial migration (nothing is released yet, so there is one).
# ruff: noqa: E501

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="ControlOutbox",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("shard_scope", models.IntegerField()),
                ("shard_identifier", models.BigIntegerField()),
                ("category", models.IntegerField()),
                ("object_identifier", models.BigIntegerField()),
                ("payload", models.JSONField(blank=True, null=True)),
                (
                    "scheduled_from",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        help_text="When the current schedule was set: the write, or the last failed attempt. Until scheduled_for, the row waits out this back-off.",
                    ),
                ),
                (
                    "scheduled_for",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        help_text="When the row is due (its shard may then be drained).",
                    ),
                ),
                (
                    "date_added",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(), editable=False
                    ),
                ),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("first_attempt_at", models.DateTimeField(blank=True, null=True)),
                ("last_attempt_at", models.DateTimeField(blank=True, null=True)),
                ("last_error", models.TextField(blank=True, default="")),
                ("last_traceback", models.TextField(blank=True, db_default="", default="")),
                ("delivered_to", models.TextField(blank=True, db_default="", default="")),
                (
                    "dead_at",
                    models.DateTimeField(
                        blank=True,
                        help_text="When the row became a dead letter (attempts exhausted or a permanent failure); dead rows are never delivered and never block their shard.",
                        null=True,
                    ),
                ),
                ("region_name", models.CharField(max_length=48)),
            ],
            options={
                "verbose_name": "control outbox message",
                "abstract": False,
                "indexes": [
                    models.Index(
                        fields=["region_name", "shard_scope", "shard_identifier", "id"],
                        name="controloutbox_shard",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="RegionOutbox",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("shard_scope", models.IntegerField()),
                ("shard_identifier", models.BigIntegerField()),
                ("category", models.IntegerField()),
                ("object_identifier", models.BigIntegerField()),
                ("payload", models.JSONField(blank=True, null=True)),
                (
                    "scheduled_from",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        help_text="When the current schedule was set: the write, or the last failed attempt. Until scheduled_for, the row waits out this back-off.",
                    ),
                ),
                (
                    "scheduled_for",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        help_text="When the row is due (its shard may then be drained).",
                    ),
                ),
                (
                    "date_added",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(), editable=False
                    ),
                ),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("first_attempt_at", models.DateTimeField(blank=True, null=True)),
                ("last_attempt_at", models.DateTimeField(blank=True, null=True)),
                ("last_error", models.TextField(blank=True, default="")),
                ("last_traceback", models.TextField(blank=True, db_default="", default="")),
                ("delivered_to", models.TextField(blank=True, db_default="", default="")),
                (
                    "dead_at",
                    models.DateTimeField(
                        blank=True,
                        help_text="When the row became a dead letter (attempts exhausted or a permanent failure); dead rows are never delivered and never block their shard.",
                        null=True,
                    ),
                ),
            ],
            options={
                "verbose_name": "region outbox message",
                "abstract": False,
                "indexes": [
                    models.Index(
                        fields=["shard_scope", "shard_identifier", "id"], name="regionoutbox_shard"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="ShardLease",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "outbox",
                    models.CharField(help_text="Label of the outbox model.", max_length=100),
                ),
                ("region_name", models.CharField(blank=True, default="", max_length=48)),
                ("shard_scope", models.IntegerField()),
                ("shard_identifier", models.BigIntegerField()),
                ("token", models.CharField(blank=True, max_length=32, null=True)),
                ("expires_at", models.DateTimeField()),
                ("holder", models.CharField(blank=True, default="", max_length=128)),
                (
                    "claimed_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "indexes": [models.Index(fields=["token"], name="outbox_shardlease_token")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("outbox", "region_name", "shard_scope", "shard_identifier"),
                        name="outbox_shardlease_shard",
                    )
                ],
            },
        ),
    ]
