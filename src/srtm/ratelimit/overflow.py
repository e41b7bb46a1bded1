"""The bound on what waits behind a topic's sub-bucket, and what happens over it. No I/O.

The broker polices by it, the controller carries it to brokers. A shaped topic's meter
books every arrival at once (``srtm.broker.state.Topic``): the wait a
message arriving at ``at`` would have behind the sub-bucket is the meter's virtual
backlog then, in time (tokens owed / rate). A message that would wait longer than
``max_wait_ms`` is over the bound, and the topic's ``OverflowPolicy`` says what
happens: the publisher's connection stops being read (``block``), the publish is
refused (``refuse``), or the oldest waiting messages make room (``drop-oldest``).
Unshaped and held topics have no meter: nothing bounds them (nothing is released
behind a bucket there, or nothing at all while held, and the controller decides when).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Literal

from srtm.ratelimit.bucket import TokenBucket


class OverflowPolicy(enum.StrEnum):
    """What a topic does with a message that would wait longer than its bound."""

    BLOCK = "block"
    REFUSE = "refuse"
    DROP_OLDEST = "drop-oldest"


#: ``OverflowPolicy``'s values, as documents spell them.
OverflowName = Literal["block", "refuse", "drop-oldest"]

#: A user of an SLO system expects what was acknowledged to be delivered and a publisher
#: inside its envelope never to notice the bound: blocking pushes back on the one that
#: exceeds it, through TCP, losing nothing and answering no error (docs/controller.md).
DEFAULT_OVERFLOW = OverflowPolicy.BLOCK
#: A safety bound, not an SLO: over ten times the longest token wait the experiments
#: record (LB's p99 of 2.5 s in docs/results/multitenant.md; SRTM's stay within SLOs of
#: 1-100 ms), so it never acts on them, yet a flood waits 30 s of its topic's rate at
#: most, not until the disk is full. A topic that wants a tighter one sets it.
DEFAULT_MAX_WAIT_MS = 30_000.0
#: The largest bound one may set (a day): past it the bound would be no bound.
MAX_MAX_WAIT_MS = 86_400_000.0


@dataclass(frozen=True, slots=True)
class Bound:
    """A topic's bound on what waits behind its sub-bucket, and its overflow policy."""

    max_wait_ms: float = DEFAULT_MAX_WAIT_MS
    overflow: OverflowPolicy = DEFAULT_OVERFLOW
    #: ``max_wait_ms`` in ns, computed once: every shaped message compares against it.
    max_wait_ns: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_wait_ns", int(self.max_wait_ms * 1_000_000))


DEFAULT_BOUND = Bound()


def check_bound(max_wait_ms: object, overflow: object) -> Bound:
    """A bound from what was given (None: the default of each), or ValueError naming
    the field that is wrong."""
    wait = DEFAULT_MAX_WAIT_MS if max_wait_ms is None else max_wait_ms
    if (
        isinstance(wait, bool)
        or not isinstance(wait, int | float)
        or not math.isfinite(wait)
        or not 0 < wait <= MAX_MAX_WAIT_MS
    ):
        top = f"{MAX_MAX_WAIT_MS:.0f}"
        raise ValueError(f"max_wait_ms must be a number in (0, {top}], got {wait!r}")
    try:
        policy = DEFAULT_OVERFLOW if overflow is None else OverflowPolicy(str(overflow))
    except ValueError:
        names = ", ".join(o.value for o in OverflowPolicy)
        raise ValueError(f"overflow must be one of {names}, got {overflow!r}") from None
    return Bound(float(wait), policy)


def wait_ns(meter: TokenBucket, at: int) -> int:
    """How long a message arriving at ``at`` would wait behind the bucket ``meter``
    books (0: it would pass at once)."""
    owed = 1.0 - meter.tokens(at)
    return 0 if owed <= 0 else int(owed * 1e9 / meter.rate)


def over_by_ns(meter: TokenBucket, bound: Bound, at: int) -> int:
    """How much longer than the bound a message arriving at ``at`` would wait (<= 0:
    within it). The wait falls by 1 ns per ns while nothing arrives, so this is also
    how long until the topic is back within its bound."""
    return wait_ns(meter, at) - bound.max_wait_ns


def refusal(topic: str, waited_ns: int, bound: Bound) -> str:
    """Why a publish over the bound is refused: the limit, named."""
    return (
        f"topic {topic} is over its bound: a message would wait "
        f"{waited_ns / 1e6:.0f} ms behind its sub-bucket (max_wait_ms {bound.max_wait_ms:g})"
    )
