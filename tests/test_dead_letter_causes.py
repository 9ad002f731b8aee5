"""Dead letters grouped by cause: the receiver that failed, the exception type and the
message with what varies masked; the groups of a table read in bounded pages."""

import smtplib
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from outbox.engine import drain_outboxes
from outbox.models import ControlOutbox, RegionOutbox
from outbox.models import dead_letter_groups as groups
from outbox.models.causes import cause_of, is_cause_key, normalise
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.testapp.categories import Category

RECORD = "tests.testapp.receivers.record"


@pytest.mark.parametrize(
    ("message", "normalised"),
    [
        ("receiver failed for shard 17", "receiver failed for shard <n>"),
        ("KeyError: 'user_42' in \"acme corp\"", "KeyError: <str> in <str>"),
        ("order 123e4567-e89b-12d3-a456-426614174000 gone", "order <uuid> gone"),
        ("<Client at 0x7f3a2b10>, commit 9fceb02d0ae5", "<Client at <hex>>, commit <n>"),
        ("host 10.0.0.3 said 503 after 1.5s", "host <n>.<n>.<n>.<n> said <n> after <n>.<n>s"),
        ("order_17 failed: utf8, sha256, http2", "order_<n> failed: utf8, sha256, http2"),
        # Numbers inside words too; names whose digits are part of them are kept.
        ("<c1049@shop.example>, order_17x, order17", "<c<n>@shop.example>, order_<n>x, order<n>"),
        ("UTF-8, utf8mb4, SHA-256, IPv4, iso-8859-1", "UTF-8, utf8mb4, SHA-256, IPv4, iso-8859-1"),
        ("utf-8x, v2, 2024-01-31T10:00", "utf-<n>x, v<n>, <n>-<n>-<n>T<n>:<n>"),
        # A padded or hex id masks the same with or without a letter, wherever it stands.
        ("order 00000419, order 0000040f", "order <n>, order <n>"),
        ("order_0000040f, order-0000040f, req9fceb02d0ae5", "order_<n>, order-<n>, req<n>"),
        ("order_123e4567-e89b-12d3-a456-426614174000 gone", "order_<uuid> gone"),
        ("12345678 bytes, not 1234567; deadbeef", "<n> bytes, not <n>; deadbeef"),
        ("customer \"O'Neil\" can't pay", "customer <str> can't pay"),
        ("can't reach   the\n  CRM", "can't reach the CRM"),
        ("deadline exceeded", "deadline exceeded"),
    ],
)  # fmt: skip
def test_normalise_masks_what_varies_from_one_message_to_the_next(message, normalised):
    assert normalise(message) == normalised


@pytest.mark.parametrize(
    ("message", "normalised"),
    [
        ("'customer_id'", "'customer_id'"),
        ("'NoneType' object has no attribute 'e'", "'NoneType' object has no attribute 'e'"),
        ("No module named 'crm.client'", "No module named 'crm.client'"),
        # A name's numbers are masked as a word's; what is no identifier is a value.
        ("'user_42'", "'user_<n>'"),
        ("'acme corp', 'Zoë', '42', \"it's\", 42", "<str>, <str>, <str>, <str>, <n>"),
    ],
)  # fmt: skip
def test_quoted_names_are_kept_where_the_message_quotes_names(message, normalised):
    assert normalise(message, quotes_names=True) == normalised


def failures(last_error):
    return [(f.receiver, f.exception, f.message) for f in cause_of(last_error).failures]


def test_a_cause_is_read_back_from_last_error():
    assert failures(f"{RECORD}: RuntimeError: shard 7 down") == [
        (RECORD, "RuntimeError", "shard <n> down")
    ]
    # Several receivers, a dotted exception type, a message on two lines.
    assert failures("a.sync: KeyError: 'x'\nb.C.send: crm.errors.Down: host 3\n  retry later") == [
        ("a.sync", "KeyError", "'x'"),
        ("b.C.send", "crm.errors.Down", "host <n> retry later"),
    ]
    # Written before a lone failing receiver was named; or no exception at all.
    assert failures("ValueError: bad 7") == [("", "ValueError", "bad <n>")]
    assert failures("RuntimeError") == [("", "RuntimeError", "")]
    assert failures("") == [("", "", "")]
    assert str(cause_of("ValueError: bad 7")) == "unknown receiver: ValueError: bad <n>"


def test_the_exceptions_that_quote_names_keep_them_the_others_mask_them():
    assert failures(f"{RECORD}: KeyError: 'email'") == [(RECORD, "KeyError", "'email'")]
    form = "django.utils.datastructures.MultiValueDictKeyError"
    assert failures(f"{RECORD}: {form}: 'email'") == [(RECORD, form, "'email'")]
    assert failures(f"{RECORD}: ValueError: no customer 'Bob'") == [
        (RECORD, "ValueError", "no customer <str>")
    ]
    missing = cause_of(f"{RECORD}: KeyError: 'customer_id'").key
    assert cause_of(f"{RECORD}: KeyError: 'email'").key != missing


def test_the_cause_key_is_short_stable_and_ignores_what_varies():
    key = cause_of(f"{RECORD}: RuntimeError: shard 7 down").key
    assert is_cause_key(key) and len(key) == 12
    assert cause_of(f"{RECORD}: RuntimeError: shard 8 down").key == key
    assert cause_of("other.receiver: RuntimeError: shard 7 down").key != key
    assert cause_of(f"{RECORD}: ValueError: shard 7 down").key != key
    assert cause_of(f"{RECORD}: RuntimeError: shard 7 up").key != key
    assert not is_cause_key("not-a-key") and not is_cause_key(key.upper())


@committing
def test_a_lone_failing_receiver_is_named_so_its_dead_letters_group_by_it(calls, settings):
    settings.OUTBOX_MAX_ATTEMPTS = 1
    calls.failing = {1}
    RegionOutboxFactory(shard_identifier=1)
    drain_outboxes()
    dead = RegionOutbox.objects.dead().get()
    assert dead.last_error == f"{RECORD}: RuntimeError: receiver failed for shard 1"
    assert failures(dead.last_error) == [(RECORD, "RuntimeError", "receiver failed for shard <n>")]


def dead_letter(error, dead_minutes_ago=0, **fields):
    dead_at = timezone.now() - timedelta(minutes=dead_minutes_ago)
    return RegionOutboxFactory(attempts=3, dead_at=dead_at, last_error=error, **fields)


@committing
def test_a_tables_dead_letters_grouped_by_cause(calls, settings):
    settings.OUTBOX_MAX_ATTEMPTS = 1
    calls.failing = {1, 2}
    first = RegionOutboxFactory(shard_identifier=1, category=Category.AUDIT_EVENT)
    RegionOutboxFactory(shard_identifier=2, category=Category.ORGANIZATION_UPDATE)
    RegionOutboxFactory(shard_identifier=3)  # delivered
    drain_outboxes()
    RegionOutbox.objects.filter(pk=first.pk).update(dead_at=timezone.now() - timedelta(hours=1))
    other = dead_letter(f"{RECORD}: KeyError: 'name'", shard_identifier=4)
    RegionOutboxFactory(shard_identifier=5, attempts=2, last_error=f"{RECORD}: KeyError: 'x'")
    grouping = groups.group_dead_letters(RegionOutbox.objects.all())
    assert (grouping.letters, grouping.other) == (3, 0)
    shard_down, missing_key = grouping.groups
    assert str(shard_down.cause) == f"{RECORD}: RuntimeError: receiver failed for shard <n>"
    assert shard_down.count == 2 and shard_down.sample_ids[0] == first.pk
    assert shard_down.category_names == ["AUDIT_EVENT", "ORGANIZATION_UPDATE"]
    assert shard_down.first_dead_at < shard_down.last_dead_at
    assert shard_down.sample_error.endswith("RuntimeError: receiver failed for shard 1")
    assert (missing_key.count, missing_key.sample_ids) == (1, [other.pk])
    # A selection narrows what is grouped; so does the bound on causes kept.
    assert groups.group_dead_letters(RegionOutbox.objects.filter(shard_identifier=4)).letters == 1
    capped = groups.group_dead_letters(RegionOutbox.objects.all(), max_groups=1)
    assert ([group.count for group in capped.groups], capped.other) == ([2], 1)


@committing
def test_grouping_reads_pages_of_ids_and_error_starts_never_tracebacks(monkeypatch):
    monkeypatch.setattr(groups, "PAGE_ROWS", 2)
    for shard in range(5):
        dead_letter(f"{RECORD}: RuntimeError: shard {shard} down", shard_identifier=shard)
    RegionOutbox.objects.update(last_traceback="Traceback " * 1000, last_error="x" * 5000)
    with CaptureQueriesContext(connection) as queries:
        grouping = groups.group_dead_letters(RegionOutbox.objects.all())
    assert [group.count for group in grouping.groups] == [5]
    assert len(queries) == 3  # pages of 2, 2 and 1 rows
    assert not any("last_traceback" in query["sql"] for query in queries)
    assert grouping.groups[0].sample_error == "x" * groups.SAMPLE_CHARS


@committing
def test_the_dead_letters_of_causes_by_id_in_slices(monkeypatch):
    monkeypatch.setattr(groups, "SLICE_ROWS", 2)
    down = [
        dead_letter(f"{RECORD}: RuntimeError: shard {n} down", shard_identifier=n) for n in range(3)
    ]
    kept = dead_letter(f"{RECORD}: KeyError: 'x'", shard_identifier=9)
    RegionOutboxFactory(shard_identifier=0, last_error=f"{RECORD}: RuntimeError: shard 0 down")
    rows = RegionOutbox.objects.all()
    key = cause_of(down[0].last_error).key
    ids = groups.cause_ids(rows, {key})
    assert ids == [row.pk for row in down]
    assert groups.cause_ids(rows, {key}, limit=2) == ids[:2]
    slices = list(groups.in_slices(rows, ids))
    assert [sorted(s.values_list("pk", flat=True)) for s in slices] == [ids[:2], ids[2:]]
    assert sum(selected.discard() for selected in slices) == 3
    assert list(RegionOutbox.objects.dead()) == [kept]


@committing
def test_control_outbox_dead_letters_group_on_their_own_database():
    ControlOutboxFactory.create_batch(
        2, dead_at=timezone.now(), attempts=1, last_error="ValueError: region 3"
    )
    grouping = groups.group_dead_letters(ControlOutbox.objects.all())
    assert [(group.count, group.category_names) for group in grouping.groups] == [
        (2, ["USER_UPDATE"])
    ]


def fail_like_a_shop(sender, kwargs):
    """The receiver of 50 shards fails for four causes, each message with its own
    customer, order and numbers: shards 0-19 a refused recipient (`<c1049@shop.example>`),
    20-39 a CRM answering 50x for an order id zero-padded in hex (`00000419`, `0000041a`),
    40-44 and 45-49 a missing key of the payload."""
    shard = kwargs["shard_identifier"]
    if shard < 20:
        address = f"c{10 ** (shard % 5) + shard}@shop.example"
        refused = (550 + shard % 3, f"5.1.{shard % 4} <{address}>: User unknown".encode())
        raise smtplib.SMTPRecipientsRefused({address: refused})
    if shard < 40:
        order, name = 1029 + shard, ["Bob", "Ann Lee", "O'Neil", "Zoë"][shard % 4]
        raise RuntimeError(
            f"PUT /api/v2/orders/{order:08x} for customer {name!r}: {500 + shard % 4} "
            f"Service Unavailable (idempotency key order{order}x)"
        )
    kwargs["payload"]["customer_id" if shard < 45 else "email"]  # raises KeyError


@committing
def test_fifty_messages_failing_for_four_causes_make_four_groups(calls, settings):
    settings.OUTBOX_MAX_ATTEMPTS = 1
    calls.during_call = fail_like_a_shop
    for shard in range(50):
        RegionOutboxFactory(shard_identifier=shard)
    drain_outboxes()
    listed = StringIO()
    call_command("outbox_dead_letters", "list", "--group", stdout=listed)
    assert listed.getvalue().startswith("outbox.RegionOutbox: 50 dead letter(s), 4 cause(s)\n")
    grouping = groups.group_dead_letters(RegionOutbox.objects.all())
    assert (grouping.letters, grouping.other) == (50, 0)
    assert sorted((group.count, str(group.cause)) for group in grouping.groups) == [
        (5, f"{RECORD}: KeyError: 'customer_id'"),
        (5, f"{RECORD}: KeyError: 'email'"),
        (20, f"{RECORD}: RuntimeError: PUT /api/v<n>/orders/<n> for customer <str>: <n> "
             "Service Unavailable (idempotency key order<n>x)"),
        (20, f"{RECORD}: smtplib.SMTPRecipientsRefused: {{<str>: (<n>, b'<n>.<n>.<n> "
             "<c<n>@shop.example>: User unknown')}"),
    ]  # fmt: skip
