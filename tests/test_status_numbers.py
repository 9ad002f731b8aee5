"""`outbox_status`'s numbers say what they are: a table's figures are its scopes' summed
from one reading (a row coming due between two queries made a table line say 3 due and
its scope line 4), and the highest attempt seen is not shown as a limit."""

import io
import json
import re
from datetime import timedelta

from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from outbox.models import RegionOutbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory

pytestmark = committing


def status(*args):
    out = io.StringIO()
    call_command("outbox_status", *args, stdout=out)
    return out.getvalue()


def due_on(text):
    """(the RegionOutbox line's due rows, its ORGANIZATION line's)."""
    table = re.search(r"^outbox\.RegionOutbox \(default\): \d+ rows, (\d+) due", text, re.M)
    scope = re.search(r"^    ORGANIZATION: \d+ rows in \d+ shards, (\d+) due", text, re.M)
    return int(table[1]), int(scope[1])


class ComesDue:
    """Between the first read of the outbox table and the next, `row` comes due (as a
    scheduled row does when its time passes, or a commit lands, mid-reading)."""

    def __init__(self, row):
        self.row = row
        self.reads = 0
        self.inside = False

    def __call__(self, execute, sql, params, many, context):
        table = RegionOutbox._meta.db_table
        if not self.inside and table in sql and sql.lstrip().upper().startswith("SELECT"):
            self.reads += 1
            if self.reads == 2:
                self.inside = True
                try:
                    past = timezone.now() - timedelta(minutes=1)
                    RegionOutbox.objects.filter(pk=self.row.pk).update(scheduled_for=past)
                finally:
                    self.inside = False
        return execute(sql, params, many, context)


def test_a_tables_figures_are_its_scopes_from_one_reading():
    RegionOutboxFactory.create_batch(3, shard_identifier=1)
    later = RegionOutboxFactory(shard_identifier=2)
    RegionOutbox.objects.filter(pk=later.pk).update(
        scheduled_for=timezone.now() + timedelta(hours=1)
    )
    comes_due = ComesDue(later)
    with connection.execute_wrapper(comes_due):
        text = status()
    assert comes_due.reads >= 2  # it came due in the middle of the reading
    table, scope = due_on(text)
    assert table == scope, text
    assert table in (3, 4)
    # The same in the JSON, for every figure a table sums or takes the worst of.
    RegionOutbox.objects.filter(pk=later.pk).update(
        scheduled_for=timezone.now() + timedelta(hours=1)
    )
    with connection.execute_wrapper(ComesDue(later)):
        [region] = [t for t in json.loads(status("--json")) if t["table"] == "outbox.RegionOutbox"]
    scopes = region["scopes"]
    for figure in ("rows", "due_rows", "failing_rows", "dead_letters"):
        assert region[figure] == sum(scope[figure] for scope in scopes), figure
    for figure in ("highest_attempt", "lag_seconds", "oldest_age_seconds"):
        assert region[figure] == max(scope[figure] for scope in scopes), figure


def test_the_highest_attempt_is_not_called_a_maximum_and_the_limit_is_shown_apart(settings):
    RegionOutboxFactory(shard_identifier=1)
    RegionOutbox.objects.update(attempts=4, last_error="ValueError: flaky")
    text = status()
    assert "max attempts" not in text
    assert "1 failing (highest attempt 4), " in text, text
    settings.OUTBOX_MAX_ATTEMPTS = 5
    text = status()
    assert "1 failing (highest attempt 4, limit OUTBOX_MAX_ATTEMPTS=5), " in text, text
    [region] = [t for t in json.loads(status("--json")) if t["table"] == "outbox.RegionOutbox"]
    assert (region["highest_attempt"], region["attempt_limit"]) == (4, 5)
    assert region["max_attempts"] == 4  # the deprecated name of highest_attempt
    assert [scope["highest_attempt"] for scope in region["scopes"]] == [4]
