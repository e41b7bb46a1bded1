"""A real single-member etcd cluster for the tests (``srtm.etcd_cluster``): started on
ephemeral ports in a temporary directory, ready once ``/health`` says so, stopped (and
killed if it must be) afterwards. Without etcd the tests that need it fail: ``make test``
installs Debian's etcd-server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from srtm.etcd_cluster import EtcdCluster, EtcdClusterError, free_ports

__all__ = ["EtcdMember", "free_ports", "start_etcd"]


@dataclass
class EtcdMember:
    cluster: EtcdCluster

    @property
    def url(self) -> str:
        """The client URL: ``http://127.0.0.1:PORT``."""
        return self.cluster.client_urls[0]

    @property
    def log(self) -> Path:
        return self.cluster.nodes[0].log

    def stop(self) -> None:
        self.cluster.stop_all()


def start_etcd(data: Path) -> EtcdMember:
    """One member with its data (and log) under ``data``; the test fails if it cannot."""
    try:
        return EtcdMember(EtcdCluster(data, 1).start_all())
    except EtcdClusterError as e:
        pytest.fail(str(e), pytrace=False)
