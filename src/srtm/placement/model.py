"""What placement works on: brokers, publishers, topics, and the placement it returns.

Inputs come from JSON documents (``srtm place``, the controller); every check names the
field that is wrong. Rates are messages per second.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from srtm.ratelimit import MAX_RATE, MIN_RATE, BucketParams, check_bucket

#: The topic rate is this much above its publishers' total, as the paper configures topics.
RATE_MARGIN = 1.1


@dataclass(frozen=True, slots=True)
class BrokerCapacity:
    """A broker's capacity ``mcap`` and the load it already carries; ``host``: the host
    it runs on, shared by the processes of one ``srtm node`` (empty: a host of its own)."""

    id: str
    mcap: float
    load: float = 0.0
    host: str = ""

    @property
    def host_key(self) -> str:
        """The host it counts on when a topic is spread over hosts."""
        return self.host or self.id

    @property
    def rcap(self) -> float:
        """Residual capacity: what is left of ``mcap`` (never negative)."""
        return max(0.0, self.mcap - self.load)


@dataclass(frozen=True, slots=True)
class PublisherLoad:
    id: str
    rate: float
    #: Correlation key: publishers of a group fire together (None: on its own).
    group: str | None = None


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    publishers: tuple[PublisherLoad, ...]
    #: The topic's bucket depth b.
    burst: float
    slo_p99_ms: float
    #: The topic's token rate r (default: RATE_MARGIN × the publishers' total rate).
    rate: float

    @property
    def load(self) -> float:
        """The message rate its publishers offer (what capacity must cover)."""
        return math.fsum(p.rate for p in self.publishers)

    def with_publishers(self, publishers: Sequence[PublisherLoad]) -> TopicSpec:
        """The same topic restricted to ``publishers`` (its rate and burst scaled)."""
        share = math.fsum(p.rate for p in publishers) / self.load if self.load else 0.0
        return TopicSpec(
            self.name, tuple(publishers), self.burst * share, self.slo_p99_ms, self.rate * share
        )


@dataclass(frozen=True, slots=True)
class RateSum:
    """A topic's publishers as its derived rate needs them: how many, their total rate
    (``math.fsum``) and the largest (the first of equals)."""

    count: int
    total: float
    top: PublisherLoad | None

    @classmethod
    def of(cls, publishers: Sequence[PublisherLoad]) -> RateSum:
        top = max(publishers, key=lambda p: p.rate) if publishers else None
        return cls(len(publishers), math.fsum(p.rate for p in publishers), top)


def topic_bucket(
    publishers: Sequence[PublisherLoad] | RateSum, rate: float | None, burst: float
) -> BucketParams:
    """The topic's bucket, checked as every broker will check it (``check_bucket``): its
    ``rate`` if given, else ``RATE_MARGIN`` × its publishers' total. A refusal quotes what
    was given; a rate derived from the publishers is named as such, with the rates it
    came from, since nobody typed it. ``publishers`` may be given as their ``RateSum``."""
    if rate is not None:
        return check_bucket(rate, burst)
    if not isinstance(publishers, RateSum):
        publishers = RateSum.of(publishers)
    derived = RATE_MARGIN * publishers.total
    whence = derivation(publishers, derived)
    if derived > MAX_RATE:
        raise ValueError(f"{whence}, over the limit of {MAX_RATE:g} msg/s")
    if derived < MIN_RATE:
        raise ValueError(f"{whence}, under the least of {MIN_RATE:g} msg/s")
    try:
        return check_bucket(derived, burst)
    except ValueError as exc:  # the burst, alone or as seconds of tokens at this rate
        raise ValueError(f"{whence}; {exc}") from None


def derivation(publishers: Sequence[PublisherLoad] | RateSum, rate: float) -> str:
    """How ``rate`` (``RATE_MARGIN`` × the publishers' total) came from ``publishers``."""
    if not isinstance(publishers, RateSum):
        publishers = RateSum.of(publishers)
    margin = f"({RATE_MARGIN:g} × the sum of its publishers)"
    top, total = publishers.top, publishers.total
    if top is None:
        return f"with no publishers the topic's rate is {rate:g} msg/s {margin}"
    if publishers.count == 1:
        return (
            f"publisher {top.id!r} rate {top.rate:g} msg/s gives the topic a rate of "
            f"{rate:g} msg/s {margin}"
        )
    return (
        f"the rates of its {publishers.count} publishers (the largest {top.id!r} "
        f"{top.rate:g} msg/s) sum to {total:g} msg/s, which gives the topic a rate of "
        f"{rate:g} msg/s {margin}"
    )


@dataclass(frozen=True, slots=True)
class Assignment:
    """What one broker gets: publishers, their total rate and its sub-bucket."""

    broker: str
    publishers: tuple[str, ...]
    rate: float
    #: None when the split is impossible (see ``Placement.problem``).
    bucket: BucketParams | None


@dataclass(frozen=True, slots=True)
class Placement:
    """A policy's answer. ``shortfall`` > 0 means capacity ran out: ``unassigned`` lists the
    publishers left over and ``brokers_needed`` how many more brokers of the largest
    ``mcap`` present would cover it."""

    policy: str
    assignments: tuple[Assignment, ...]
    unassigned: tuple[str, ...] = ()
    shortfall: float = 0.0
    brokers_needed: int = 0
    #: Why no sub-buckets could be given (a share too small to hold one token), if so.
    problem: str | None = None

    @property
    def brokers(self) -> tuple[str, ...]:
        return tuple(a.broker for a in self.assignments)

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "brokers": [
                {
                    "id": a.broker,
                    "publishers": list(a.publishers),
                    "rate": a.rate,
                    "bucket": None
                    if a.bucket is None
                    else {"rate": a.bucket.rate, "burst": a.bucket.burst},
                }
                for a in self.assignments
            ],
            "unassigned": list(self.unassigned),
            "shortfall": self.shortfall,
            "brokers_needed": self.brokers_needed,
            "problem": self.problem,
        }


# -- parsing -------------------------------------------------------------------------------
def _number(doc: Mapping[str, Any], key: str, where: str, *, positive: bool = True) -> float:
    if key not in doc:
        raise ValueError(f"{where}: missing field {key!r}")
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}.{key} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{where}.{key} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _text(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}.{key} must be a non-empty string, got {value!r}")
    return value


def parse_brokers(doc: Any) -> list[BrokerCapacity]:
    """``[{"id": "b1", "mcap": 110000, "load": 10000}, …]`` (``load`` defaults to 0)."""
    if not isinstance(doc, list) or not doc:
        raise ValueError("brokers must be a non-empty JSON array of objects")
    brokers = []
    for i, item in enumerate(doc):
        where = f"brokers[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be an object, got {item!r}")
        load = _number(item, "load", where, positive=False) if "load" in item else 0.0
        brokers.append(BrokerCapacity(_text(item, "id", where), _number(item, "mcap", where), load))
    ids = [b.id for b in brokers]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"brokers: duplicate ids {dup}")
    return brokers


def parse_topic(doc: Any) -> TopicSpec:
    """``{"name", "slo_p99_ms", "burst", "publishers": [{"id", "rate", "group"?}, …],
    "rate"?}``; extra fields are allowed."""
    if not isinstance(doc, dict):
        raise ValueError("topic must be a JSON object")
    name = _text(doc, "name", "topic")
    pubs_doc = doc.get("publishers")
    if not isinstance(pubs_doc, list) or not pubs_doc:
        raise ValueError("topic.publishers must be a non-empty array")
    publishers = []
    for i, item in enumerate(pubs_doc):
        where = f"topic.publishers[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be an object, got {item!r}")
        group = item.get("group")
        if group is not None and not isinstance(group, str):
            raise ValueError(f"{where}.group must be a string or absent, got {group!r}")
        publishers.append(
            PublisherLoad(_text(item, "id", where), _number(item, "rate", where), group)
        )
    ids = [p.id for p in publishers]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise ValueError(f"topic.publishers: duplicate ids {dup}")
    burst = _number(doc, "burst", "topic")
    if burst < 1:
        raise ValueError(f"topic.burst must be >= 1 (a bucket holds one token), got {burst!r}")
    given = _number(doc, "rate", "topic") if "rate" in doc else None
    try:  # a bucket that no broker could schedule is refused here, not by every broker
        bucket = topic_bucket(publishers, given, burst)
    except ValueError as exc:
        raise ValueError(f"topic: {exc}") from None
    slo = _number(doc, "slo_p99_ms", "topic")
    return TopicSpec(name, tuple(publishers), burst, slo, bucket.rate)
