"""A relay's calls made at once by the drain's slot threads go out as one publish: many
shards per batch, at most one message of a shard, each shard in order, and a failure
reported for one message fails only that message's shard."""

import threading
import time
import uuid
from collections import defaultdict

import pytest

from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox
from outbox.relays import Relay, batch_receiver
from outbox.relays.batching import Batcher
from outbox.relays.message import Message
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.testapp.categories import Category, Scope


def message(shard: int) -> Message:
    return Message(
        message_id=uuid.uuid4(),
        category=Category.AUDIT_EVENT,
        scope=Scope.ORGANIZATION,
        shard_identifier=shard,
        object_identifier=shard,
        payload={},
    )


class SlowPublish:
    """A publish that takes `seconds`, records each batch, and fails the shards asked."""

    def __init__(self, seconds=0.03, failing=(), raising=False):
        self.seconds = seconds
        self.failing = set(failing)
        self.raising = raising
        self.batches = []
        self.lock = threading.Lock()

    def __call__(self, messages):
        with self.lock:
            self.batches.append(list(messages))
        time.sleep(self.seconds)
        if self.raising:
            raise ConnectionError("broker gone")
        return {
            m.message_id: RuntimeError(f"refused {m.shard_identifier}")
            for m in messages
            if m.shard_identifier in self.failing
        }


def send_at_once(batcher, messages):
    """Each message sent from a thread of its own, all started together; the answers."""
    answers = {}
    start = threading.Barrier(len(messages))

    def send(m):
        start.wait()
        answers[m.shard_identifier] = batcher.send(m)

    threads = [threading.Thread(target=send, args=(m,)) for m in messages]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return answers


def test_calls_made_at_once_share_publishes_and_get_their_own_answers():
    publish = SlowPublish(failing={3, 7})
    answers = send_at_once(Batcher(publish), [message(n) for n in range(16)])
    assert sorted(answers) == list(range(16))
    assert {n for n, failure in answers.items() if failure is not None} == {3, 7}
    assert str(answers[3]) == "refused 3"
    published = [m.shard_identifier for batch in publish.batches for m in batch]
    assert sorted(published) == list(range(16))  # each once
    assert len(publish.batches) < 16 and max(map(len, publish.batches)) > 1


def test_a_publish_that_raises_fails_every_message_of_its_batch_only():
    publish = SlowPublish(raising=True)
    answers = send_at_once(Batcher(publish), [message(n) for n in range(8)])
    assert all(isinstance(failure, ConnectionError) for failure in answers.values())
    assert len(answers) == 8


def test_batches_keep_to_max_batch():
    publish = SlowPublish()
    answers = send_at_once(Batcher(publish, max_batch=3), [message(n) for n in range(12)])
    assert len(answers) == 12 and all(failure is None for failure in answers.values())
    assert max(map(len, publish.batches)) <= 3


def test_one_caller_at_a_time_publishes_one_message_each():
    publish = SlowPublish(seconds=0)
    batcher = Batcher(publish)
    for n in range(5):
        assert batcher.send(message(n)) is None
    assert [len(batch) for batch in publish.batches] == [1] * 5


@pytest.fixture
def batch_relay():
    made = []

    def make(publish):
        relay = batch_receiver(Category.AUDIT_EVENT, name="test-batch-relay")(publish)
        made.append(relay)
        return relay

    yield make
    for relay in made:
        relay.disconnect()


@committing
def test_a_drain_hands_a_relay_many_shards_at_once_each_in_order(settings, batch_relay):
    settings.OUTBOX_CONCURRENCY = 8
    publish = SlowPublish(seconds=0.02, failing={5})
    relay = batch_relay(publish)
    assert isinstance(relay, Relay)
    RegionOutbox.objects.bulk_create(
        [
            RegionOutboxFactory.build(shard_identifier=shard, object_identifier=shard * 100 + n)
            for shard in range(8)
            for n in range(4)
        ]
    )
    drain_outboxes([RegionOutbox])

    per_shard = defaultdict(list)
    for batch in publish.batches:
        shards = [m.shard_identifier for m in batch]
        assert len(shards) == len(set(shards)), "two messages of one shard in one batch"
        for m in batch:
            per_shard[m.shard_identifier].append(m.object_identifier)
    assert any(len(batch) > 1 for batch in publish.batches)
    for shard in range(8):
        expected = [shard * 100 + n for n in range(4)]
        if shard == 5:
            assert per_shard[5] == expected[:1]  # stopped at its failure
        else:
            assert per_shard[shard] == expected
    left = RegionOutbox.objects.values_list("shard_identifier", flat=True)
    assert set(left) == {5} and len(left) == 4
