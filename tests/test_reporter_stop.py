"""A broker's stop cancels its reporter; that cancel must never be lost, or the stop
waits for a loop that goes on reporting (seen in CI: a broker not ending in 15 s)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from srtm.broker.reporter import next_report


async def test_a_cancel_that_meets_a_name_change_still_ends_the_wait() -> None:
    broker = SimpleNamespace(names_changed=asyncio.Event())
    task = asyncio.create_task(next_report(broker, 30.0))  # type: ignore[arg-type]
    await asyncio.sleep(0.1)  # past the minimum gap: waiting on the event now
    # Both in one turn of the loop: Python 3.11's wait_for returned here and dropped it.
    broker.names_changed.set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
