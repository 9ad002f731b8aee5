"""The contract between the drain engine and a database: one small class, two paths.

A backend owns every database operation of the engine for one connection alias: claim
due shards under a lease, read a window of their rows, settle a round (delete what was
delivered, reschedule what failed, release finished shards), renew and release leases.
The engine never writes SQL or ORM queries of its own; `outbox.backends.select` picks
the backend for a database.

What every backend guarantees, whatever its path:

- Every method commits on its own: the engine calls it outside any transaction, and
  what it wrote is committed, and so visible to other workers, when it returns. Called
  inside an atomic block (a transactional receiver retiring its own rows), it joins
  that block instead. A method may run several statements if each one is guarded by
  the lease and leaves a consistent state when the next one never runs.
- "Held" means one thing: the lease row still carries our token. Taking over an expired
  lease replaces the token in one guarded statement, so a token match is all a holder
  checks. A lease that lapsed but was not taken over is still held.
- Times are the database clock (`now()`), never the application server's.
- A backend never imports the engine or the write path; it raises
  NotImplementedError for an operation it cannot do, and does nothing, quietly, for
  one that has nothing to do (empty shards, an empty settlement).

What the engine and a backend hand each other comes first (`Lease`, `ShardFilter`,
`Window` and its `Group`s and `Message`s, `Settlement`): plain values, no database
access; the contract (`OutboxBackend`) after them; last, how every backend turns the
rows it read into a window: coalesced into groups, the columns read by hand-written SQL
turned into the values a queryset would give, each group's newest row into its Message
(pure Python: the backends run the statements).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Count, JSONField, Max

from outbox.backends.listener import WakeListener
from outbox.backends.wake import wake_backed_off
from outbox.cursors import CommitWithInsert
from outbox.internals import Convert, as_is, column_converter
from outbox.models import OutboxBase, ShardLease
from outbox.shards import ShardKey

__all__ = [
    "Coalesced",
    "Convert",
    "FailedGroup",
    "Group",
    "HeldLeases",
    "Lease",
    "Message",
    "MessageReader",
    "OutboxBackend",
    "SettleResult",
    "Settlement",
    "ShardFilter",
    "Window",
    "coalesce",
    "decode_json",
    "field_converter",
]


# --- What the engine and a backend hand each other ---------------------------------


@dataclass
class Lease:
    """A claim on some shards of one outbox table, shared by one batch.

    `seconds` is the lease length (each renewal extends it by that much from now on the
    database clock); `shards` are the shards the claim won and still works on.
    """

    token: str
    holder: str
    seconds: float
    shards: list[ShardKey] = field(default_factory=list)


@dataclass(frozen=True)
class ShardFilter:
    """Which shards a claim may take. Empty means any due shard of the table.

    `shards` limits the claim to these shards; `scopes` and `identifiers` to shards of
    those scopes or identifiers. `after` is a fairness hint, not a filter: a backend
    that walks shards in key order starts after it and wraps around. `small` is a hint
    too: the last batch was full and its shards held about one row each, so a backend
    may look for due shards by scanning rows rather than skipping from shard to shard.
    """

    shards: tuple[ShardKey, ...] | None = None
    scopes: tuple[int, ...] | None = None
    identifiers: tuple[int, ...] | None = None
    after: ShardKey | None = None
    small: bool = False


class Message:
    """The newest row of a group as a fast path reads it: only what the signal needs.

    A backend may instead hand the engine the model instance itself; both carry the
    shard fields, `category`, `object_identifier`, `attempts`, `message_id`, `headers`,
    a decoded `payload` and the times.
    """

    __slots__ = (
        "attempts",
        "category",
        "date_added",
        "delivered_to",
        "headers",
        "id",
        "message_id",
        "object_identifier",
        "payload",
        "region_name",
        "scheduled_for",
        "shard_identifier",
        "shard_scope",
    )

    def __init__(
        self,
        group: Group,
        payload: Any,
        date_added: Any,
        scheduled_for: Any,
        delivered_to: str = "",
        message_id: Any = None,
        headers: Any = None,
    ) -> None:
        self.id = group.row_ids[-1]  # the newest
        self.attempts = group.attempts[-1]
        self.region_name, self.shard_scope, self.shard_identifier = group.shard
        self.category = group.category
        self.object_identifier = group.object_identifier
        self.payload = payload
        self.date_added = date_added
        self.scheduled_for = scheduled_for
        self.delivered_to = delivered_to
        self.message_id = message_id
        self.headers = headers


class Group:
    """A coalescing group as read: its pending row ids (oldest first), their attempts,
    and its newest row (`message`; None when an operator removed it meanwhile).

    A plain class with slots: the engine makes one per group read, on the hot path.
    """

    __slots__ = ("attempts", "category", "message", "object_identifier", "row_ids", "shard")

    def __init__(
        self, shard: ShardKey, category: int, object_identifier: int, row_id: int, attempts: int
    ) -> None:
        """A group as its first (oldest) row is read: that row's id and attempts."""
        self.shard = shard
        self.category = category
        self.object_identifier = object_identifier
        self.row_ids: list[int] = [row_id]
        self.attempts: list[int] = [attempts]
        self.message: OutboxBase | Message | None = None

    @property
    def newest_id(self) -> int:
        return self.row_ids[-1]


@dataclass
class Window:
    """One read of the claimed shards: groups per shard in order of their oldest row.

    `incomplete` names the shards that may have more rows than were read; the others
    were read to their end (as far as this read could see).
    """

    shards: dict[ShardKey, list[Group]]
    incomplete: set[ShardKey]


@dataclass(frozen=True)
class FailedGroup:
    """A group whose receiver raised: when to retry each row, the error, and how long
    its shard backs off (the delay of the shard's head row).

    `traceback` is the formatted traceback; `delivered_to` (JSON text, "" for none) lists
    the receivers that succeeded for the group's newest row (the highest id in
    `row_delays`), written on that row only. As a dead group, the delays are unused.
    """

    shard: ShardKey
    row_delays: dict[int, float]
    error: str
    block_seconds: float
    traceback: str = ""
    delivered_to: str = ""
    asked_later: bool = False  # every receiver that failed raised RetryLater


@dataclass(frozen=True)
class Settlement:
    """The end of a round, for one lease.

    - `delivered`: per shard, the row ids whose receivers succeeded: delete them;
    - `failed`: groups to reschedule; their shards keep a lease row without a holder
      until the back-off ends, so their later groups wait in order;
    - `release`: finished shards whose lease to drop (never a failed shard);
    - `dead`: groups to move to the dead-letter state: their rows are kept with
      `dead_at` set, the attempt recorded as for a failure, and are never read or
      claimed again; their shard goes on (release it, or keep delivering).
    """

    delivered: Mapping[ShardKey, Sequence[int]] = field(default_factory=dict)
    failed: Sequence[FailedGroup] = ()
    release: Sequence[ShardKey] = ()
    dead: Sequence[FailedGroup] = ()


@dataclass(frozen=True)
class HeldLeases:
    """Leases other claims hold (`OutboxBackend.held_by_others`): how many, and the
    latest claim among them (None when there are none)."""

    count: int
    latest: datetime | None


@dataclass(frozen=True)
class SettleResult:
    """What a settlement did: rows deleted, and the shards whose lease was lost (their
    rows were neither deleted nor rescheduled; another worker delivers them again)."""

    deleted: int = 0
    lost: frozenset[ShardKey] = frozenset()


# --- The contract ----------------------------------------------------------------


class OutboxBackend(ABC):
    """Database operations of the engine for one database alias."""

    # Whether claim, read_window and settle stay one statement each however many shards
    # they touch: the engine may then claim up to OUTBOX_BATCH_ROWS shards at once when
    # its shards hold a row or two each. Else it claims OUTBOX_BATCH_SHARDS at most.
    wide_batches = False
    # Whether `settle` may run on another thread (its own connection) while this
    # backend claims, reads and settles on the drain's: the engine then settles a
    # delivered batch in the background while it works on the next one.
    settles_behind = False

    def __init__(self, using: str) -> None:
        self.using = using

    @classmethod
    @abstractmethod
    def supports(cls, connection: BaseDatabaseWrapper) -> bool:
        """Whether this backend can run on `connection` (vendor and features)."""

    @classmethod
    def commit_with_last_insert(cls, connection: BaseDatabaseWrapper) -> CommitWithInsert | None:
        """Optional, for the write path's deferred writer: an execute wrapper
        (`connection.execute_wrapper`) that sends the COMMIT in the same round trip as
        the INSERT it wraps, with the cursor that INSERT runs on
        (`outbox.cursors.CommitWithInsert`), or None where the database cannot. The
        transaction must end with that statement; the driver's own commit afterwards
        must then be a no-op. Asked of the first backend that supports the database,
        whatever OUTBOX_FAST_PATH says (a capability of the database, not of the drain)."""
        return None

    @classmethod
    def is_transient(cls, exc: BaseException) -> bool:
        """Whether `exc`, or an error behind it (its cause or context), is one the engine
        may retry at once: a deadlock or a lock timeout (`lock_error`)."""
        seen: set[int] = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            if cls.lock_error(current):
                return True
            current = current.__cause__ or current.__context__
        return False

    @classmethod
    def lock_error(cls, error: BaseException) -> bool:
        """Whether this one driver error is a deadlock or a lock timeout, known by its
        code, never by its text. None is, unless a backend knows its driver's codes."""
        return False

    def listener(self, models: Sequence[type[OutboxBase]]) -> WakeListener | None:
        """Optional: an unconnected listener (`outbox.backends.listener`) that wakes an
        idle drain loop when rows of these tables (all on this database) are committed,
        or None where the database cannot. Asked of the first backend that supports
        the database, whatever OUTBOX_FAST_PATH says."""
        return None

    def after_migrate(self) -> None:
        """Optional: set up what the backend needs in the database beyond the models'
        tables (PostgreSQL's NOTIFY triggers), idempotently. Runs after every `migrate`
        of this database, on the first backend that supports it."""
        return None

    def notify_listeners(self, model: type[OutboxBase]) -> None:
        """Optional: tell the idle drain loops listening for this table's commits (see
        `listener`) to look now, at the commit of the transaction under way, for what
        no write told them: a part of the table resumed after a pause. Nothing where
        no loop listens."""
        return None

    @abstractmethod
    def claim(
        self, model: type[OutboxBase], lease: Lease, where: ShardFilter, limit: int
    ) -> list[ShardKey]:
        """Lease up to `limit` shards of `model` that pass `where`, whose oldest pending
        (not dead) row is due, and that have no live lease (held, or backing off), under
        `lease.token`, expiring `lease.seconds` from now. Shards whose lease expired are taken over.

        Must guarantee that no two claims win one shard, whatever runs concurrently,
        and that the lease is committed on return. Sets `lease.shards` to the shards
        won, in key order, and returns them; no shard won is not an error.
        """

    def claim_and_read(
        self,
        model: type[OutboxBase],
        lease: Lease,
        shards: Sequence[ShardKey],
        limit: int,
        *,
        timed: bool = False,
    ) -> Window | None:
        """Optional: `claim` of the given `shards` (as `ShardFilter(shards=...)`, no
        limit but their count) and `read_window` of the shards won, in one step, which
        spares a synchronous flush a round trip before its first receiver. Sets
        `lease.shards` and returns the window; the read must see every change committed
        before the claim won. None: not possible here, so the engine claims, then reads."""
        return None

    def claim_due_and_read(
        self,
        model: type[OutboxBase],
        lease: Lease,
        where: ShardFilter,
        limit: int,
        rows: int,
        *,
        timed: bool = False,
    ) -> Window | None:
        """Optional: `claim` of up to `limit` due shards passing `where` and `read_window`
        of the shards won (about `rows` rows in all), in one step, which spares a drain
        loop a round trip per round while writes trickle in. Sets `lease.shards` and
        returns the window; the read must see every change committed before the claim
        won. None: not possible here (for this filter), so the engine claims, then reads."""
        return None

    @abstractmethod
    def read_window(
        self,
        model: type[OutboxBase],
        shards: Sequence[ShardKey],
        limit: int,
        *,
        timed: bool = False,
    ) -> Window:
        """Read the first pending rows of `shards` (about `limit` in all), coalesced into
        groups. Dead rows are never read. A shard is read in id order up to its first row
        that is not due yet (its own `scheduled_for`): that row and the shard's later rows
        wait, so nothing is delivered early and order is kept.

        Each group's `message` must carry the payload decoded the way Django decodes
        the model's payload field (its decoder, its converters). Shards that may hold
        more rows than were read are listed in `Window.incomplete`. `timed`: the engine
        measures each message's lag, so each `message` must carry its `date_added`;
        without, a backend may leave it None.
        """

    @abstractmethod
    def settle(self, model: type[OutboxBase], lease: Lease, settlement: Settlement) -> SettleResult:
        """Apply `settlement` where `lease` still holds the shards.

        Must never delete or reschedule rows of a shard whose lease was lost (another
        worker may be delivering them), and must report those shards in
        `SettleResult.lost`; rows an operator removed meanwhile are not a lost lease.
        Failed rows get attempts + 1, first/last attempt times, the error and their
        own retry time; the shard's lease row loses its token and expires when the
        shard may be retried. Dead groups get the same record plus `dead_at`, without a
        back-off. Both write the traceback, and `delivered_to` on the newest row.
        Returns the rows deleted and the shards lost.
        """

    @abstractmethod
    def renew(self, model: type[OutboxBase], lease: Lease) -> set[ShardKey]:
        """Extend the lease by `lease.seconds` from now; return the shards still held."""

    @abstractmethod
    def release(self, model: type[OutboxBase], lease: Lease, shards: Sequence[ShardKey]) -> None:
        """Drop the lease on `shards` where `lease.token` still holds it, so the shards
        may be claimed at once; shards someone else holds are left alone."""

    def held_by_others(
        self, model: type[OutboxBase], where: ShardFilter, holder: str
    ) -> HeldLeases:
        """The leases of shards passing `where` that holders other than `holder` hold
        now: how many, and the latest claim among them. A drain whose claim came back
        empty looks at it to tell a claim race lost (other drains hold shards, and move
        on to new ones) from a backlog done. The ORM does it for every backend: one
        aggregate over the lease table, run only when a claim came back empty."""
        leases = ShardLease.objects.using(self.using).of(model).held().exclude(holder=holder)
        if where.scopes:
            leases = leases.filter(shard_scope__in=where.scopes)
        if where.identifiers:
            leases = leases.filter(shard_identifier__in=where.identifiers)
        found = leases.aggregate(count=Count("id"), latest=Max("claimed_at"))
        return HeldLeases(found["count"], found["latest"])

    def wake(self, model: type[OutboxBase], where: ShardFilter) -> list[ShardKey]:
        """End the back-off of the shards passing `where` that a message reached since
        their last failure, for one early attempt (`outbox.backends.wake`); returns them.
        The ORM does it for every backend: it reads the few backing-off leases."""
        shards, scopes, identifiers = where.shards, where.scopes, where.identifiers
        return wake_backed_off(self.using, model, shards, scopes, identifiers)


# --- Rows read into a window: shared by every backend -------------------------------

_raw_decode = json.JSONDecoder().raw_decode


def decode_json(value: Any) -> Any:
    """The one JSON decoder of the fast paths, for a stock JSONField's column: what
    `json.loads` gives, without its two whitespace scans where the text has none around
    it (as PostgreSQL prints jsonb and Django writes JSON); other text and bytes go
    through `json.loads` itself (which raises as it would), anything else (a driver's
    own decoded value, None) is taken as it is."""
    if type(value) is str:
        try:
            decoded, end = _raw_decode(value)
        except ValueError:
            return json.loads(value)  # leading whitespace, or an error to raise as it would
        return decoded if end == len(value) else json.loads(value)
    return json.loads(value) if isinstance(value, bytes) else value


def field_converter(model: type[OutboxBase], name: str, connection: BaseDatabaseWrapper) -> Convert:
    """How Django turns column `name` of `model` into a value, as one function.

    A stock JSONField without a decoder takes `decode_json`; any other field (a custom
    decoder, a JSONField subclass, a datetime needing its time zone) goes through its own
    converters, as a queryset would.
    """
    field = model._meta.get_field(name)
    if type(field) is JSONField and field.decoder is None:
        return decode_json
    return column_converter(model, name, connection)


class MessageReader:
    """Builds each group's Message from the columns a fast path read of its newest row,
    in this order: payload, date_added, scheduled_for, delivered_to, message_id,
    headers; each value turned into what a queryset would give (JSON through
    `decode_json` where the field is a stock JSONField)."""

    def __init__(self, model: type[OutboxBase], connection: BaseDatabaseWrapper) -> None:
        def convert(name: str) -> Convert | None:
            # None: the column is taken as read (`as_is`), with no call per row.
            function = field_converter(model, name, connection)
            return None if function is as_is else function

        self._payload = convert("payload") or as_is
        # A stock JSONField's texts are decoded together, once per window (`_decode_all`).
        self._payload_stock = self._payload is decode_json
        self._time = convert("date_added")  # and scheduled_for, alike
        self._message_id = convert("message_id")
        self._headers = convert("headers")

    def attach(self, newest: Mapping[Group, Sequence[Any]], at: int) -> None:
        """Give each group of `newest` its Message, from its row's columns from `at` on.
        Runs once per message delivered, so converters the column does not need are
        skipped rather than called."""
        time_of, id_of, headers_of = self._time, self._message_id, self._headers
        payloads = [row[at] for row in newest.values()]
        if self._payload_stock:
            payloads = _decode_all(payloads)
        elif self._payload is not as_is:
            payloads = list(map(self._payload, payloads))
        for (group, row), payload in zip(newest.items(), payloads, strict=True):
            date_added, scheduled_for, done, message_id, headers = row[at + 1 : at + 6]
            if time_of is not None:
                date_added = None if date_added is None else time_of(date_added)
                scheduled_for = None if scheduled_for is None else time_of(scheduled_for)
            if id_of is not None and message_id is not None:
                message_id = id_of(message_id)
            if headers is not None and headers_of is not None:
                headers = headers_of(headers)
            group.message = Message(
                group, payload, date_added, scheduled_for, done, message_id, headers
            )


def _decode_all(values: list[Any], one: Convert = decode_json) -> list[Any]:
    """Each value as `one` (`decode_json`) gives it, the JSON texts decoded in one
    call: a column of a stock JSONField holds valid JSON only (PostgreSQL's jsonb, the
    JSON_VALID check elsewhere), so the texts joined by commas inside brackets are an
    array of exactly those values. Decoding a window's payloads together saves most of
    what a decoder call per message costs. Anything else (NULL, bytes) goes through
    `one`, and so does every value when the joined decode fails: `one` raises as it
    would have."""
    texts = [value for value in values if type(value) is str]
    if len(texts) < 2:
        return list(map(one, values))
    try:
        decoded = _raw_decode("[" + ",".join(texts) + "]")[0]
    except ValueError:
        return list(map(one, values))
    if len(decoded) != len(texts):
        return list(map(one, values))
    if len(texts) == len(values):
        return decoded  # type: ignore[no-any-return]
    taken = iter(decoded)
    return [next(taken) if type(value) is str else one(value) for value in values]


# --- Coalescing rows into groups ---------------------------------------------------

Coalesced = tuple[
    dict[ShardKey, list[Group]], dict[Group, Sequence[Any]], dict[ShardKey, int], set[ShardKey]
]


def coalesce(
    model: type[OutboxBase],
    rows: Sequence[tuple[Any, ...]],
    shards: Sequence[ShardKey] = (),
) -> Coalesced:
    """Group rows read in id order (within each shard) into coalescing groups.

    Each row is the `shard_fields` values, then id, category, object_identifier,
    attempts and whether the row is due, then whatever else the caller read. A shard
    stops at its first row that is not due: that row and the shard's later rows wait
    (the shard is "cut"). Returns the groups per shard (in order of their oldest row),
    each group's newest row, the number of rows read per shard, and the shards cut.
    The loop runs once per row read, so it is kept tight (keys of `shards` are reused).
    """
    width = len(model.shard_fields)
    known = {key[3 - width :]: key for key in shards}
    groups: dict[ShardKey, list[Group]] = {}
    newest: dict[Group, Sequence[Any]] = {}
    read: dict[ShardKey, int] = {}
    cut: set[ShardKey] = set()
    per_shard: dict[tuple[Any, ...], tuple[ShardKey, list[Group], dict[tuple[int, int], Group]]]
    per_shard = {}
    last_raw: tuple[Any, ...] = ()
    shard = ShardKey("", 0, 0)
    shard_groups: list[Group] = []
    by_object: dict[tuple[int, int], Group] = {}
    for row in rows:
        raw = row[:width]  # rows are tuples (as the drivers and values_list give them)
        if raw != last_raw:  # rows of one shard usually come together
            last_raw = raw
            if raw not in per_shard:
                key = known.get(raw) or model.shard_key_of(raw)
                per_shard[raw] = (key, groups.setdefault(key, []), {})
                read[key] = 0
            shard, shard_groups, by_object = per_shard[raw]
        read[shard] += 1
        if not row[width + 4] or shard in cut:
            cut.add(shard)
            continue
        object_key = (row[width + 1], row[width + 2])
        group = by_object.get(object_key)
        if group is None:
            group = Group(shard, object_key[0], object_key[1], row[width], row[width + 3])
            by_object[object_key] = group
            shard_groups.append(group)
        else:
            group.row_ids.append(row[width])
            group.attempts.append(row[width + 3])
        newest[group] = row  # the last row seen of a group is its newest
    return groups, newest, read, cut
