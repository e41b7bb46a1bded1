"""The release loop's bookings: each shaped topic is looked at when its next release is
due, not on every release of every other shaped topic, and a booking that went stale
(a bucket retuned, a topic replaced) neither loses nor doubles a release."""

from __future__ import annotations

import gc
import weakref

from srtm.broker.options import BrokerOptions
from srtm.broker.release import Releaser
from srtm.broker.state import Channel, Topic, memory_queues
from srtm.broker.stats import BrokerStats

S = 1_000_000_000
T0 = 1_000 * S


def releaser() -> tuple[Releaser, dict[str, Topic]]:
    topics: dict[str, Topic] = {}

    def ready(_: Channel, __: bool = False) -> None:
        pass

    return Releaser(BrokerOptions(), topics, BrokerStats(), ready, ready), topics


def shaped(rel: Releaser, topics: dict[str, Topic], name: str, rate: float, n: int) -> Topic:
    """A topic with a channel, a bucket of ``rate``/s and burst 1, and ``n`` messages
    published at T0: due at T0, T0 + 1/rate, ..."""
    topic = Topic(name, memory_queues())
    topic.channel("c")
    topic.shape(rate, 1.0, lambda: T0)
    topics[name] = rel.shaped[name] = topic
    ids = [(name.encode() + b"--")[:3] + b"%013d" % i for i in range(n)]  # 16 bytes
    topic.put_many(ids, [b"m"] * n, T0, T0, "p")
    rel.kick(topic)
    return topic


def delivered(topic: Topic) -> int:
    return topic.channels["c"].depth


def test_each_topic_is_released_when_its_own_release_is_due() -> None:
    rel, topics = releaser()
    many = [shaped(rel, topics, f"t{k}", 1 / (k + 1), 2) for k in range(50)]
    assert rel.release_shaped(T0) == T0 + S  # every first message; t0's second is next
    assert [delivered(t) for t in many] == [1] * 50
    nxt = rel.release_shaped(T0 + 5 * S // 2)
    assert nxt is not None and abs(nxt - (T0 + 3 * S)) <= 1  # t2's second (1 ns rounding)
    assert [delivered(t) for t in many[:3]] == [2, 2, 1]
    assert rel.release_shaped(T0 + 100 * S) is None
    assert all(delivered(t) == 2 for t in many)


def test_a_topic_retuned_slower_is_released_at_its_new_time_not_its_booking() -> None:
    rel, topics = releaser()
    topic = shaped(rel, topics, "t", 1.0, 2)
    assert rel.release_shaped(T0) == T0 + S
    topic.shape(0.25, 1.0, lambda: T0)  # the second message is now due at T0 + 4 s
    rel.kick(topic)
    assert rel.release_shaped(T0 + S) == T0 + 4 * S  # the old booking came up early
    assert delivered(topic) == 1
    assert rel.release_shaped(T0 + 4 * S) is None
    assert delivered(topic) == 2


def test_a_topic_replaced_under_its_name_is_released_by_its_own_booking() -> None:
    rel, topics = releaser()
    old = shaped(rel, topics, "t", 1.0, 2)
    assert rel.release_shaped(T0) == T0 + S
    del rel.shaped["t"]  # deleted with its second message waiting (booked at T0 + 1 s)
    new = Topic("t", memory_queues())
    new.channel("c")
    new.shape(0.1, 1.0, lambda: T0 + 5 * S)
    topics["t"] = rel.shaped["t"] = new
    new.put_many([b"n--0000000000000"], [b"m"], T0 + 5 * S, T0 + 5 * S, "p")
    rel.kick(new)  # due at T0 + 5 s: later than the old topic's booking
    rel.release_shaped(T0 + S)
    assert delivered(old) == 1 and delivered(new) == 0
    assert rel.release_shaped(T0 + 5 * S) is None
    assert delivered(new) == 1 and delivered(old) == 1


def test_stale_bookings_do_not_pile_up() -> None:
    """A topic retuned faster again and again leaves a stale booking each time; the heap
    is rebuilt from the live ones before they pile up, and nothing is lost."""
    rel, topics = releaser()
    topic = shaped(rel, topics, "t", 0.001, 2)  # the second message due in 1,000 s
    assert rel.release_shaped(T0) == T0 + 1_000 * S
    for k in range(1_000):
        topic.shape(0.001 + k * 0.001, 1.0, lambda: T0)  # sooner every time
        rel.kick(topic)
    assert len(rel._heap) <= 2 * len(rel._booked) + 64
    assert rel.release_shaped(T0 + 2 * S) is None
    assert delivered(topic) == 2


def test_a_topic_no_longer_shaped_is_not_kept_by_its_booking() -> None:
    """Deleted (or held, or unmanaged) with a release booked far ahead: the loop's heap
    lets go of it, and of what waits in it, at once."""
    rel, topics = releaser()
    topic = shaped(rel, topics, "t", 0.001, 2)  # the second message booked 1,000 s ahead
    assert rel.release_shaped(T0) == T0 + 1_000 * S
    kept = weakref.ref(topic)
    rel.unshape("t")
    del topics["t"], topic
    gc.collect()
    assert "t" not in rel.shaped
    assert kept() is None  # nothing of the loop's holds the topic any more
    assert rel.release_shaped(T0 + 1_000 * S) is None


def test_an_on_time_release_is_sent_before_it_is_accounted() -> None:
    """The dispatch comes first (the release's lateness is measured at it), the token
    wait after: both happen, in that order."""
    topics: dict[str, Topic] = {}
    stats = BrokerStats()
    seen: list[int] = []

    def mark_ready(_: Channel) -> None:
        raise AssertionError("an on-time release is dispatched at once")

    def dispatch(ch: Channel) -> None:
        seen.append(len(stats.topic(ch.topic).token_wait.pending))

    rel = Releaser(BrokerOptions(), topics, stats, mark_ready, dispatch)
    topic = shaped(rel, topics, "t", 1.0, 2)
    assert rel.release_shaped(T0) == T0 + S
    assert rel.release_shaped(T0 + S) is None
    assert seen == [0, 1]  # each dispatched before its own token wait was added
    assert list(stats.topic("t").token_wait.pending) == [0, S]
    assert delivered(topic) == 2
