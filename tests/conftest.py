from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from srtm.launch import BrokerProcess, start_broker

settings.register_profile(
    "default", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture
def broker_proc(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker subprocess on 127.0.0.1 (ephemeral ports), stopped after the test."""
    proc = start_broker(tmp_path / "data")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """The one SparkSession of the test run (srtm.pipeline's factory, local[*]), stopped
    at the end so that no JVM outlives the tests."""
    from srtm.pipeline.session import SessionSettings, get_session, stop_session

    # C1 only: a short-lived JVM starts and warms faster.
    fast = SessionSettings(driver_memory="1g", jvm_options="-XX:TieredStopAtLevel=1")
    session = get_session(settings=fast)
    try:
        yield session
    finally:
        stop_session(session)
