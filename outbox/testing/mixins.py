"""`OutboxTestMixin`: the testing helpers as methods of a unittest / Django test case."""

from __future__ import annotations

from typing import Any

from outbox.categories import OutboxCategory
from outbox.testing.capture import CapturedMessage, CapturedMessages, capture_outbox_messages
from outbox.testing.eager import deliver_pending, eager_delivery


class OutboxTestMixin:
    """Mix into a `django.test.TestCase` (before it): every test then captures the outbox
    messages it saves (`self.outbox_messages`) and, when `outbox_eager_delivery` is
    True (the default), runs under `eager_delivery()`: a flush that

        with self.captureOnCommitCallbacks(execute=True):
            with outbox_context(transaction.atomic()):
                ...

    runs delivers inside the test's transaction (as it does without the mixin), even
    where the test opened a transaction of its own around the capture. Set
    `outbox_raise_errors = True` to raise receiver errors.
    """

    outbox_eager_delivery = True
    outbox_raise_errors = False
    outbox_messages: CapturedMessages

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        capture = capture_outbox_messages()
        self.outbox_messages = capture.__enter__()
        self.addCleanup(capture.__exit__, None, None, None)  # type: ignore[attr-defined]
        if self.outbox_eager_delivery:
            eager = eager_delivery(raise_errors=self.outbox_raise_errors)
            eager.__enter__()
            self.addCleanup(eager.__exit__, None, None, None)  # type: ignore[attr-defined]

    def assertOutboxSent(
        self, category: OutboxCategory | int | None = None, **filters: Any
    ) -> list[CapturedMessage]:
        return self.outbox_messages.assert_sent(category, **filters)

    def assertOutboxSentOnce(
        self, category: OutboxCategory | int | None = None, **filters: Any
    ) -> CapturedMessage:
        return self.outbox_messages.assert_sent_once(category, **filters)

    def assertOutboxNotSent(
        self, category: OutboxCategory | int | None = None, **filters: Any
    ) -> None:
        self.outbox_messages.assert_not_sent(category, **filters)

    def assertNothingSentToOutbox(self) -> None:
        self.outbox_messages.assert_nothing_sent()

    def deliverOutboxPending(self, using: str | None = None) -> int:
        """Deliver the rows left to the drain now (see `deliver_pending`)."""
        return deliver_pending(using, raise_errors=self.outbox_raise_errors)
