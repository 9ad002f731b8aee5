"""outbox.testing with unittest: `OutboxTestMixin` on a `django.test.TestCase`, and the
clear error a flush raises inside `captureOnCommitCallbacks(execute=True)` without it."""

from django.db import transaction
from django.test import TestCase, override_settings

from outbox import outbox_context
from outbox.exceptions import FlushInOpenTransaction
from outbox.models import RegionOutbox
from outbox.testing import OutboxTestMixin
from tests.factories import RegionOutboxFactory
from tests.testapp.categories import Category
from tests.testapp.receivers import recorder


class OutboxTestMixinTests(OutboxTestMixin, TestCase):
    databases = {"default", "control"}

    def setUp(self):
        super().setUp()
        recorder.reset()
        self.addCleanup(recorder.reset)

    def test_receivers_run_under_capture_on_commit_callbacks(self):
        with (
            self.captureOnCommitCallbacks(execute=True),
            outbox_context(transaction.atomic()),
        ):
            RegionOutboxFactory(object_identifier=3, payload={"v": "old"})
            RegionOutboxFactory(object_identifier=3, payload={"v": "new"})
        self.assertEqual(recorder.payloads(), [{"v": "new"}])
        self.assertFalse(RegionOutbox.objects.exists())
        self.assertOutboxSent(Category.AUDIT_EVENT, object_identifier=3)
        self.assertOutboxSentOnce(Category.AUDIT_EVENT, payload={"v": "new"})
        self.assertOutboxNotSent(Category.ORGANIZATION_UPDATE)

    def test_rows_left_to_the_drain_are_delivered_on_demand(self):
        with outbox_context(flush=False):
            RegionOutboxFactory(payload={"v": 1})
        self.assertEqual(recorder.calls, [])
        self.assertEqual(self.deliverOutboxPending(), 1)
        self.assertEqual(recorder.payloads(), [{"v": 1}])

    def test_nothing_sent(self):
        self.assertNothingSentToOutbox()
        with outbox_context(flush=False):
            RegionOutboxFactory()
        with self.assertRaises(AssertionError):
            self.assertNothingSentToOutbox()


class RaisingOutboxTestMixinTests(OutboxTestMixin, TestCase):
    outbox_raise_errors = True

    def test_receiver_errors_are_raised(self):
        recorder.reset()
        self.addCleanup(recorder.reset)
        recorder.failing = {7}
        with (
            self.assertRaisesMessage(RuntimeError, "receiver failed for shard 7"),
            self.captureOnCommitCallbacks(execute=True),
            outbox_context(transaction.atomic()),
        ):
            RegionOutboxFactory(shard_identifier=7)
        self.assertEqual(RegionOutbox.objects.get().attempts, 1)


class WithoutHelpersTests(TestCase):
    def test_flush_in_the_open_test_transaction_raises_a_clear_error(self):
        recorder.reset()
        self.addCleanup(recorder.reset)
        with (
            self.assertRaisesMessage(FlushInOpenTransaction, "outbox.testing.eager_delivery()"),
            self.captureOnCommitCallbacks(execute=True),
            outbox_context(transaction.atomic()),
        ):
            RegionOutboxFactory()
        self.assertEqual(recorder.calls, [])
        self.assertEqual(RegionOutbox.objects.count(), 1)

    @override_settings(OUTBOX_FLUSH_STRICT=False)
    def test_the_error_is_raised_without_strict_mode(self):
        with (
            self.assertRaisesMessage(FlushInOpenTransaction, "TransactionTestCase"),
            self.captureOnCommitCallbacks(execute=True),
            outbox_context(transaction.atomic()),
        ):
            RegionOutboxFactory()

    def test_without_capture_nothing_is_flushed_and_nothing_raises(self):
        with outbox_context(transaction.atomic()):
            RegionOutboxFactory()
        self.assertEqual(RegionOutbox.objects.count(), 1)
