"""The pytest plugin of django-outboxes (entry point `django_outboxes` in `pytest11`).

Fixtures:

- `outbox_messages`: the outbox messages the test saves (`CapturedMessages`), with
  `assert_sent`, `assert_sent_once`, `assert_not_sent` and `assert_nothing_sent`.
- `outbox_eager`: flushes run inside any open transaction deliver there (see
  `outbox.testing.eager_delivery`). With pytest-django,

      def test_sync(db, django_capture_on_commit_callbacks):
          with django_capture_on_commit_callbacks(execute=True):
              with outbox_context(transaction.atomic()):
                  ...

  runs the receivers without it; it is needed only where the test opens a transaction
  of its own around the capture.

pytest loads this module before pytest-django sets Django up, so it imports the
helpers (and through them the models) only when a fixture runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from outbox.testing.capture import CapturedMessages


@pytest.fixture
def outbox_messages() -> Iterator[CapturedMessages]:
    """The outbox messages saved during the test."""
    from outbox.testing.capture import capture_outbox_messages

    with capture_outbox_messages() as captured:
        yield captured


@pytest.fixture
def outbox_eager() -> Iterator[None]:
    """Deliver synchronous flushes inside any open transaction of the test."""
    from outbox.testing.eager import eager_delivery

    with eager_delivery():
        yield
