"""Dead letters grouped by cause (see `outbox.models.causes`), and the dead letters of
given causes, for operators to retry or discard a whole cause at once.

Bounded for large tables: the dead letters are read in pages of `PAGE_ROWS` in id
order (one query per page, by primary key, on every database: no cursor holds a large
result), and of each row only its id, category, `dead_at` and the first `CAUSE_CHARS`
characters of `last_error`, never its traceback. Memory holds one page and at most
`MAX_GROUPS` groups; dead letters of causes met after that many are counted as other
causes. Selecting the dead letters of causes keeps their ids only (a few dozen bytes
each) and hands them on in slices of `SLICE_ROWS`, one query per slice, within every
database's limit of parameters.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models.functions import Substr

from outbox.categories import registry
from outbox.models.causes import CAUSE_CHARS, Cause, cause_of
from outbox.models.outbox import OutboxQuerySet

PAGE_ROWS = 2000
MAX_GROUPS = 1000
SLICE_ROWS = 500
SAMPLE_IDS = 3
SAMPLE_CHARS = 500


@dataclass
class DeadLetterGroup:
    """The dead letters of one cause in one table: how many, when the first and the last
    died, their categories, and a sample (the first ids met and one full error)."""

    cause: Cause
    sample_error: str
    first_dead_at: datetime
    last_dead_at: datetime
    count: int = 0
    categories: set[int] = field(default_factory=set)
    sample_ids: list[int] = field(default_factory=list)

    @property
    def key(self) -> str:
        return self.cause.key

    @property
    def category_names(self) -> list[str]:
        return sorted(registry.category_name(value) for value in self.categories)

    def add(self, row_id: int, category: int, dead_at: datetime) -> None:
        self.count += 1
        self.categories.add(category)
        self.first_dead_at = min(self.first_dead_at, dead_at)
        self.last_dead_at = max(self.last_dead_at, dead_at)
        if len(self.sample_ids) < SAMPLE_IDS:
            self.sample_ids.append(row_id)


@dataclass
class Grouping:
    """A table's dead letters by cause, the largest group first; `other`: dead letters
    of causes past the first MAX_GROUPS, not grouped."""

    groups: list[DeadLetterGroup]
    letters: int
    other: int


def group_dead_letters(rows: OutboxQuerySet[Any], max_groups: int = MAX_GROUPS) -> Grouping:
    """Group the dead letters among `rows` (a selection of one outbox table) by cause."""
    found: dict[str, DeadLetterGroup] = {}
    letters = other = 0
    for row_id, category, dead_at, error in _dead_letters(rows):
        letters += 1
        cause = cause_of(error)
        group = found.get(cause.key)
        if group is None:
            if len(found) >= max_groups:
                other += 1
                continue
            group = DeadLetterGroup(cause, error[:SAMPLE_CHARS], dead_at, dead_at)
            found[cause.key] = group
        group.add(row_id, category, dead_at)
    ordered = sorted(found.values(), key=lambda group: (-group.count, group.first_dead_at))
    return Grouping(ordered, letters, other)


def cause_ids(
    rows: OutboxQuerySet[Any], keys: Collection[str], limit: int | None = None
) -> list[int]:
    """The ids of the dead letters among `rows` whose cause has one of `keys`, in id
    order; the first `limit` of them when given."""
    ids: list[int] = []
    for row_id, _, _, error in _dead_letters(rows):
        if cause_of(error).key in keys:
            ids.append(row_id)
            if limit is not None and len(ids) >= limit:
                break
    return ids


def in_slices(rows: OutboxQuerySet[Any], ids: list[int]) -> Iterator[OutboxQuerySet[Any]]:
    """The dead letters among `rows` with these ids, SLICE_ROWS ids per selection."""
    for start in range(0, len(ids), SLICE_ROWS):
        yield rows.dead().filter(id__in=ids[start : start + SLICE_ROWS])


def _dead_letters(rows: OutboxQuerySet[Any]) -> Iterator[tuple[int, int, datetime, str]]:
    """(id, category, dead_at, start of last_error) of each dead letter, page by page."""
    dead = (
        rows.dead()
        .order_by("id")
        .annotate(cause_text=Substr("last_error", 1, CAUSE_CHARS))
        .values_list("id", "category", "dead_at", "cause_text")
    )
    after: int | None = None
    while True:
        page = list((dead if after is None else dead.filter(id__gt=after))[:PAGE_ROWS])
        for row_id, category, dead_at, error in page:
            yield row_id, category, dead_at, error or ""
        if len(page) < PAGE_ROWS:
            return
        after = page[-1][0]
