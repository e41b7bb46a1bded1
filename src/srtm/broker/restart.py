"""The restart: topics, channels, their messages, bounds, shares and routes as the last
run left them (``Persistence.load`` reads them back; this puts them in place).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Protocol

from srtm.broker.message import MessageIds
from srtm.ratelimit.overflow import check_bound

if TYPE_CHECKING:
    from srtm.broker.options import BrokerOptions
    from srtm.broker.persistence import Persistence, SavedTopic
    from srtm.broker.relay import Relay
    from srtm.broker.release import Releaser
    from srtm.broker.scan import Scan
    from srtm.broker.state import Topic

log = logging.getLogger("srtm.broker")


class RestartHost(Protocol):
    """What the restart needs of the broker (srtm.broker.broker.Broker is one)."""

    ids: MessageIds

    @property
    def options(self) -> BrokerOptions: ...

    @property
    def topics(self) -> dict[str, Topic]: ...

    @property
    def persistence(self) -> Persistence: ...

    @property
    def releaser(self) -> Releaser: ...

    @property
    def relay(self) -> Relay: ...

    @property
    def scan(self) -> Scan: ...

    def topic(self, name: str) -> Topic: ...


def restore(host: RestartHost) -> None:
    """Topics, channels and the messages they held, as the last run left them."""
    saved = host.persistence.load()
    host.persistence.restoring = True
    host.ids = MessageIds(host.options.broker_id, max(saved.next_id, host.ids.last + 1))
    now = time.time_ns()
    for t in saved.topics:
        _restore_topic(host, t, now)
    host.persistence.restoring = False
    host.relay.restore(saved.routes, saved.saved_at_s)
    host.persistence.save_meta()
    restored = sum(
        t.depth + t.deferred_count + sum(c.depth + c.deferred_count for c in t.channels.values())
        for t in host.topics.values()
    )
    if restored:
        log.info("restored %d messages from %s", restored, host.options.data_dir)


def _restore_topic(host: RestartHost, saved: SavedTopic, now: int) -> None:
    topic = host.topic(saved.name)
    topic.paused = saved.paused
    if isinstance(saved.bound, dict):
        try:
            b = saved.bound
            topic.bound = check_bound(b.get("max_wait_ms"), b.get("overflow"))
        except ValueError as exc:
            log.error("topic %s: saved bound %r ignored (%s)", topic.name, saved.bound, exc)
    # What waited for tokens is booked again, not as if it arrived before this
    # run: a restart must not burst.
    topic.book_not_before_ns = now
    bucket = saved.bucket
    if (bucket or saved.held) and host.options.controller:
        # Its saved share may have been given away meanwhile: held until the
        # controller, at registration, gives it its shares again.
        topic.hold()
    elif saved.held:
        topic.hold()
    elif bucket:
        try:
            topic.shape(bucket["rate"], bucket["burst"], time.time_ns)
            host.releaser.shaped[topic.name] = topic
        except (KeyError, TypeError, ValueError) as exc:
            log.error("topic %s: saved bucket %r ignored (%s)", topic.name, bucket, exc)
    for c in saved.channels:
        ch = host.scan.watch(topic.channel(c.name))
        ch.paused = c.paused
        host.persistence.restore_channel(ch)
    host.persistence.restore_topic(topic)
    if topic.deferred_count:
        host.scan.deferring.add(topic)
