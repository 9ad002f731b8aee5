"""The update mix: single saves, bulk_update and queryset.update, on skewed hot objects.

A few hot organizations, projects and users take most of the changes, as in real
traffic: that is what makes coalescing matter. Most requests leave their rows to the
drain; a small share flush synchronously right after commit.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from django.db import transaction
from django.db.models import CharField, F, Value
from django.db.models.functions import Cast, Concat

from accounts.demo.traffic import Names, Tally, all_ids, request
from accounts.models import REGIONS, AuditLogEntry, Organization, Project, UserAccount
from outbox import outbox_context

# Share of single-object requests that flush right after commit instead of waiting.
SYNC_SHARE = 0.05


class HotPicker:
    """Picks ids with a Zipf-like skew (the k-th hottest id has weight 1/k)."""

    def __init__(self, ids: list[int], rng: random.Random) -> None:
        self.rng = rng
        self.ids = list(ids)
        rng.shuffle(self.ids)
        self.weights = list(itertools.accumulate(1 / rank for rank in range(1, len(ids) + 1)))

    def pick(self, k: int = 1) -> list[int]:
        """Up to `k` distinct ids (fewer when hot ids are drawn twice)."""
        drawn = self.rng.choices(self.ids, cum_weights=self.weights, k=k)
        return list(dict.fromkeys(drawn))


class UpdateMix:
    """Applies a budget of object changes through every write path of the producers."""

    def __init__(self, rng: random.Random, tally: Tally) -> None:
        self.rng = rng
        self.tally = tally
        self.names = Names(rng)
        self.orgs = HotPicker(all_ids(Organization), rng)
        self.projects = HotPicker(all_ids(Project), rng)
        self.users = HotPicker(all_ids(UserAccount), rng)

    def run(self, budget: int) -> None:
        """Change objects until `budget` changes were made (one outbox row per change)."""
        actions: dict[Callable[[int], int], int] = {
            self.rename_organization: 60,
            self.edit_project: 80,
            self.edit_user: 60,
            self.bulk_edit_projects: 5,
            self.bulk_edit_users: 3,
            self.change_plans: 6,
            self.archive_projects: 6,
            self.move_email_domain: 3,
        }
        choices, weights = list(actions), list(actions.values())
        while self.tally.updates < budget:
            action = self.rng.choices(choices, weights)[0]
            changed: int = action(budget - self.tally.updates)
            self.tally.updates += changed

    def _sync(self) -> bool:
        return self.rng.random() < SYNC_SHARE

    # Single saves, one request each. Each returns the number of objects changed.

    def rename_organization(self, limit: int) -> int:
        [org_id] = self.orgs.pick()
        with request("default", self.tally, sync=self._sync()):
            org = Organization.objects.get(pk=org_id)
            org.name = self.names.organization()
            org.version += 1
            org.save()
            AuditLogEntry.objects.create(
                organization_id=org_id, event="organization.renamed", data={"name": org.name}
            )
            self.tally.written += 2
        return 1

    def edit_project(self, limit: int) -> int:
        [project_id] = self.projects.pick()
        with request("default", self.tally, sync=self._sync()):
            project = Project.objects.get(pk=project_id)
            project.name = self.names.project()
            project.version += 1
            project.save()
            self.tally.written += 1
        return 1

    def edit_user(self, limit: int) -> int:
        [user_id] = self.users.pick()
        with request("control", self.tally, sync=self._sync()):
            user = UserAccount.objects.get(pk=user_id)
            user.name = self.names.person()
            user.version += 1
            user.save()
            self.tally.written += 1
        return 1

    # bulk_update: one statement for many objects, one outbox row each.

    def bulk_edit_projects(self, limit: int) -> int:
        ids = self.projects.pick(min(self.rng.randint(20, 50), limit))
        with outbox_context(flush=False):
            projects = list(Project.objects.filter(id__in=ids).order_by("id"))
            for project in projects:
                project.name = self.names.project()
                project.version += 1
            Project.objects.bulk_update(projects, ["name", "version"])
        self.tally.written += len(projects)
        return len(projects)

    def bulk_edit_users(self, limit: int) -> int:
        ids = self.users.pick(min(self.rng.randint(10, 40), limit))
        with outbox_context(flush=False):
            users = list(UserAccount.objects.filter(id__in=ids).order_by("id"))
            for user in users:
                user.name = self.names.person()
                user.version += 1
            UserAccount.objects.bulk_update(users, ["name", "version"])
        self.tally.written += len(users)
        return len(users)

    # queryset.update: the producer re-reads the changed rows to write their messages.

    def change_plans(self, limit: int) -> int:
        ids = self.orgs.pick(min(self.rng.randint(5, 15), limit))
        plan = self.rng.choice(Organization.Plan.values)
        with outbox_context(transaction.atomic(using="default"), flush=False):
            changed: int = Organization.objects.filter(id__in=ids).update(
                plan=plan, version=F("version") + 1
            )
            audit = AuditLogEntry.objects.bulk_create(
                AuditLogEntry(
                    organization_id=org_id, event="organization.plan_changed", data={"plan": plan}
                )
                for org_id in ids
            )
        self.tally.written += changed + len(audit)
        return changed

    def archive_projects(self, limit: int) -> int:
        org_ids = self.orgs.pick(self.rng.randint(1, 3))
        ids = list(
            Project.objects.filter(organization_id__in=org_ids)
            .order_by("id")
            .values_list("id", flat=True)[:limit]
        )
        status = self.rng.choice(Project.Status.values)
        with outbox_context(flush=False):
            changed: int = Project.objects.filter(id__in=ids).update(
                status=status, version=F("version") + 1
            )
        self.tally.written += changed
        return changed

    def move_email_domain(self, limit: int) -> int:
        ids = self.users.pick(min(self.rng.randint(10, 40), limit))
        domain = f"{self.rng.choice(REGIONS)}.example.com"
        email = Concat(Value("user"), Cast("id", CharField()), Value(f"@{domain}"))
        with outbox_context(flush=False):
            changed: int = UserAccount.objects.filter(id__in=ids).update(
                email=email, version=F("version") + 1
            )
        self.tally.written += changed
        return changed
