"""The controller answers as nsqlookupd 1.3.0: each test runs against the real nsqlookupd
with an nsqd registered (from ``../shared/anchors/nsq-1.3.0``) and against SRTM's
controller with a broker, so "exactly as" is checked, not assumed; then what only SRTM
has (a clean stop deregisters, a lost share comes back) and go-nsq's nsq_tail finding a
broker through the controller."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from srtm.launch import LocalCluster, start_cluster
from support import nsq_bin

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(url: str, method: str = "GET", body: bytes | None = None,
            headers: dict[str, str] | None = None) -> Answer:  # fmt: skip
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read())
    except urllib.error.HTTPError as err:
        return Answer(err.code, {k.lower(): v for k, v in err.headers.items()}, err.read())


def eventually(check: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            assert value, "condition not met in time"
            return value
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Lookupd:
    """A lookupd and one broker registered with it."""

    kind: str
    url: str  # the lookupd's (or controller's) HTTP base
    broker: str  # the nsqd's (or broker's) HTTP base
    tcp_port: int
    http_port: int
    headers: dict[str, str] = field(default_factory=dict)

    def get(self, path: str) -> Answer:
        return request(self.url + path, headers=self.headers)

    def post(self, path: str) -> Answer:
        return request(self.url + path, "POST", b"", self.headers)

    def on_broker(self, path: str, body: bytes = b"") -> Answer:
        answer = request(self.broker + path, "POST", body, self.headers)
        assert answer.status == 200, answer
        return answer


def _nsq(tmp_path: Path) -> Iterator[Lookupd]:
    # free_port() only finds a port free now: a process started in parallel may take it
    # first, and nsqd or nsqlookupd then exits at once. Fresh ports, up to three times.
    for attempt in range(3):
        procs = _start_nsq(tmp_path / f"try-{attempt}")
        if procs is not None:
            break
    else:
        pytest.fail("nsqlookupd and nsqd did not start on three sets of free ports")
    lk, started = procs
    try:
        # nsqd registers when it starts; a failed first try is retried only after 15 s.
        eventually(lambda: lk.get("/nodes").json()["producers"], timeout=40.0)
        yield lk
    finally:
        _stop(started)


def _start_nsq(data: Path) -> tuple[Lookupd, list[subprocess.Popen[bytes]]] | None:
    """nsqlookupd and an nsqd registered with it, both answering /ping; None (and both
    stopped) if either exited first."""
    nsq = nsq_bin()
    data.mkdir(parents=True)
    lt, lh, nt, nh = (free_port() for _ in range(4))
    procs = [subprocess.Popen(
        [str(nsq / "nsqlookupd"), f"--tcp-address=127.0.0.1:{lt}",
         f"--http-address=127.0.0.1:{lh}"], stderr=subprocess.DEVNULL)]  # fmt: skip
    try:
        up = _answers(procs[0], f"http://127.0.0.1:{lh}/ping")
        if up:
            procs.append(subprocess.Popen(
                [str(nsq / "nsqd"), f"--tcp-address=127.0.0.1:{nt}",
                 f"--http-address=127.0.0.1:{nh}", f"--lookupd-tcp-address=127.0.0.1:{lt}",
                 "--broadcast-address=127.0.0.1", f"--data-path={data}"],
                stderr=subprocess.DEVNULL))  # fmt: skip
            up = _answers(procs[1], f"http://127.0.0.1:{nh}/ping")
    except BaseException:
        _stop(procs)
        raise
    if not up:
        _stop(procs)
        return None
    return Lookupd("nsq", f"http://127.0.0.1:{lh}", f"http://127.0.0.1:{nh}", nt, nh), procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in reversed(procs):
        p.terminate()
        p.wait(10)


def _answers(proc: subprocess.Popen[bytes], url: str, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if _up(url):
            return True
        assert time.monotonic() < deadline, f"{url} did not answer in {timeout} s"
        time.sleep(0.05)
    return False


def _up(url: str) -> bool:
    try:
        return request(url).status == 200
    except OSError:
        return False


def _srtm(tmp_path: Path) -> Iterator[Lookupd]:
    c = start_cluster(tmp_path, 1, controller_args=["--broker-timeout-s", "30"])
    try:
        b = c.brokers[0]
        lk = Lookupd("srtm", c.url, f"http://{b.http_address}", b.tcp[1], b.http[1], c.headers)
        eventually(lambda: lk.get("/nodes").json()["producers"])
        yield lk
    finally:
        c.stop()


@pytest.fixture(params=["nsq", "srtm"])
def lookupd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Lookupd]:
    if request.param == "nsq":
        yield from _nsq(tmp_path)
    else:
        yield from _srtm(tmp_path)


MARK = "nsq; version=1.0"


@pytest.mark.parametrize(
    ("method", "path", "status", "message"),
    [
        ("GET", "/lookup", 400, "MISSING_ARG_TOPIC"),
        ("GET", "/lookup?topic=nope", 404, "TOPIC_NOT_FOUND"),
        ("GET", "/lookup?topic=a%20b", 404, "TOPIC_NOT_FOUND"),
        ("GET", "/channels", 400, "MISSING_ARG_TOPIC"),
        ("GET", "/nope", 404, "NOT_FOUND"),
        ("GET", "/create_topic?topic=x", 404, "NOT_FOUND"),
        ("GET", "/topic/create?topic=x", 405, "METHOD_NOT_ALLOWED"),
        ("POST", "/topic/create", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/create?topic=bad%20name", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/topic/delete", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/create?topic=t", 400, "MISSING_ARG_CHANNEL"),
        ("POST", "/channel/create?topic=t&channel=bad%20c", 400, "INVALID_ARG_CHANNEL"),
        ("POST", "/channel/delete?topic=t&channel=nope", 404, "CHANNEL_NOT_FOUND"),
        ("POST", "/topic/tombstone?topic=t", 400, "MISSING_ARG_NODE"),
    ],
)
def test_refusals_are_nsqlookupds(
    lookupd: Lookupd, method: str, path: str, status: int, message: str
) -> None:
    answer = request(lookupd.url + path, method, b"" if method == "POST" else None,
                     lookupd.headers)  # fmt: skip
    assert (answer.status, answer.json()) == (status, {"message": message})
    assert answer.headers.get("x-nsq-content-type") == MARK


def test_registrations_through_the_api(lookupd: Lookupd) -> None:
    created = lookupd.post("/topic/create?topic=t1")
    assert (created.status, created.body) == (200, b"")
    assert created.headers.get("x-nsq-content-type") == MARK
    assert "t1" in lookupd.get("/topics").json()["topics"]
    found = lookupd.get("/lookup?topic=t1")
    assert found.json() == {"channels": [], "producers": []}
    assert found.headers.get("x-nsq-content-type") == MARK
    assert lookupd.post("/channel/create?topic=t2&channel=c1").status == 200
    assert lookupd.get("/channels?topic=t2").json() == {"channels": ["c1"]}
    assert lookupd.get("/channels?topic=none").json() == {"channels": []}
    assert lookupd.post("/channel/delete?topic=t2&channel=c1").status == 200
    assert lookupd.get("/channels?topic=t2").json() == {"channels": []}
    assert lookupd.post("/topic/delete?topic=t2").status == 200
    assert lookupd.post("/topic/delete?topic=never").status == 200
    assert "t2" not in lookupd.get("/topics").json()["topics"]
    ping = lookupd.get("/ping")
    assert (ping.status, ping.body) == (200, b"OK")
    assert "version" in lookupd.get("/info").json()


def _peer(lookupd: Lookupd) -> dict[str, Any]:
    return {"broadcast_address": "127.0.0.1", "tcp_port": lookupd.tcp_port,
            "http_port": lookupd.http_port}  # fmt: skip


def _has(producer: dict[str, Any], want: dict[str, Any]) -> bool:
    return all(producer.get(k) == v for k, v in want.items())


def test_what_brokers_carry_is_registered(lookupd: Lookupd) -> None:
    lookupd.on_broker("/pub?topic=t3", b"hi")
    lookupd.on_broker("/channel/create?topic=t3&channel=ch")

    def found() -> Any:
        doc = lookupd.get("/lookup?topic=t3")
        return doc.status == 200 and doc.json()["channels"] == ["ch"] and doc.json()

    doc = eventually(found)
    assert len(doc["producers"]) == 1 and _has(doc["producers"][0], _peer(lookupd))
    assert set(doc["producers"][0]) == {"remote_address", "hostname", "broadcast_address",
                                        "tcp_port", "http_port", "version"}  # fmt: skip
    node = lookupd.get("/nodes").json()["producers"][0]
    assert _has(node, {**_peer(lookupd), "topics": ["t3"], "tombstones": [False]})
    assert "topic:t3:" in lookupd.get("/debug").json()

    # A tombstone hides the node for the topic in /lookup, and /nodes shows it.
    assert (
        lookupd.post(f"/topic/tombstone?topic=t3&node=127.0.0.1:{lookupd.http_port}").status == 200
    )
    assert lookupd.get("/lookup?topic=t3").json()["producers"] == []
    assert lookupd.get("/nodes").json()["producers"][0]["tombstones"] == [True]

    # The broker drops channel and topic: the registry keeps both keys, without it.
    lookupd.on_broker("/channel/delete?topic=t3&channel=ch")
    lookupd.on_broker("/topic/delete?topic=t3")
    eventually(lambda: lookupd.get("/nodes").json()["producers"][0]["topics"] == [])
    assert lookupd.get("/lookup?topic=t3").json() == {"channels": ["ch"], "producers": []}
    assert "t3" in lookupd.get("/topics").json()["topics"]


# -- SRTM only ---------------------------------------------------------------------------------
@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = start_cluster(tmp_path, 2, broker_args=["--mcap", "600"],
                      controller_args=["--broker-timeout-s", "30"])  # fmt: skip
    try:
        yield c
    finally:
        c.stop()


def test_a_broker_stopped_cleanly_is_dropped_at_once(cluster: LocalCluster) -> None:
    ctrl = cluster.controller
    eventually(lambda: len(ctrl.json("/nodes")["producers"]) == 2)
    stopped = cluster.brokers[1]
    stopped.stop()
    # The broker timeout is 30 s: gone within seconds means it deregistered.
    t0 = time.monotonic()
    eventually(lambda: len(ctrl.json("/nodes")["producers"]) == 1, timeout=5)
    assert time.monotonic() - t0 < 5
    assert ctrl.json("/nodes")["producers"][0]["tcp_port"] == cluster.brokers[0].tcp[1]


def test_a_lost_share_is_put_back(cluster: LocalCluster) -> None:
    ctrl = cluster.controller
    pubs = [{"id": f"p{i}", "rate": 10} for i in range(4)]
    doc = {"name": "m", "slo_p99_ms": 5.0, "burst": 20, "publishers": pubs}
    ctrl.post("/topics", json.dumps(doc).encode())

    def buckets() -> list[Any]:
        out = []
        for b in cluster.brokers:
            answer = request(b.url("/srtm/bucket?topic=m"), headers=b.headers)
            out.append(answer.json().get("bucket") if answer.status == 200 else None)
        return out

    before = eventually(lambda: (bs := buckets()) and any(bs) and bs)
    carrier = next(b for b, bucket in zip(cluster.brokers, before, strict=True) if bucket)
    # What nsqadmin's Delete does on the broker: the share goes with the topic...
    assert request(carrier.url("/topic/delete?topic=m"), "POST", b"", carrier.headers).status == 200
    # ... and the controller puts it back from the broker's next reports.
    eventually(lambda: buckets() == before)
    assert request(carrier.url("/topic/empty?topic=m"), "POST", b"", carrier.headers).status == 200
    assert ctrl.json("/lookup?topic=m")["producers"]


def test_nsq_tail_finds_a_broker_through_the_controller(cluster: LocalCluster) -> None:
    nsq = nsq_bin()
    b = cluster.brokers[0]
    for i in range(5):
        request(b.url("/pub?topic=tail"), "POST", f"m{i}".encode(), b.headers)
    eventually(lambda: request(cluster.url + "/lookup?topic=tail").status == 200)
    out = subprocess.run(
        [str(nsq / "nsq_tail"), "--lookupd-http-address", cluster.controller.http_address,
         "--topic", "tail", "--channel", "x", "-n", "5"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split()) == [f"m{i}" for i in range(5)]
