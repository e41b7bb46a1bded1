from __future__ import annotations

import importlib
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, settings

from etcd_member import EtcdMember, start_etcd
from netns import Network, ProxyNetwork, netns_unavailable
from srtm.broker import Broker, BrokerOptions
from srtm.broker.http import serve_http
from srtm.control.options import ControllerOptions
from srtm.control.service import ControllerService
from srtm.launch import BrokerProcess, start_broker
from support import REPO, BrokerApi, ControllerClient, MakeBroker

settings.register_profile(
    "default", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture
async def make_broker(tmp_path: Path) -> AsyncIterator[MakeBroker]:
    """Starts in-process brokers (TCP only) on ephemeral ports; stops them after the test."""
    started: list[Broker] = []

    async def make(**options: Any) -> Broker:
        opts = BrokerOptions(tcp_port=0, http_port=0, data_dir=tmp_path / "data", **options)
        broker = Broker(opts)
        await broker.start()
        started.append(broker)
        return broker

    yield make
    for b in started:
        await b.stop()


@pytest.fixture
async def broker_api(tmp_path: Path) -> AsyncIterator[BrokerApi]:
    """An in-process broker with its HTTP API, and a client session on that API."""
    broker = Broker(BrokerOptions(tcp_port=0, http_port=0, data_dir=tmp_path / "data"))
    await broker.start()
    runner, port = await serve_http(broker)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
        yield broker, session
    await runner.cleanup()
    await broker.stop()


@pytest.fixture
def broker_proc(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker subprocess on 127.0.0.1 (ephemeral ports), stopped after the test."""
    proc = start_broker(tmp_path / "data")
    try:
        yield proc
    finally:
        proc.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that needs the SparkSession is slow: its JVM takes a minute to start."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def broker_bench() -> Iterator[ModuleType]:
    """``benchmarks/broker.py`` as a module, for tests of its pure parts."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REPO / "benchmarks"))
        yield importlib.import_module("broker")


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """The one SparkSession of the test run (srtm.pipeline's factory, local[*]), stopped
    at the end so that no JVM outlives the tests."""
    from srtm.pipeline.session import SparkSettings, get_session, stop_session

    # C1 only: a short-lived JVM starts and warms faster.
    fast = SparkSettings(driver_memory="1g", jvm_options="-XX:TieredStopAtLevel=1")
    session = get_session(settings=fast)
    try:
        yield session
    finally:
        stop_session(session)


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdMember]:
    """One real etcd member for the worker's tests (each test keeps to its own prefix)."""
    member = start_etcd(tmp_path_factory.mktemp("etcd") / "data")
    try:
        yield member
    finally:
        member.stop()


@pytest.fixture
def netns() -> Iterator[Network]:
    """Hosts in network namespaces with links to cut (tests/netns.py); skipped, saying
    why, where namespaces cannot be made (not root, or no iproute2)."""
    if why := netns_unavailable():
        pytest.skip(f"{why}; the partition harness falls back to `proxynet` (127.0.0.1)")
    with Network() as net:
        yield net


@pytest.fixture
def proxynet() -> Iterator[ProxyNetwork]:
    """The fallback: hosts on 127.0.0.1 whose links are forwarding proxies to cut."""
    with ProxyNetwork() as net:
        yield net


@pytest.fixture
def partition_net(request: pytest.FixtureRequest) -> Network | ProxyNetwork:
    """Namespaces where they can be made, else the proxies (says so on stderr)."""
    if why := netns_unavailable():
        print(f"partition harness: {why}; using proxies on 127.0.0.1", file=sys.stderr)
        net: Network | ProxyNetwork = request.getfixturevalue("proxynet")
    else:
        net = request.getfixturevalue("netns")
    return net


@pytest.fixture
async def controller_api(tmp_path: Path) -> AsyncIterator[ControllerClient]:
    """An in-process controller on an ephemeral port, and a client of its HTTP API."""
    # Ticks far apart: brokers the test registers by hand are never marked down.
    opts = ControllerOptions(db=tmp_path / "c.db", http_port=0, tick_s=60)
    service = ControllerService(opts)
    await service.start()
    assert service.http_address is not None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            yield ControllerClient(http, "http://{}:{}".format(*service.http_address))
    finally:
        await service.stop()
