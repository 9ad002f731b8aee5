"""The pytest plugin of django-outboxes (entry point `django_outboxes` in `pytest11`).

Fixtures:

- `outbox_messages`: the outbox messages the test saves (`CapturedMessages`), with
  `assert_sent`, `assert_sent_once`, `assert_not_sent` and `assert_nothing_sent`.
- `outbox_eager`: flushes run inside the test transaction deliver there (see
  `outbox.testing.eager_delivery`), so that, with pytest-django,

      def test_sync(db, outbox_eager, django_capture_on_commit_callbacks):
          with django_capture_on_commit_callbacks(execute=True):
              with outbox_context(transaction.atomic()):
                  ...

  runs the receivers.

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
    """Deliver synchronous flushes inside the test transaction."""
    from outbox.testing.eager import eager_delivery

    with eager_delivery():
        yield
