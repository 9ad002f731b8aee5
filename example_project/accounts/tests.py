"""The example's receivers, tested with outbox.testing in plain Django TestCases.

A TestCase never commits: under `captureOnCommitCallbacks(execute=True)` a flush
delivers inside the test's transaction, and `OutboxTestMixin` adds assertions on what
was sent and plays the drain with `deliverOutboxPending()`, so these tests see what the
receivers wrote.

    python example_project/manage.py test accounts
"""

from __future__ import annotations

from django.db import transaction
from django.test import TestCase

from accounts.billing import ENDPOINT as BILLING
from accounts.models import Organization, OrganizationMirror, UserAccount, UserMirror, WebhookCall
from accounts.outboxes import Category
from outbox import outbox_context
from outbox.models import ControlOutbox, RegionOutbox
from outbox.testing import OutboxTestMixin


class RegionReceiverTests(OutboxTestMixin, TestCase):
    databases = {"default", "control"}

    def test_a_flushed_organization_reaches_the_mirror_and_billing(self):
        with (
            self.captureOnCommitCallbacks(using="default", execute=True),
            outbox_context(transaction.atomic(using="default")),
        ):
            acme = Organization.objects.create(name="Acme")
        self.assertOutboxSentOnce(
            Category.ORGANIZATION_UPDATE, object_identifier=acme.id, payload=acme.state()
        )
        self.assertEqual(OrganizationMirror.objects.get(id=acme.id).state(), acme.state())
        billing = WebhookCall.objects.get(endpoint=BILLING, object_id=acme.id)
        self.assertEqual(billing.payload, acme.state())
        self.assertFalse(RegionOutbox.objects.exists())

    def test_the_drain_delivers_only_the_newest_state(self):
        with outbox_context(flush=False):
            acme = Organization.objects.create(name="Acme")
            for name in ("Acme Inc.", "Acme Ltd."):
                acme.name = name
                acme.save()
        self.assertEqual(len(self.outbox_messages), 3)
        self.assertFalse(OrganizationMirror.objects.exists())  # left to the drain
        self.assertEqual(self.deliverOutboxPending(), 1)  # one group: one receiver call
        self.assertEqual(OrganizationMirror.objects.get(id=acme.id).name, "Acme Ltd.")
        self.assertEqual(WebhookCall.objects.filter(endpoint=BILLING).count(), 1)

    def test_a_delete_sends_no_payload_and_drops_the_mirror(self):
        with self.captureOnCommitCallbacks(using="default", execute=True):
            with outbox_context(transaction.atomic(using="default")):
                acme = Organization.objects.create(name="Acme")
            acme_id = acme.id
            with outbox_context(transaction.atomic(using="default")):
                acme.delete()
        self.assertOutboxSent(Category.ORGANIZATION_UPDATE, object_identifier=acme_id, payload=None)
        self.assertFalse(OrganizationMirror.objects.filter(id=acme_id).exists())


class ControlReceiverTests(OutboxTestMixin, TestCase):
    databases = {"default", "control"}

    def test_a_user_is_replicated_to_its_region(self):
        with (
            self.captureOnCommitCallbacks(using="control", execute=True),
            outbox_context(transaction.atomic(using="control")),
        ):
            user = UserAccount.objects.create(email="ada@example.com", name="Ada", region="eu")
        self.assertOutboxSentOnce(Category.USER_UPDATE, object_identifier=user.id)
        mirror = UserMirror.objects.get(region="eu", user_id=user.id)
        self.assertEqual(mirror.email, "ada@example.com")
        self.assertFalse(UserMirror.objects.filter(region="us").exists())
        self.assertFalse(ControlOutbox.objects.exists())
