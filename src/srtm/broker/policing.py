"""Policing: publishes to a shaped topic over its bound (``srtm.ratelimit.overflow``).

Under ``refuse`` such a publish fails whole (``refuse_over_bound``); under ``block`` the
connection it came on is not read until the topic is within its bound again, and an HTTP
publish waits (``Policing``). Nothing here acts on an unshaped topic.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from srtm.protocol import ProtocolError, errors
from srtm.ratelimit.overflow import Bound, OverflowPolicy, refusal

if TYPE_CHECKING:
    from srtm.broker.state import Topic
    from srtm.broker.tcp import Client


def refuse_over_bound(topic: Topic, n: int, arrival: int, code: str = errors.E_PUB_FAILED) -> None:
    """Under ``refuse``, a publish to a topic over its bound fails whole (before any
    of it is taken, so that a publish taken in slices is never refused half-way)."""
    bound = topic.bound
    if bound is None or topic.meter is None or bound.overflow is not OverflowPolicy.REFUSE:
        return
    over = topic.over_bound_ns(arrival)
    if over > 0:
        topic.refused_over_bound += n
        why = refusal(topic.name, over + bound.max_wait_ns, bound)
        verb = code.removeprefix("E_").removesuffix("_FAILED")
        raise ProtocolError(code, f"{verb} failed: {why}")


class Policing:
    """The topics' bounds, and the connections ``block`` keeps unread."""

    def __init__(
        self,
        topics: dict[str, Topic],
        topic: Callable[[str], Topic],
        save_meta: Callable[[], None],
    ) -> None:
        self._topics = topics
        self._topic = topic
        self._save_meta = save_meta
        #: Per topic over its bound under ``block``: the connections not read until it is
        #: within it again, and the timer that looks again (``_recheck_blocked``).
        self.blocked: dict[str, set[Client]] = {}
        self._block_timers: dict[str, asyncio.TimerHandle] = {}

    def set_bound(self, topic_name: str, bound: Bound | None) -> None:
        """The topic's bound and overflow policy (it acts while the topic is shaped);
        connections it blocked are looked at again at once."""
        topic = self._topic(topic_name)
        if topic.bound != bound:
            topic.bound = bound
            self._save_meta()
        if topic_name in self.blocked:
            self._recheck_blocked(topic_name)

    def block_over_bound(self, topic: Topic, client: Client | None) -> None:
        """Under ``block``, the connection of a publish that left its topic over the
        bound is not read until the topic is within it again."""
        bound = topic.bound
        if bound is None or topic.meter is None or client is None:
            return
        if bound.overflow is not OverflowPolicy.BLOCK:
            return
        over = topic.over_bound_ns(time.time_ns())
        # A relay link carries other topics too (and what it brings was acknowledged at
        # the broker it came from): it is never blocked, it counts toward the bound.
        if over > 0 and client.identity.get("srtm_relay") is not True:
            self._block(client, topic.name, over)

    def _block(self, client: Client, topic_name: str, over_ns: int) -> None:
        """``block``: ``client`` published to a topic now over its bound by ``over_ns``:
        not read until the topic is within it again."""
        client.block_reads()
        self.blocked.setdefault(topic_name, set()).add(client)
        if topic_name not in self._block_timers:
            self._arm_recheck(topic_name, over_ns)

    def _arm_recheck(self, topic_name: str, over_ns: int) -> None:
        # The wait falls as time passes: look again when it should be within the bound,
        # and at least every second (a retuned, unshaped, held or deleted topic, a
        # closed connection: nobody stays blocked for a stale reason).
        delay = min(max(over_ns, 0) / 1e9, 1.0) + 0.001
        loop = asyncio.get_running_loop()
        self._block_timers[topic_name] = loop.call_later(delay, self._recheck_blocked, topic_name)

    def _recheck_blocked(self, topic_name: str) -> None:
        timer = self._block_timers.pop(topic_name, None)
        if timer is not None:
            timer.cancel()
        clients = self.blocked.get(topic_name)
        if not clients:
            self.blocked.pop(topic_name, None)
            return
        topic = self._topics.get(topic_name)
        over = 0
        if (
            topic is not None
            and topic.bound is not None
            and topic.bound.overflow is OverflowPolicy.BLOCK
        ):
            over = topic.over_bound_ns(time.time_ns())
        live = {c for c in clients if not c.finishing}
        if over > 0 and live:
            self.blocked[topic_name] = live
            self._arm_recheck(topic_name, over)
            return
        del self.blocked[topic_name]
        for client in live:
            if not any(client in cs for cs in self.blocked.values()):
                client.unblock_reads()

    async def within_bound(self, topic_name: str) -> None:
        """HTTP's ``block``: the publish (and its answer) waits until the topic is within
        its bound, as a TCP publisher's reads do; past ``max_wait_ms`` more of waiting,
        E_PUB_FAILED naming the limit (HTTP 503)."""
        topic = self._topics.get(topic_name)
        bound = None if topic is None else topic.bound
        if topic is None or topic.meter is None or bound is None:
            return
        if bound.overflow is not OverflowPolicy.BLOCK:
            return
        give_up = time.monotonic() + bound.max_wait_ms / 1000
        while (over := topic.over_bound_ns(time.time_ns())) > 0:
            if time.monotonic() >= give_up:
                why = refusal(topic_name, over + bound.max_wait_ns, bound)
                raise ProtocolError(errors.E_PUB_FAILED, f"PUB failed: {why}")
            await asyncio.sleep(min(over / 1e9, give_up - time.monotonic(), 1.0) + 0.001)
            if self._topics.get(topic_name) is not topic or topic.bound is not bound:
                return  # deleted, or its bound changed: published as it is now
