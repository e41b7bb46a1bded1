"""The controller keeping its state in a real etcd member (``--etcd-endpoints``): a
controller killed with SIGKILL and started again on the same prefix has its brokers,
topics and plans back; prefixes keep controllers apart; etcd unreachable or a bad
endpoint stops it at start with one clear error."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import uuid
from pathlib import Path
from typing import Any

import pytest

from etcd_member import EtcdMember, start_etcd
from srtm.control.etcd_store import EtcdStore, claim_prefix
from srtm.launch import ServerProcess, start_controller
from support import eventually

pytestmark = pytest.mark.slow


def etcd_args(etcd: EtcdMember, prefix: str) -> list[str]:
    return ["--etcd-endpoints", etcd.url.removeprefix("http://"), "--etcd-prefix", prefix]


def new_prefix() -> str:
    return f"/srtm-test-{uuid.uuid4().hex[:8]}"


def register(ctrl: ServerProcess, bid: str, port: int) -> None:
    """A broker that is not there (its ports refuse): enough for a plan."""
    doc = {"id": bid, "tcp_address": f"127.0.0.1:{port}",
           "http_address": f"127.0.0.1:{port + 1}", "mcap": 600}  # fmt: skip
    ctrl.post("/brokers", json.dumps(doc).encode())


def create(ctrl: ServerProcess, name: str, n: int = 20) -> dict[str, Any]:
    pubs = [{"id": f"p{i}", "rate": 10} for i in range(n)]
    doc = {"name": name, "slo_p99_ms": 5.0, "burst": 20, "publishers": pubs}
    result: dict[str, Any] = json.loads(ctrl.post("/topics", json.dumps(doc).encode()))
    return result


def etcd_keys(etcd: EtcdMember, prefix: str) -> list[str]:
    """The keys under ``prefix/`` as etcd itself lists them (not through the controller)."""
    import urllib.request

    start = (prefix + "/").encode()
    end = start[:-1] + bytes([start[-1] + 1])
    body = {"key": base64.b64encode(start).decode(), "range_end": base64.b64encode(end).decode(),
            "keys_only": True}  # fmt: skip
    req = urllib.request.Request(f"{etcd.url}/v3/kv/range", data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        kvs = json.loads(resp.read()).get("kvs", [])
    return sorted(base64.b64decode(kv["key"]).decode().removeprefix(prefix + "/") for kv in kvs)


def kill_9(ctrl: ServerProcess) -> None:
    ctrl.proc.kill()
    ctrl.proc.wait(10)


def without_in_place(plan: dict[str, Any]) -> dict[str, Any]:
    # Whether its shares were pushed yet is each process's own.
    return {k: v for k, v in plan.items() if k != "in_place"}


def test_a_controller_killed_with_sigkill_resumes_from_etcd(
    etcd: EtcdMember, tmp_path: Path
) -> None:
    prefix, db = new_prefix(), tmp_path / "unused.db"
    ctrl = start_controller(db, etcd_args(etcd, prefix))
    try:
        register(ctrl, "1", 40001)
        create(ctrl, "durable")
        ctrl.post(
            "/topics/durable/publishers",
            json.dumps({"publishers": [{"id": "late", "rate": 5}]}).encode(),
        )
        before = ctrl.json("/plan?topic=durable")
        assert before["version"] > 1
        eventually.blocking(
            lambda: "topic:durable" in etcd_keys(etcd, prefix), "the topic written to etcd"
        )
    finally:
        kill_9(ctrl)
    again = start_controller(db, etcd_args(etcd, prefix), token=ctrl.token)
    try:
        assert [b["id"] for b in again.json("/brokers")["brokers"]] == ["1"]
        after = again.json("/plan?topic=durable")
        assert without_in_place(after) == without_in_place(before)
        assert after["version"] == before["version"]
        assert not db.exists()  # --db is not used with etcd
    finally:
        assert again.stop() == 0


def test_two_prefixes_keep_two_controllers_apart(etcd: EtcdMember, tmp_path: Path) -> None:
    a, b = new_prefix(), new_prefix()
    first = start_controller(tmp_path / "a.db", etcd_args(etcd, a))
    second = start_controller(tmp_path / "b.db", etcd_args(etcd, b))
    try:
        register(first, "1", 40011)
        create(first, "only-a")
        register(second, "2", 40021)
        create(second, "only-b")
        eventually.blocking(lambda: "topic:only-b" in etcd_keys(etcd, b), "b's topic written")
        eventually.blocking(lambda: "topic:only-a" in etcd_keys(etcd, a), "a's topic written")
    finally:
        kill_9(first)
        kill_9(second)
    assert "topic:only-b" not in etcd_keys(etcd, a)
    again = start_controller(tmp_path / "a.db", etcd_args(etcd, a), token=first.token)
    try:
        assert [b["id"] for b in again.json("/brokers")["brokers"]] == ["1"]
        assert again.json("/topics")["topics"] == ["only-a"]
    finally:
        assert again.stop() == 0


def test_a_write_failing_later_is_refused_and_the_controller_serves_on(tmp_path: Path) -> None:
    member = start_etcd(tmp_path / "etcd")  # its own: this test stops it
    log = (tmp_path / "controller.log").open("w")
    try:
        ctrl = start_controller(tmp_path / "c.db", etcd_args(member, "/srtm"), stderr=log)
        try:
            register(ctrl, "1", 40031)
            member.stop()
            # Never acknowledged: not saved (the write failed), or no leader (its lease
            # could not be renewed: it stopped acting).
            with pytest.raises(urllib.error.HTTPError) as refused:
                create(ctrl, "unsaved")
            assert refused.value.code == 503
            assert json.loads(refused.value.read())["message"] in ("NOT_SAVED", "NO_LEADER")
            doc = eventually.blocking(
                lambda: ctrl.json("/info"), "no longer leading", until=lambda d: not d["leader"]
            )
            assert doc["plan_changes"] == "wait for a leader: no controller leads now"
            assert ctrl.json("/brokers")["brokers"][0]["id"] == "1"  # it serves reads on
        finally:
            assert ctrl.stop() == 0
    finally:
        member.stop()
        log.close()


def run_controller(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``srtm controller`` expected to refuse to start: its exit and its output."""
    cmd = [sys.executable, "-m", "srtm", "controller", "--insecure-loopback",
           "--http-address", "127.0.0.1:0", "--db", str(tmp_path / "c.db"), *args]  # fmt: skip
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env)


def test_etcd_unreachable_at_start_is_one_clear_error(tmp_path: Path) -> None:
    from etcd_member import free_ports

    (port,) = free_ports(1)  # nothing listens there
    done = run_controller(["--etcd-endpoints", f"127.0.0.1:{port}"], tmp_path)
    assert done.returncode != 0
    assert f"cannot reach etcd at http://127.0.0.1:{port}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "srtm controller http=" not in done.stdout
    assert not (tmp_path / "c.db").exists()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--etcd-endpoints", "http://127.0.0.1:2379"], "--etcd-endpoints"),
        (["--etcd-endpoints", "127.0.0.1"], "--etcd-endpoints"),
        (["--etcd-endpoints", "127.0.0.1:2379,"], "--etcd-endpoints"),
        (["--etcd-endpoints", "127.0.0.1:2379", "--etcd-prefix", "srtm"], "--etcd-prefix"),
        (["--etcd-endpoints", "127.0.0.1:2379", "--etcd-prefix", "/"], "--etcd-prefix"),
    ],
)
def test_a_bad_etcd_setting_is_refused_by_name(args: list[str], named: str, tmp_path: Path) -> None:
    done = run_controller(args, tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"error: {named}: " in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_prefix_holding_another_clusters_state_is_refused(
    etcd: EtcdMember, tmp_path: Path
) -> None:
    foreign, theirs, ours = (f"/test-{uuid.uuid4().hex}" for _ in range(3))
    EtcdStore([etcd.url], foreign).put("config/x", "not srtm's")
    claim_prefix(EtcdStore([etcd.url], theirs), theirs, "their-token")
    endpoint = etcd.url.removeprefix("http://")
    for prefix, says in [
        (foreign, "holds keys there that are not an SRTM cluster's ('config/x')"),
        (theirs, "holds another cluster's state there (made with another --token)"),
    ]:
        done = run_controller(["--etcd-endpoints", endpoint, "--etcd-prefix", prefix], tmp_path)
        assert done.returncode == 2, done.stderr
        assert f"--etcd-prefix {prefix}: etcd " in done.stderr and says in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    # A prefix of its own is marked, and the same cluster's controller takes it again.
    store = EtcdStore([etcd.url], ours)
    claim_prefix(store, ours, None)
    claim_prefix(store, ours, None)
    marker = store.get("cluster")
    assert marker is not None and json.loads(marker.doc) == {"format": 1, "token_sha256": None}
    store.put("cluster", json.dumps({"format": 9, "token_sha256": None}))
    with pytest.raises(ValueError, match="in format 9, this controller reads format 1"):
        claim_prefix(store, ours, None)
