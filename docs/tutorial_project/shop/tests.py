import io
from contextlib import redirect_stdout

from django.test import TestCase

from outbox.testing import OutboxTestMixin
from shop.models import Organization
from shop.outboxes import Category
from shop.services import rename


class RenameTests(OutboxTestMixin, TestCase):
    """A plain Django TestCase; the mixin adds assertions on what was sent and
    deliverOutboxPending(), which plays the drain."""

    def test_the_receiver_sees_the_new_name(self):
        acme = Organization.objects.create(name="Acme")
        with (
            redirect_stdout(io.StringIO()) as out,
            self.captureOnCommitCallbacks(execute=True),
        ):
            rename(acme, "Acme Corporation")  # flushed at the end of the block
        self.assertEqual(
            out.getvalue(), f"organization {acme.id} is now called 'Acme Corporation'\n"
        )
        self.assertOutboxSentOnce(
            Category.ORGANIZATION_UPDATE,
            object_identifier=acme.id,
            payload={"name": "Acme Corporation"},
        )

    def test_the_drain_delivers_only_the_newest_name(self):
        acme = Organization.objects.create(name="Acme")
        with redirect_stdout(io.StringIO()) as out:
            rename(acme, "Acme Inc.", flush=False)
            rename(acme, "Acme Ltd.", flush=False)
            self.assertEqual(out.getvalue(), "")  # left to the drain
            self.assertEqual(self.deliverOutboxPending(), 1)  # one call for both rows
        self.assertEqual(out.getvalue(), f"organization {acme.id} is now called 'Acme Ltd.'\n")
