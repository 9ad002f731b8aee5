"""Tables of the stress run: what committed, what was delivered, the inbox receiver's
effects, faults and connections."""

from __future__ import annotations

from django.db import models


class Written(models.Model):
    """One outbox message, inserted in the same transaction as its outbox row.

    A rolled-back or killed transaction leaves no row here, so this is exactly what
    committed. `sseq` increases with commit order within a shard (one writer owns a
    shard); `seq` increases with commit order within a coalescing group.
    """

    shard = models.BigIntegerField()
    category = models.IntegerField()
    obj = models.BigIntegerField()
    seq = models.BigIntegerField()
    sseq = models.BigIntegerField()
    at = models.FloatField(help_text="time.time() just before the commit")

    class Meta:
        indexes = [models.Index(fields=["shard", "sseq"])]

    def __str__(self) -> str:
        return f"write {self.shard}/{self.obj} seq {self.seq}"


class Journal(models.Model):
    """One receiver call, written by the receiver in its own autocommit INSERT (a hung
    call: when it starts, with `ok` false, and updated if it returns).

    `token` and `holder` are what the shard's lease row said when the call started: the
    batch (lease) the call belongs to and the process holding it (`host:pid:thread`).
    """

    shard = models.BigIntegerField()
    category = models.IntegerField()
    obj = models.BigIntegerField()
    seq = models.BigIntegerField()
    sseq = models.BigIntegerField()
    process = models.CharField(max_length=64)
    pid = models.IntegerField()
    start = models.FloatField()
    end = models.FloatField()
    ok = models.BooleanField()
    hung = models.BooleanField(default=False)
    slow = models.BooleanField(default=False, help_text="in flight when SIGTERM was sent")
    token = models.CharField(max_length=32, default="")
    holder = models.CharField(max_length=128, default="")
    message_id = models.UUIDField(null=True)

    def __str__(self) -> str:
        return f"call {self.shard}/{self.obj} seq {self.seq} by {self.process}"


class Effect(models.Model):
    """One call of the inbox receiver (`stress/inbox.py`), inserted in its transaction with
    the inbox record. Not unique on `message_id`: a message applied twice shows as two
    rows."""

    message_id = models.UUIDField()
    shard = models.BigIntegerField()
    category = models.IntegerField()
    obj = models.BigIntegerField()
    seq = models.BigIntegerField()
    attempt = models.IntegerField()
    process = models.CharField(max_length=64)
    pid = models.IntegerField()
    at = models.FloatField()

    class Meta:
        indexes = [models.Index(fields=["message_id"])]

    def __str__(self) -> str:
        return f"effect of {self.message_id} by {self.process}"


class Skip(models.Model):
    """One delivery the inbox receiver skipped (`duplicate_skipped`), inserted in the
    transaction that found the message's inbox record."""

    message_id = models.UUIDField()
    process = models.CharField(max_length=64)
    at = models.FloatField()

    def __str__(self) -> str:
        return f"skip of {self.message_id} by {self.process}"


class Control(models.Model):
    """A fault the runner asks a receiver or writer to act out.

    kind `fail`: receivers of `shard` raise until `until`; `hang`: the next receiver of
    `shard` sleeps `seconds` (once); `slow`: the next drainer receiver of any shard with
    more work pending sleeps `seconds` (once; the runner then SIGTERMs that drainer);
    `stall`: writer number `shard` sleeps inside its transaction.
    """

    kind = models.CharField(max_length=16)
    shard = models.BigIntegerField(default=0)
    until = models.FloatField(default=0)
    seconds = models.FloatField(default=0)
    used = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.kind} on shard {self.shard}"


class Conn(models.Model):
    """A database connection some stress process opened (server-side id), for faults."""

    process = models.CharField(max_length=64)
    pid = models.IntegerField()
    server_id = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.process} connection {self.server_id}"
