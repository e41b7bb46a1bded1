"""The capacity ledger: what each broker can still take, counting what is promised.

Per broker: ``mcap``; ``allocated``, the sum of the sub-bucket rates of every plan it
carries (what the controller has promised); ``measured``, the ingress it last reported;
and ``rcap = mcap - max(allocated, measured)``, never negative. ``allocated`` is derived
from the plans every time (never a counter kept beside them), so every plan change is in
it by construction. Pure: no I/O, no clock.

The ledger counts sub-bucket rates, and a topic's bucket rate is its publishers' load times
``rate / load`` (1.1 for the paper's topics): ``for_topic`` shows the fleet to a policy in
the units it places (publisher msg/s), so a placement never promises a broker more than
its ``rcap``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from srtm.placement.model import BrokerCapacity, TopicSpec
from srtm.ratelimit import BucketParams

__all__ = ["LedgerEntry", "allocated", "for_topic", "ledger"]


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One broker's line of the ledger (rates in msg/s)."""

    id: str
    mcap: float
    allocated: float = 0.0
    measured: float = 0.0
    #: The host it runs on (empty: a host of its own; ``BrokerCapacity.host``).
    host: str = ""

    @property
    def load(self) -> float:
        """What placement counts as carried: the larger of promised and measured."""
        return max(self.allocated, self.measured)

    @property
    def rcap(self) -> float:
        """Residual capacity: ``mcap - max(allocated, measured)``, never negative."""
        return max(0.0, self.mcap - self.load)

    def capacity(self) -> BrokerCapacity:
        """The broker as the policies see it: its ``rcap`` is this entry's."""
        return BrokerCapacity(self.id, self.mcap, self.load, self.host)


def allocated(plans: Iterable[Mapping[str, BucketParams]]) -> dict[str, float]:
    """Per broker, the sum of the sub-bucket rates the ``plans`` give it (each plan:
    broker id -> its sub-bucket)."""
    parts: dict[str, list[float]] = {}
    for plan in plans:
        for broker, bucket in plan.items():
            parts.setdefault(broker, []).append(bucket.rate)
    return {b: math.fsum(rates) for b, rates in parts.items()}


def ledger(
    brokers: Iterable[tuple[str, float, float]],
    plans: Iterable[Mapping[str, BucketParams]],
    hosts: Mapping[str, str] | None = None,
) -> list[LedgerEntry]:
    """The ledger of ``brokers`` (id, ``mcap``, measured ingress), in their order, with
    ``allocated`` summed from ``plans``; ``hosts``: broker id -> the host it shares with
    others (a broker not in it is a host of its own)."""
    promised = allocated(plans)
    hosts = hosts or {}
    return [
        LedgerEntry(b, mcap, promised.get(b, 0.0), measured, hosts.get(b, ""))
        for b, mcap, measured in brokers
    ]


def for_topic(spec: TopicSpec, fleet: Iterable[BrokerCapacity]) -> list[BrokerCapacity]:
    """``fleet`` in ``spec``'s publisher msg/s: each broker's ``mcap`` and load divided by
    what the ledger will count per msg/s placed (``spec.rate / spec.load``)."""
    k = spec.rate / spec.load if spec.load > 0 else 1.0
    if k == 1.0:
        return list(fleet)
    return [BrokerCapacity(b.id, b.mcap / k, b.load / k, b.host) for b in fleet]
