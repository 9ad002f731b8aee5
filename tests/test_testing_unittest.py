"""outbox.testing with unittest: `OutboxTestMixin` on a `django.test.TestCase`; a plain
`TestCase` whose `captureOnCommitCallbacks(execute=True)` delivers without it; and the
clear error of a flush run inside a transaction the test opened itself."""

from django.db import transaction
from django.test import TestCase, override_settings

from outbox import outbox_context
from outbox.exceptions import FlushInOpenTransaction
from outbox.models import ControlOutbox, RegionOutbox
from outbox.testing import OutboxTestMixin
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
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
    """Django's own idiom, no mixin: the flush that captureOnCommitCallbacks(execute=True)
    runs inside the test's transaction delivers there."""

    databases = {"default", "control"}

    def setUp(self):
        recorder.reset()
        self.addCleanup(recorder.reset)

    def test_capture_on_commit_callbacks_delivers_to_the_receivers(self):
        with (
            self.captureOnCommitCallbacks(execute=True),
            outbox_context(transaction.atomic()),
        ):
            RegionOutboxFactory(object_identifier=3, payload={"v": "old"})
            RegionOutboxFactory(object_identifier=3, payload={"v": "new"})
        self.assertEqual(recorder.payloads(), [{"v": "new"}])  # coalesced, as in production
        self.assertFalse(RegionOutbox.objects.exists())

    def test_a_control_outbox_is_delivered_on_its_database(self):
        with (
            self.captureOnCommitCallbacks(execute=True, using="control"),
            outbox_context(transaction.atomic(using="control")),
        ):
            ControlOutboxFactory(payload={"v": "c"})
        self.assertEqual(recorder.payloads(), [{"v": "c"}])
        self.assertFalse(ControlOutbox.objects.using("control").exists())

    def test_a_failing_receiver_is_recorded_as_in_production(self):
        recorder.failing = {7}
        with (
            self.assertLogs("outbox", "WARNING"),
            self.captureOnCommitCallbacks(execute=True),
            outbox_context(transaction.atomic()),
        ):
            RegionOutboxFactory(shard_identifier=7)
        self.assertEqual(recorder.calls, [])
        self.assertEqual(RegionOutbox.objects.get().attempts, 1)

    def test_without_capture_nothing_is_flushed_and_nothing_raises(self):
        with outbox_context(transaction.atomic()):
            RegionOutboxFactory()
        self.assertEqual(RegionOutbox.objects.count(), 1)


class FlushInsideTheTestsOwnTransactionTests(TestCase):
    """The capture ends inside a transaction the test opened itself: outside a test
    nothing would be flushed yet, so nothing is delivered, and the error says why."""

    def setUp(self):
        recorder.reset()
        self.addCleanup(recorder.reset)

    def test_the_flush_raises_a_clear_error(self):
        with transaction.atomic():
            with (
                self.assertRaisesMessage(FlushInOpenTransaction, "End the capture outside"),
                self.captureOnCommitCallbacks(execute=True),
                outbox_context(transaction.atomic()),
            ):
                RegionOutboxFactory()
            self.assertEqual(recorder.calls, [])
            self.assertEqual(RegionOutbox.objects.count(), 1)

    @override_settings(OUTBOX_FLUSH_STRICT=False)
    def test_the_error_is_raised_without_strict_mode(self):
        with (
            self.assertRaisesMessage(FlushInOpenTransaction, "outbox.testing.eager_delivery()"),
            transaction.atomic(),
            self.captureOnCommitCallbacks(execute=True),
            outbox_context(transaction.atomic()),
        ):
            RegionOutboxFactory()
        self.assertEqual(recorder.calls, [])
