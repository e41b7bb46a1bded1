"""``benchmarks/sensors.py``, the open-loop sensor generator, against a broker process: every
PUB answered, and the generator asleep between sends rather than polling."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType

import pytest

from srtm.launch import BrokerProcess
from support import REPO


@pytest.fixture
def sensors_bench() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REPO / "benchmarks"))
        yield importlib.import_module("sensors")


def test_sensors_answered_and_generator_asleep(
    sensors_bench: ModuleType, broker_proc: BrokerProcess
) -> None:
    # 100 sensors at 20/s: a send due every 500 µs, under uvloop's millisecond timers.
    res = sensors_bench.task_sensors(broker_proc.tcp, "sensors_t", 100, 20.0, 1.0, 100)
    assert res["sent"] == res["acked"] == 2_000
    assert res["p50_us"] <= res["p99_us"] <= res["max_us"]
    # Polling between sends, the generator's CPU is the schedule's whole 500 µs a PUB;
    # asleep, its own work on each (tens of µs here).
    assert res["generator_cpu_us_per_pub"] < 300, res
