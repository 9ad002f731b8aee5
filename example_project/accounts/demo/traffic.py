"""Writing the demo's traffic: the population, deletions, and rolled-back requests.

Every write goes through the producers, so each changed object writes exactly one outbox
row in the same transaction; `Tally` counts those rows as they are written. The frequent
updates themselves are in `accounts.demo.updates`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Model

from accounts.models import REGIONS, AuditLogEntry, Organization, Project, UserAccount
from outbox import outbox_context
from outbox.models import ControlOutbox, RegionOutbox

# Written only in transactions that roll back: must never reach a receiver.
ROLLBACK_MARKER = "ROLLED-BACK"

ADJECTIVES = ["Amber", "Brisk", "Cobalt", "Daring", "Golden", "Iron", "Lunar", "Polar", "Rapid"]
NOUNS = ["Anchors", "Badgers", "Comets", "Dynamics", "Foxes", "Harbors", "Labs", "Orbits", "Works"]
FIRST = ["Ada", "Bo", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea"]
LAST = ["Adams", "Berg", "Costa", "Diaz", "Eze", "Fong", "Gupta", "Hale", "Ito", "Jensen"]


@dataclass
class Tally:
    """What the traffic wrote: outbox rows, object changes, synchronous flushes."""

    written: int = 0  # outbox rows committed
    updates: int = 0  # object changes after the population was created
    sync_requests: int = 0  # transactions flushed right after commit
    flushed: int = 0  # rows those flushes retired (the rest is left to the drain)
    rollback_leftovers: int = 0  # outbox rows left behind by rolled-back work: must be 0


class Names:
    """Deterministic, readable names for a seeded run."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def organization(self) -> str:
        return f"{self.rng.choice(ADJECTIVES)} {self.rng.choice(NOUNS)}"

    def project(self) -> str:
        return f"{self.rng.choice(NOUNS).lower()}-{self.rng.randint(1, 999)}"

    def person(self) -> str:
        return f"{self.rng.choice(FIRST)} {self.rng.choice(LAST)}"


def all_ids(model: type[Model]) -> list[int]:
    """All ids of a model in id order, so a seed picks the same objects on every database."""
    return list(model._default_manager.order_by("id").values_list("id", flat=True))


def pending_rows() -> int:
    """Outbox rows not yet delivered, on both databases."""
    region: int = RegionOutbox.objects.count()
    control: int = ControlOutbox.objects.count()
    return region + control


@contextmanager
def request(using: str, tally: Tally, *, sync: bool) -> Iterator[None]:
    """One request's transaction on `using`.

    sync=False leaves its outbox rows to the drain; sync=True flushes the written shards
    right after commit, and the rows that flush retired are added to `tally.flushed`.
    """
    if not sync:
        with outbox_context(transaction.atomic(using=using), flush=False):
            yield
        return
    before, written_before = pending_rows(), tally.written
    with outbox_context(transaction.atomic(using=using)):
        yield
    # The flush ran in the commit hook: whatever it delivered is gone from the tables.
    tally.sync_requests += 1
    tally.flushed += before + (tally.written - written_before) - pending_rows()


def create_population(orgs: int, rng: random.Random, tally: Tally) -> None:
    """Create `orgs` organizations (each with 3 projects and a creation audit event) and
    as many users split across the regions, all left to the drain."""
    names = Names(rng)
    with outbox_context(flush=False):
        created = Organization.objects.bulk_create(
            Organization(name=names.organization(), plan=rng.choice(Organization.Plan.values))
            for _ in range(orgs)
        )
        audit = AuditLogEntry.objects.bulk_create(
            AuditLogEntry(organization_id=org.id, event="organization.created", data=org.state())
            for org in created
        )
        projects = Project.objects.bulk_create(
            Project(organization=org, name=names.project()) for org in created for _ in range(3)
        )
        users = UserAccount.objects.bulk_create(
            UserAccount(
                email=f"user{n}@example.com", name=names.person(), region=rng.choice(REGIONS)
            )
            for n in range(orgs)
        )
    tally.written += len(created) + len(audit) + len(projects) + len(users)


def delete_some(rng: random.Random, tally: Tally) -> None:
    """Delete ~2% of projects with one queryset delete, and ~1% of organizations one by one
    (their projects go with them by cascade, and the receivers drop their mirrors)."""
    project_ids = all_ids(Project)
    org_ids = all_ids(Organization)
    with outbox_context(flush=False):
        doomed = rng.sample(project_ids, k=max(1, len(project_ids) // 50))
        _, per_model = Project.objects.filter(id__in=doomed).delete()
        tally.written += per_model.get(Project._meta.label, 0)
    # Keep at least two organizations for roll_back_requests.
    for org_id in rng.sample(org_ids, k=min(max(1, len(org_ids) // 100), len(org_ids) - 2)):
        with request("default", tally, sync=False):
            Organization.objects.get(pk=org_id).delete()
            AuditLogEntry.objects.create(organization_id=org_id, event="organization.deleted")
            tally.written += 2


class _Abort(Exception):
    """Raised to roll a transaction back."""


def roll_back_requests(rng: random.Random, tally: Tally) -> None:
    """Write marked changes in transactions (and a savepoint) that roll back.

    None of their outbox rows may survive, and no flush may deliver them; the rows left
    behind are counted in `tally.rollback_leftovers`, which must stay 0.
    """
    org_ids = rng.sample(all_ids(Organization), k=2)
    user_id = rng.choice(all_ids(UserAccount))
    before = pending_rows()
    # A synchronous-flush request that fails: nothing is written, nothing flushed.
    with suppress(_Abort), outbox_context(transaction.atomic(using="default")):
        _mark(Organization.objects.get(pk=org_ids[0]))
        AuditLogEntry.objects.create(organization_id=org_ids[0], event=ROLLBACK_MARKER)
        Organization.objects.create(name=f"{ROLLBACK_MARKER} phantom")
        raise _Abort
    # The same on the control database, left to the drain.
    with suppress(_Abort), outbox_context(transaction.atomic(using="control"), flush=False):
        _mark(UserAccount.objects.get(pk=user_id))
        raise _Abort
    tally.rollback_leftovers += pending_rows() - before
    _commit_around_a_failed_savepoint(org_ids, tally)


def _commit_around_a_failed_savepoint(org_ids: list[int], tally: Tally) -> None:
    """A committed request whose inner savepoint rolls back: only the outer change is
    delivered (by the synchronous flush); the savepoint's change never is."""
    with request("default", tally, sync=True):
        first = Organization.objects.get(pk=org_ids[0])
        first.version += 1
        first.save()
        tally.written += 1
        with suppress(_Abort), transaction.atomic(using="default"):
            _mark(Organization.objects.get(pk=org_ids[1]))
            raise _Abort


def _mark(obj: Organization | UserAccount) -> None:
    obj.name = f"{ROLLBACK_MARKER} {obj.name}"
    obj.version += 1
    obj.save()
