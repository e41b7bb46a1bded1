"""Several controllers on one etcd prefix (real etcd, real controller processes): exactly
one leads (``/info``); a standby answers reads from the state it follows and sends writes
to the leader (307); a leader killed with SIGKILL is replaced within a few seconds and
nothing it acknowledged is lost; a leader stopped past its lease is deposed and, resumed,
writes nothing (fenced); a broker refuses a deposed leader's epoch (409 STALE_LEADER)."""

from __future__ import annotations

import http.client
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from etcd_member import EtcdMember
from srtm.launch import ServerProcess, new_token, start_broker, start_controller
from support import eventually
from test_controller_etcd import create, etcd_args, etcd_keys, kill_9, new_prefix, register

pytestmark = pytest.mark.slow


def call(
    server: ServerProcess, method: str, path: str, doc: Any = None
) -> tuple[int, dict[str, str], Any]:
    """One request, redirects not followed: status, headers, the JSON body (or None)."""
    conn = http.client.HTTPConnection(*server.http, timeout=10)
    try:
        body = None if doc is None else json.dumps(doc).encode()
        conn.request(method, path, body=body, headers=server.headers)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = raw.decode(errors="replace")
        return resp.status, dict(resp.getheaders()), answer
    finally:
        conn.close()


def info(server: ServerProcess) -> dict[str, Any]:
    doc: dict[str, Any] = server.json("/info")
    return doc


def leaders(servers: list[ServerProcess]) -> list[ServerProcess]:
    return [s for s in servers if s.alive() and info(s)["leader"]]


def one_leader(servers: list[ServerProcess], timeout: float = 15.0) -> ServerProcess:
    found = eventually.blocking(
        lambda: leaders(servers), "one leader", until=lambda ls: len(ls) == 1, timeout=timeout
    )
    return found[0]


@pytest.fixture
def controllers(etcd: EtcdMember, tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """A factory's list: ``start(n)`` controllers on one new prefix, one token."""
    started: list[ServerProcess] = []
    yield started
    for s in started:
        if s.alive():
            s.proc.send_signal(signal.SIGCONT)
            s.stop()
        else:
            s.proc.wait()


def start(
    started: list[ServerProcess], etcd: EtcdMember, tmp_path: Path, n: int, prefix: str
) -> list[ServerProcess]:
    token = started[0].token if started else new_token()
    for _ in range(n):
        i = len(started)
        started.append(
            start_controller(tmp_path / f"c{i}.db", etcd_args(etcd, prefix), token=token)
        )
    return started


def test_three_controllers_elect_one_leader_and_standbys_answer_reads(
    etcd: EtcdMember, tmp_path: Path, controllers: list[ServerProcess]
) -> None:
    servers = start(controllers, etcd, tmp_path, 3, new_prefix())
    leader = one_leader(servers)
    standbys = [s for s in servers if s is not leader]
    lead_info = info(leader)
    assert lead_info["leader_http_address"] == leader.http_address
    assert isinstance(lead_info["epoch"], int) and lead_info["epoch"] > 0
    for s in standbys:
        doc = info(s)
        assert doc["leader"] is False and doc["epoch"] is None
        assert doc["leader_http_address"] == leader.http_address

    register(leader, "1", 40101)
    status, _, _ = call(leader, "POST", "/topics", {
        "name": "followed", "slo_p99_ms": 5.0, "burst": 20,
        "publishers": [{"id": f"p{i}", "rate": 10} for i in range(4)],
    })  # fmt: skip
    assert status == 201
    version = leader.json("/plan?topic=followed")["version"]
    for s in standbys:
        eventually.blocking(lambda s=s: s.json("/topics")["topics"], "the standby follows",
                            until=lambda names: names == ["followed"])  # fmt: skip
        assert s.json("/plan?topic=followed")["version"] == version
        lookup = s.json("/lookup?topic=followed")
        assert [p["tcp_port"] for p in lookup["producers"]] == [40101]
        assert s.json("/topics/followed")["topic"] == "followed"
        assert [b["id"] for b in s.json("/brokers")["brokers"]] == ["1"]
        assert s.json("/assign?topic=followed&publisher=p0")["broker"] == "1"
        ui = s.json("/ui/state")
        assert ui["info"]["plan_changes"].startswith(f"made by the leader at {leader.http_address}")
        assert [t["name"] for t in ui["topics"]] == ["followed"]

    # A write to a standby: 307 to the leader, same path and query; nothing changed.
    status, headers, _ = call(standbys[0], "POST", "/topics?x=1", {"name": "nope"})
    assert status == 307
    assert headers["Location"] == f"http://{leader.http_address}/topics?x=1"
    status, headers, _ = call(standbys[1], "DELETE", "/topics/followed")
    assert status == 307 and headers["Location"].endswith("/topics/followed")
    status, _, _ = call(standbys[1], "POST", "/brokers/1/report", {})
    assert status == 307
    # A join of an open topic changes its plan: the leader's too.
    status, _, _ = call(leader, "POST", "/topics", {
        "name": "open", "slo_p99_ms": 5.0, "burst": 20, "rate": 100, "open": True,
        "max_publisher_rate": 50, "publishers": [],
    })  # fmt: skip
    assert status == 201
    eventually.blocking(lambda: standbys[0].json("/topics")["topics"], "the open topic followed",
                        until=lambda names: "open" in names)  # fmt: skip
    status, headers, _ = call(standbys[0], "GET", "/assign?topic=open&publisher=j&rate=5")
    assert status == 307 and headers["Location"].endswith("/assign?topic=open&publisher=j&rate=5")
    assert call(leader, "GET", "/assign?topic=open&publisher=j&rate=5")[0] == 200
    assert sorted(leader.json("/topics")["topics"]) == ["followed", "open"]


def test_a_leader_killed_with_sigkill_is_replaced_and_its_acknowledged_topic_kept(
    etcd: EtcdMember, tmp_path: Path, controllers: list[ServerProcess]
) -> None:
    servers = start(controllers, etcd, tmp_path, 2, new_prefix())
    leader = one_leader(servers)
    (standby,) = [s for s in servers if s is not leader]
    register(leader, "1", 40111)
    for i in range(5):  # acknowledged, then the leader dies at once
        doc = {"name": f"acked-{i}", "slo_p99_ms": 5.0, "burst": 20,
               "publishers": [{"id": "p", "rate": 10}]}  # fmt: skip
        assert call(leader, "POST", "/topics", doc)[0] == 201
    killed = time.monotonic()
    kill_9(leader)
    new = one_leader([standby])
    takeover = time.monotonic() - killed
    print(f"takeover after SIGKILL of the leader: {takeover:.2f} s")
    assert info(new)["leader_http_address"] == new.http_address
    for i in range(5):
        assert new.json(f"/topics/acked-{i}")["topic"] == f"acked-{i}"
    # The new leader acts: a write through it is applied.
    assert (
        call(new, "POST", "/topics/acked-0/publishers", {"publishers": [{"id": "q", "rate": 5}]})[0]
        == 200
    )


def test_a_leader_stopped_with_sigterm_hands_over_at_once(
    etcd: EtcdMember, tmp_path: Path, controllers: list[ServerProcess]
) -> None:
    servers = start(controllers, etcd, tmp_path, 2, new_prefix())
    leader = one_leader(servers)
    (standby,) = [s for s in servers if s is not leader]
    register(leader, "1", 40131)
    create(leader, "kept", 2)
    stopped = time.monotonic()
    assert leader.stop() == 0  # its rows written, then its lease revoked
    new = one_leader([standby])
    print(f"takeover after SIGTERM of the leader: {time.monotonic() - stopped:.2f} s")
    assert new.json("/topics/kept")["topic"] == "kept"


def test_a_leader_stopped_past_its_lease_is_deposed_and_writes_nothing(
    etcd: EtcdMember, tmp_path: Path, controllers: list[ServerProcess]
) -> None:
    prefix = new_prefix()
    servers = start(controllers, etcd, tmp_path, 2, prefix)
    old = one_leader(servers)
    (other,) = [s for s in servers if s is not old]
    old_epoch = info(old)["epoch"]
    register(old, "1", 40121)
    old.proc.send_signal(signal.SIGSTOP)
    try:
        new = one_leader([other])
        assert info(new)["epoch"] > old_epoch
        create(new, "by-new", 3)
    finally:
        old.proc.send_signal(signal.SIGCONT)
    # Resumed: whatever it is asked at once is not applied (its lease lapsed: it does not
    # act; were it to write, the fence would refuse it).
    status, _, answer = call(old, "POST", "/topics", {
        "name": "by-old", "slo_p99_ms": 5.0, "burst": 20, "publishers": [{"id": "p", "rate": 1}],
    })  # fmt: skip
    assert status in (307, 503), (status, answer)
    eventually.blocking(lambda: info(old), "the old leader reports standby",
                        until=lambda d: d["leader"] is False
                        and d["leader_http_address"] == new.http_address)  # fmt: skip
    assert call(old, "POST", "/topics", {"name": "by-old"})[0] == 307
    keys = etcd_keys(etcd, prefix)
    assert "topic:by-new" in keys and "topic:by-old" not in keys
    eventually.blocking(lambda: old.json("/topics")["topics"], "the old one follows the new",
                        until=lambda names: names == ["by-new"])  # fmt: skip


def test_a_broker_refuses_a_push_with_a_stale_epoch(
    etcd: EtcdMember, tmp_path: Path, controllers: list[ServerProcess]
) -> None:
    servers = start(controllers, etcd, tmp_path, 1, new_prefix())
    leader = one_leader(servers)
    epoch = info(leader)["epoch"]
    broker = start_broker(
        tmp_path / "b1", ["--broker-id", "1", "--controller", leader.url("")], token=leader.token
    )
    try:
        eventually.blocking(lambda: leader.json("/brokers")["brokers"], "the broker registered")
        create(leader, "shaped", 3)  # its share pushed with the leader's epoch
        eventually.blocking(lambda: call(broker, "GET", "/srtm/bucket?topic=shaped")[2],
                            "the share pushed", until=lambda d: bool(d.get("bucket")))  # fmt: skip
        path = "/srtm/bucket?topic=shaped&rate=5.0&burst=5.0"
        for stale in (str(epoch - 1), "1"):
            conn = http.client.HTTPConnection(*broker.http, timeout=10)
            conn.request("POST", path, headers={**broker.headers, "X-SRTM-Epoch": stale})
            resp = conn.getresponse()
            doc = json.loads(resp.read())
            conn.close()
            assert resp.status == 409 and doc["message"] == "STALE_LEADER", doc
        assert broker.json("/srtm/bucket?topic=shaped")["bucket"]["rate"] != 5.0
    finally:
        broker.stop()


async def test_a_fenced_write_raises_to_its_waiter_and_steps_the_leader_down(
    etcd: EtcdMember,
) -> None:
    from srtm.control.etcd_store import EtcdStore, Fenced
    from srtm.control.handlers import saved
    from srtm.control.state import Controller
    from srtm.control.store_writer import StoreWriter
    from srtm.etcd import Compare
    from srtm.httpkit import HttpError

    prefix = new_prefix()
    store = EtcdStore([etcd.url], prefix)
    store.fence = Compare.created(f"{prefix}/leader", 12345)  # not this epoch's key
    told: list[Exception] = []
    writer = StoreWriter(Controller(), store, on_unsaved=told.append)
    try:
        with pytest.raises(HttpError) as refused:
            await saved(writer.mark(brokers=True))
        assert refused.value.status == 503 and refused.value.code == "NOT_LEADER"
        assert len(told) == 1 and isinstance(told[0], Fenced)
        assert etcd_keys(etcd, prefix) == []  # nothing written
        store.fence = None  # the only controller (no fence): written
        await saved(writer.mark(brokers=True))
        assert etcd_keys(etcd, prefix) == ["brokers"]
    finally:
        await writer.close()
        store.close()


def test_a_broker_given_every_controller_reports_to_the_new_leader(
    etcd: EtcdMember, tmp_path: Path, controllers: list[ServerProcess]
) -> None:
    servers = start(controllers, etcd, tmp_path, 2, new_prefix())
    leader = one_leader(servers)
    urls = ",".join(f"http://{s.http_address}" for s in servers)
    broker = start_broker(
        tmp_path / "b",
        ["--controller", urls, "--report-interval-s", "0.2", "--broker-id", "7"],
        token=leader.token,
    )
    try:
        eventually.blocking(lambda: leader.json("/brokers")["brokers"], "registered",
                            until=lambda bs: [b["id"] for b in bs] == ["7"])  # fmt: skip
        kill_9(leader)
        new = one_leader([s for s in servers if s is not leader])
        # Only a report tells a controller of an unmanaged topic: the broker now
        # reports to the new leader (it followed the standby's 307 or tried the next URL).
        broker.post("/topic/create?topic=after")
        eventually.blocking(lambda: producers(new, "after"), "reported",
                            until=lambda ports: ports == [broker.tcp[1]])  # fmt: skip
    finally:
        broker.stop()


def producers(ctrl: ServerProcess, topic: str) -> list[int]:
    """The TCP ports ``/lookup`` lists for ``topic`` (none while it answers 404)."""
    status, _, doc = call(ctrl, "GET", f"/lookup?topic={topic}")
    return [p["tcp_port"] for p in doc["producers"]] if status == 200 else []
