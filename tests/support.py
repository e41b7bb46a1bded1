"""Shared test helpers: awaited conditions (poll instead of sleeping a fixed time) and the
``make_broker`` fixture's type (the fixture is in conftest.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from srtm.broker import Broker

#: ``make_broker(**options)``: an in-process broker on 127.0.0.1 (ephemeral port).
MakeBroker = Callable[..., Awaitable[Broker]]


async def until(cond: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    """Await ``cond`` (polled every 5 ms); fail naming ``what`` if it does not hold within
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout} s: {what or 'condition'}")
        await asyncio.sleep(0.005)


def wait_for(cond: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    """Poll ``cond`` (blocking, every 50 ms) until it returns something true, and return
    that; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
