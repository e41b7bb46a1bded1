"""A channel's messages in flight: a dispatch's records put in flight (``fly``), and a
consumer's run of FINs taken off them (``fin_flights``).

Both run once per message delivered: in C where ``srtm.broker._flights`` was built at
install (a FIN about 50 ns against Python's 120, runs of 100), else ``fly_py`` and
``fin_flights_py``, the references the tests hold them to. A flight is
``(record, consumer, deadline)`` (``srtm.broker.state.Flight``); a record's field 7 is
where it was read from disk (``Origin``), or None.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from types import ModuleType
from typing import Any, NamedTuple, TypeVar

from srtm.broker.message import Origin
from srtm.broker.queue import Record

#: The consumer type of a flight: whatever the channel keeps there, compared by identity.
C = TypeVar("C")


class FinsTaken(NamedTuple):
    """What a run of FINs did: how many were in flight to the consumer and are gone; the
    ids that were not (absent, or another consumer's: left in flight), in order; and the
    disk origins to settle, one entry per run of FINs from the same origin."""

    done: int
    failed: list[bytes]
    settles: list[tuple[Origin, int]]


def fly_py(
    flights: dict[bytes, tuple[Record, C, int]], recs: list[Record], consumer: C, deadline: int
) -> list[bytes]:
    """Put each of ``recs`` in flight to ``consumer`` until ``deadline``; their ids."""
    ids = [r[0] for r in recs]
    flights.update(zip(ids, zip(recs, repeat(consumer), repeat(deadline)), strict=True))
    return ids


def fin_flights_py(
    flights: dict[bytes, tuple[Record, C, int]], mids: list[bytes], consumer: C
) -> FinsTaken:
    """Take each of ``mids`` that is in flight to ``consumer`` out of ``flights``."""
    get = flights.get
    failed: list[bytes] = []
    settles: list[tuple[Origin, int]] = []
    done = 0
    last: Origin | None = None
    run = 0
    for mid in mids:
        flight = get(mid)
        if flight is None or flight[1] is not consumer:  # another's stays where it is
            failed.append(mid)
            continue
        del flights[mid]
        done += 1
        origin = flight[0][7]
        if origin is not last:
            if last is not None:
                settles.append((last, run))
            last, run = origin, 0
        run += 1
    if last is not None:
        settles.append((last, run))
    return FinsTaken(done, failed, settles)


_c: ModuleType | None
try:
    from srtm.broker import _flights as _c
except ImportError:  # not built (no compiler at install): in Python
    _c = None


def fin_flights(
    flights: dict[bytes, tuple[Record, C, int]], mids: list[bytes], consumer: C
) -> FinsTaken:
    """``fin_flights_py``, in C where it was built. C stops before a flight it does not
    take (not a tuple of a record of 8 fields), leaving it in place; Python does the rest."""
    if _c is None:
        return fin_flights_py(flights, mids, consumer)
    done, failed, settles, stopped = _c.fin_flights(flights, mids, consumer)
    if stopped < len(mids):
        rest = fin_flights_py(flights, mids[stopped:], consumer)
        done += rest.done
        failed += rest.failed
        settles += rest.settles
    return FinsTaken(done, failed, settles)


#: ``fly_py``, in C where it was built (no Python frame between: it runs per dispatch).
fly: Callable[[dict[bytes, tuple[Record, Any, int]], list[Record], Any, int], list[bytes]] = (
    fly_py if _c is None else _c.fly
)
