"""nsqlookupd's registration database, pure: which topics and channels exist in the
cluster, and which brokers carry each (managed by the controller or not).

As in nsqlookupd 1.3.0, a key (a topic, or a topic's channel) lives until it is deleted
through the API, even once no broker carries it; a broker joins a key when it starts to
carry it (reported, as nsqd's REGISTER) and leaves it when it stops (UNREGISTER) or goes
down. An ephemeral key goes with its last broker. A tombstone hides one broker of one
topic from /lookup for ``tombstone_s``. Brokers are named by id; times are the
controller's clock (s)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: nsqlookupd's default --tombstone-lifetime (s).
TOMBSTONE_S = 45.0

#: (topic, channel); channel "" names the topic itself.
Key = tuple[str, str]


@dataclass
class LookupRegistry:
    tombstone_s: float = TOMBSTONE_S
    #: Every key, with the brokers registered for it (in the order they joined).
    keys: dict[Key, dict[str, None]] = field(default_factory=dict)
    #: Per broker, what its last report carried: topic -> channels.
    carried: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)
    #: (topic, broker) -> when it was tombstoned.
    tombstoned: dict[tuple[str, str], float] = field(default_factory=dict)

    # -- brokers ---------------------------------------------------------------------------
    def carry(self, broker: str, topics: dict[str, frozenset[str]]) -> None:
        """``broker`` now carries these topics and channels: it joins what is new to it
        (creating the key) and leaves what it no longer carries."""
        was = self.carried.get(broker, {})
        for topic, channels in topics.items():
            old = was.get(topic)
            if old is None:
                self._join(broker, (topic, ""))
            for channel in channels - (old or frozenset()):
                self._join(broker, (topic, ""))  # nsqd's REGISTER of a channel names both
                self._join(broker, (topic, channel))
            for channel in (old or frozenset()) - channels:
                self._leave(broker, (topic, channel))
        for topic, channels in was.items():
            if topic not in topics:
                for channel in channels:
                    self._leave(broker, (topic, channel))
                self._leave(broker, (topic, ""))
                self.tombstoned.pop((topic, broker), None)
        self.carried[broker] = dict(topics)

    def drop(self, broker: str) -> None:
        """``broker`` went down or away: it leaves every key (the keys stay)."""
        for key in list(self.keys):
            self._leave(broker, key)
        self.carried.pop(broker, None)
        for t, b in list(self.tombstoned):
            if b == broker:
                del self.tombstoned[t, b]

    def _join(self, broker: str, key: Key) -> None:
        self.keys.setdefault(key, {})[broker] = None

    def _leave(self, broker: str, key: Key) -> None:
        members = self.keys.get(key)
        if members is None:
            return
        members.pop(broker, None)
        if not members and (key[1] or key[0]).endswith("#ephemeral"):
            del self.keys[key]

    # -- nsqlookupd's writes ---------------------------------------------------------------
    def create_topic(self, topic: str) -> None:
        self.keys.setdefault((topic, ""), {})

    def create_channel(self, topic: str, channel: str) -> None:
        self.keys.setdefault((topic, channel), {})
        self.keys.setdefault((topic, ""), {})

    def delete_topic(self, topic: str) -> None:
        """The topic and its channels leave the registry (brokers keep carrying it)."""
        for key in [k for k in self.keys if k[0] == topic]:
            del self.keys[key]

    def delete_channel(self, topic: str, channel: str) -> bool:
        """False: no such channel (nsqlookupd's CHANNEL_NOT_FOUND)."""
        return self.keys.pop((topic, channel), None) is not None

    def tombstone(self, topic: str, broker: str, now: float) -> None:
        if broker in self.keys.get((topic, ""), {}):
            self.tombstoned[topic, broker] = now

    # -- reads -----------------------------------------------------------------------------
    def has_topic(self, topic: str) -> bool:
        return (topic, "") in self.keys

    def topics(self) -> list[str]:
        return sorted({t for t, c in self.keys if not c})

    def channels(self, topic: str) -> list[str]:
        return sorted(c for t, c in self.keys if t == topic and c)

    def is_tombstoned(self, topic: str, broker: str, now: float) -> bool:
        when = self.tombstoned.get((topic, broker))
        return when is not None and now - when < self.tombstone_s

    def unread(self, topic: str, broker: str) -> frozenset[str]:
        """The channels of ``topic`` that other brokers carry and ``broker`` does not: a
        subscriber of each has not read ``broker`` yet (a channel is created by a SUB)."""
        mine = self.carried.get(broker, {}).get(topic, frozenset())
        others: set[str] = set()
        for b, topics in self.carried.items():
            if b != broker:
                others |= topics.get(topic, frozenset())
        return frozenset(others - mine)

    def producers(self, topic: str) -> list[str]:
        """The brokers registered for ``topic``, tombstoned or not."""
        return list(self.keys.get((topic, ""), {}))

    def broker_topics(self, broker: str) -> list[str]:
        """The topics ``broker`` is registered for (nsqlookupd's /nodes ``topics``)."""
        return sorted(t for (t, c), members in self.keys.items() if not c and broker in members)
