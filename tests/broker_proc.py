"""A real broker in a subprocess on 127.0.0.1 with ephemeral ports, for client-level tests."""

from __future__ import annotations

import json
import re
import selectors
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_READY = re.compile(r"tcp=([\d.]+):(\d+) http=([\d.]+):(\d+)")


@dataclass
class BrokerProcess:
    proc: subprocess.Popen[str]
    tcp: tuple[str, int]
    http: tuple[str, int]
    data_dir: Path

    @property
    def tcp_address(self) -> str:
        return f"{self.tcp[0]}:{self.tcp[1]}"

    @property
    def http_address(self) -> str:
        return f"{self.http[0]}:{self.http[1]}"

    def url(self, path: str) -> str:
        return f"http://{self.http_address}{path}"

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url(path), timeout=10) as resp:
            data: bytes = resp.read()
            return data

    def post(self, path: str, body: bytes = b"", method: str = "POST") -> bytes:
        req = urllib.request.Request(self.url(path), data=body, method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:
            data: bytes = resp.read()
            return data

    def stats(self, topic: str | None = None) -> dict[str, Any]:
        q = f"&topic={topic}" if topic else ""
        doc: dict[str, Any] = json.loads(self.get(f"/stats?format=json{q}"))
        return doc

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM (a graceful stop that persists), then wait; kill if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def start_broker(data_dir: Path, *args: str, timeout: float = 30.0) -> BrokerProcess:
    cmd = [
        sys.executable,
        "-m",
        "srtm",
        "broker",
        "--tcp-address",
        "127.0.0.1:0",
        "--http-address",
        "127.0.0.1:0",
        "--data-dir",
        str(data_dir),
        *args,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if sel.select(deadline - time.monotonic()):
                line = proc.stdout.readline()
                if not line:
                    break
                m = _READY.search(line)
                if m:
                    return BrokerProcess(proc, (m[1], int(m[2])), (m[3], int(m[4])), data_dir)
        proc.kill()
        proc.wait()
        raise RuntimeError(f"broker did not start: exit {proc.returncode}")
    finally:
        sel.close()
