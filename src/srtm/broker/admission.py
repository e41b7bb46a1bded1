"""Consumer admission control, per topic (sans-I/O): how many consumers of each class the
topic admits, who is connected in each class (oldest first), and whom to disconnect when
a count falls.

A consumer is one channel subscription of the topic (one SUB), in the class its IDENTIFY
named (``srtm_class``; plain NSQ consumers are ``default``). A class with no admitted
count is unlimited: with no counts set, nothing is refused. SUB costs one dict lookup and
one insertion; nothing is done per message. ``Admissions`` is a broker's, per topic name.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from srtm.protocol import ProtocolError
from srtm.protocol.session import E_SUB_FAILED


class NotAdmitted(ProtocolError):
    """A SUB beyond its class's admitted count: E_SUB_FAILED, but not fatal (unlike nsqd's
    E_SUB_FAILED), so the client may SUB again on the same connection later."""

    def __init__(self, topic: str, klass: str, admitted: int) -> None:
        super().__init__(
            E_SUB_FAILED,
            f"SUB failed: class {klass!r} of topic {topic!r} admits {admitted} consumers "
            "and has them; retry later",
        )
        self.klass, self.admitted = klass, admitted

    @property
    def fatal(self) -> bool:
        return False


@dataclass
class Admission:
    """One topic's admitted counts and connected consumers per class."""

    topic: str
    #: Admitted count per class; a class not here is unlimited.
    admitted: dict[str, int] = field(default_factory=dict)
    #: Classes by importance, most important first (classes not listed rank below them).
    order: list[str] = field(default_factory=list)
    #: Connected consumers per class, oldest first (a dict keeps insertion order and
    #: removes in O(1)).
    connected: dict[str, dict[Hashable, None]] = field(default_factory=dict)
    #: Consumers refused per class and still connected (they retry): with ``connected``,
    #: the demand a controller's optimizer reads as the class's ``available``.
    waiting: dict[str, dict[Hashable, None]] = field(default_factory=dict)

    def check(self, klass: str) -> None:
        """Raise NotAdmitted if one more consumer of ``klass`` is beyond its count."""
        limit = self.admitted.get(klass)
        if limit is not None and len(self.connected.get(klass, ())) >= limit:
            raise NotAdmitted(self.topic, klass, limit)

    def join(self, klass: str, consumer: Hashable) -> None:
        self.connected.setdefault(klass, {})[consumer] = None
        self.gave_up(klass, consumer)

    def refused(self, klass: str, consumer: Hashable) -> None:
        """``consumer`` asked and was refused: it waits (until it joins or goes)."""
        self.waiting.setdefault(klass, {})[consumer] = None

    def gave_up(self, klass: str, consumer: Hashable) -> None:
        members = self.waiting.get(klass)
        if members is not None:
            members.pop(consumer, None)
            if not members:
                del self.waiting[klass]

    def demand(self) -> dict[str, int]:
        """Consumers per class that asked: connected and waiting."""
        out = {k: len(m) for k, m in self.connected.items()}
        for k, m in self.waiting.items():
            out[k] = out.get(k, 0) + len(m)
        return out

    def leave(self, klass: str, consumer: Hashable) -> None:
        members = self.connected.get(klass)
        if members is not None:
            members.pop(consumer, None)
            if not members:
                del self.connected[klass]

    @property
    def idle(self) -> bool:
        """Nothing set and nobody connected: the broker may forget it."""
        return not self.admitted and not self.order and not self.connected and not self.waiting

    def rank(self) -> list[str]:
        """Every class known (counted or connected), most important first."""
        known = set(self.admitted) | set(self.connected) | set(self.order)
        listed = [k for k in self.order if k in known]
        return listed + sorted(known - set(listed))

    def set(self, admitted: Mapping[str, int], order: Sequence[str]) -> list[Hashable]:
        """New counts and order; returns the consumers now beyond their class's count, to
        disconnect (they have left already): the lowest class first, and within a class
        the newest first."""
        self.admitted = dict(admitted)
        self.order = list(order)
        out: list[Hashable] = []
        for klass in reversed(self.rank()):
            limit = self.admitted.get(klass)
            members = self.connected.get(klass)
            if limit is None or members is None:
                continue
            excess = len(members) - limit
            if excess <= 0:
                continue
            newest = list(members)[-excess:]
            newest.reverse()
            for consumer in newest:
                self.leave(klass, consumer)
            out += newest
        return out

    def counts(self) -> list[tuple[str, int | None, int]]:
        """(class, admitted count or None: unlimited, connected), most important first."""
        return [(k, self.admitted.get(k), len(self.connected.get(k, ()))) for k in self.rank()]


class Admissions(Mapping[str, Admission]):
    """A broker's admission per topic name (read as a mapping): set before or after the
    topic exists, forgotten once nothing is set and nobody connected. Also, per consumer
    refused, the topics it waits for (it counts in their demand until it joins or goes)."""

    def __init__(self) -> None:
        self._topics: dict[str, Admission] = {}
        self._refused: dict[Hashable, set[str]] = {}

    def __getitem__(self, topic: str) -> Admission:
        return self._topics[topic]

    def __iter__(self) -> Iterator[str]:
        return iter(self._topics)

    def __len__(self) -> int:
        return len(self._topics)

    def check(self, topic: str, klass: str, consumer: Hashable) -> None:
        """Raise NotAdmitted if ``topic`` admits no more consumers of ``klass`` (and
        ``consumer`` then waits: see ``Admission.refused``)."""
        adm = self._topics.get(topic)
        if adm is not None:
            try:
                adm.check(klass)
            except NotAdmitted:
                adm.refused(klass, consumer)
                self._refused.setdefault(consumer, set()).add(topic)
                raise

    def join(self, topic: str, klass: str, consumer: Hashable) -> None:
        adm = self._topics.get(topic)
        if adm is None:
            adm = self._topics[topic] = Admission(topic)
        adm.join(klass, consumer)
        waits = self._refused.get(consumer)
        if waits is not None:
            waits.discard(topic)
            if not waits:
                del self._refused[consumer]

    def leave(self, topic: str, klass: str, consumer: Hashable) -> None:
        adm = self._topics.get(topic)
        if adm is not None:
            adm.leave(klass, consumer)
            if adm.idle:
                del self._topics[topic]

    def gone(self, klass: str, consumer: Hashable) -> None:
        """``consumer`` went: it waits for no topic any more."""
        for topic in self._refused.pop(consumer, ()):
            adm = self._topics.get(topic)
            if adm is not None:
                adm.gave_up(klass, consumer)
                if adm.idle:
                    del self._topics[topic]

    def set(
        self,
        topic: str,
        admitted: Mapping[str, int],
        order: Sequence[str],
        evict: Callable[[Hashable, Admission], None],
    ) -> tuple[Admission, int]:
        """The topic's admitted counts per class and their order (``Admission.set``);
        ``evict`` disconnects each consumer beyond a count. Returns the admission and how
        many were disconnected."""
        adm = self._topics.setdefault(topic, Admission(topic))
        out = adm.set(admitted, order)
        for consumer in out:
            evict(consumer, adm)
        if adm.idle:
            del self._topics[topic]
        return adm, len(out)
