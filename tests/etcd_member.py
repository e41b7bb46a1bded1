"""A real single-member etcd cluster for the tests: started on ephemeral ports in a
temporary directory, ready once ``/health`` says so, stopped (and killed if it must be)
afterwards. Without ``etcd`` on PATH the tests that need it fail: ``make test`` installs
Debian's etcd-server."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

#: How long etcd may take to start (a cold start on a busy machine takes about a second).
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0


@dataclass
class EtcdMember:
    #: The client URL: ``http://127.0.0.1:PORT``.
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def free_ports(n: int) -> list[int]:
    """``n`` ports nothing listens on now (bound to port 0 together, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
            return bool(json.loads(response.read()).get("health") == "true")
    except (OSError, ValueError):
        return False


def start_etcd(data: Path) -> EtcdMember:
    binary = shutil.which("etcd")
    if binary is None:
        pytest.fail("etcd is not on PATH: `make test` installs Debian's etcd-server", pytrace=False)
    client, peer = free_ports(2)
    url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    log = data.parent / "etcd.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [binary, "--name", "t", "--data-dir", str(data),
             "--listen-client-urls", url, "--advertise-client-urls", url,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"t={peer_url}"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    member = EtcdMember(url, process, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not healthy(url):
        if process.poll() is not None or time.monotonic() > deadline:
            member.stop()
            tail = log.read_text(errors="replace")[-2000:]
            pytest.fail(f"etcd at {url} did not become healthy (exit {process.poll()}):\n{tail}")
        time.sleep(0.05)
    return member
