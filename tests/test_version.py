"""Every version SRTM shows comes from ``srtm.version``, and that from the pyproject."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsq_raw import RawClient
from srtm import __version__ as package_version
from srtm.client import Publisher
from srtm.launch import LocalCluster, start_cluster
from srtm.version import NSQ_VERSION, NSQD_VERSION, __version__

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = start_cluster(tmp_path_factory.mktemp("version"), 1)
    try:
        yield c
    finally:
        c.stop()


def test_the_package_version_is_the_pyprojects() -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    assert __version__ == package_version == declared


def test_the_nsqd_version_names_the_nsq_release() -> None:
    assert NSQD_VERSION.startswith(NSQ_VERSION + "-")


def test_srtm_version_prints_it() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "srtm", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == __version__


def test_the_controller_shows_it(cluster: LocalCluster) -> None:
    assert cluster.controller.json("/info")["version"] == __version__
    assert cluster.controller.json("/openapi.json")["info"]["version"] == __version__
    (node,) = cluster.controller.json("/nodes")["producers"]
    assert node["version"] == NSQD_VERSION


async def test_the_broker_shows_the_nsqd_version(cluster: LocalCluster) -> None:
    (broker,) = cluster.brokers
    assert broker.json("/info")["version"] == NSQD_VERSION
    assert broker.json("/srtm/openapi.json")["info"]["version"] == __version__
    host, port = broker.tcp_address.rsplit(":", 1)
    client = await RawClient.connect(host, int(port))
    try:
        assert (await client.identify())["version"] == NSQD_VERSION
    finally:
        await client.close()


async def test_the_client_names_it_in_its_user_agent(cluster: LocalCluster) -> None:
    (broker,) = cluster.brokers
    pub = Publisher("agent", "p1", address=broker.tcp_address)
    await pub.start()
    try:
        await (await pub.publish(b"x"))
        (client,) = broker.json("/stats?format=json")["producers"]
        assert client["user_agent"] == f"srtm-client/{__version__}"
    finally:
        await pub.close()
