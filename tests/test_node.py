"""``srtm node``: N broker processes of one host, registered under its host id, restarted
when one dies (what it acknowledged is kept) and all stopped by one SIGTERM. The layout
and the restart backoff are pure; the end-to-end test runs a real node and controller."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nsq_raw import RawClient
from srtm.broker.node import (
    MAX_DELAY_S,
    ChildPlan,
    extra_flags_refused,
    layout,
    pick_cpu,
    restart_delay,
)
from srtm.launch import ServerProcess, start_broker, start_controller, start_node
from srtm.protocol import Pub, Rdy, Sub
from support import eventually

# -- the layout and the backoff ---------------------------------------------------------------


def test_each_process_gets_its_id_data_directory_and_ports() -> None:
    plans = layout(3, 10, Path("d"), ("0.0.0.0", 4150), None)
    assert plans == [
        ChildPlan(0, 10, Path("d/b0"), ("0.0.0.0", 4150), ("0.0.0.0", 4153)),
        ChildPlan(1, 11, Path("d/b1"), ("0.0.0.0", 4151), ("0.0.0.0", 4154)),
        ChildPlan(2, 12, Path("d/b2"), ("0.0.0.0", 4152), ("0.0.0.0", 4155)),
    ]
    assert layout(1, 0, Path("d"), ("h", 4150), None)[0].http == ("h", 4151)  # as nsqd
    anywhere = layout(2, 0, Path("d"), ("h", 0), None)
    assert [(p.tcp, p.http) for p in anywhere] == [(("h", 0), ("h", 0))] * 2
    argv = plans[1].argv("host-a", ["--mcap", "5"])
    assert argv == ["broker", "--broker-id", "11", "--data-dir", "d/b1",
                    "--tcp-address", "0.0.0.0:4151", "--http-address", "0.0.0.0:4154",
                    "--host-id", "host-a", "--mcap", "5"]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((0, 0, ("h", 0), None), "--brokers must be at least 1"),
        ((4, 4093, ("h", 0), None), "ids 4093..4096; broker ids are 0..4095"),
        ((4, 0, ("h", 4150), ("h", 4152)), "overlap"),
        ((4, 0, ("h", 65534), ("h", 0)), "--tcp-address port 65534 + 4 brokers passes 65535"),
    ],
)
def test_a_layout_that_cannot_be_is_refused_by_name(args: tuple, error: str) -> None:  # type: ignore[type-arg]
    n, base, tcp, http = args
    with pytest.raises(ValueError, match=re.escape(error)):
        layout(n, base, Path("d"), tcp, http)


def test_a_crash_loop_backs_off_to_a_ceiling() -> None:
    delays = [restart_delay(k) for k in range(1, 12)]
    assert delays[0] == 0.1 and delays[1] == 0.2 and delays == sorted(delays)
    assert delays[-1] == MAX_DELAY_S


def test_the_node_refuses_broker_options_it_sets_per_process() -> None:
    assert extra_flags_refused(["--mcap", "5", "--controller", "http://c"]) is None
    assert "--data-dir is set by srtm node" in str(extra_flags_refused(["--data-dir=x"]))
    assert "--broker-id" in str(extra_flags_refused(["--broker-id", "3"]))


def test_processes_take_a_cpu_each_in_turn_and_an_added_one_an_idle_cpu() -> None:
    cpus = [2, 5, 7]
    taken: list[int | None] = []
    for _ in range(5):
        taken.append(pick_cpu(cpus, taken))
    assert taken == [2, 5, 7, 2, 5]
    assert pick_cpu(cpus, [2, None, 7]) == 5  # a process not pinned takes no CPU
    assert pick_cpu(cpus, [2, 7, 2, 7, 5]) == 5  # after a removal, the idlest
    assert pick_cpu([3], [3, 3]) == 3


# -- a real node ------------------------------------------------------------------------------


def children(pid: int) -> dict[int, int]:
    """The node's broker processes: broker id -> pid."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids = (task / "children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended after the listing
            continue
        for child in kids:
            try:
                argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            except (FileNotFoundError, ProcessLookupError):
                continue  # it exited meanwhile (one exiting, not yet reaped, gives ESRCH)
            if b"--broker-id" in argv:
                out[int(argv[argv.index(b"--broker-id") + 1])] = int(child)
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def brokers(ctrl: ServerProcess) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = ctrl.json("/brokers")["brokers"]
    return rows


def lookup_ports(ctrl: ServerProcess, topic: str) -> set[int]:
    """The TCP ports /lookup lists for ``topic`` (none while no broker reported it: 404)."""
    try:
        return {p["tcp_port"] for p in ctrl.json(f"/lookup?topic={topic}")["producers"]}
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return set()
        raise


async def connected(tcp: tuple[str, int]) -> RawClient | None:
    try:
        return await RawClient.connect(*tcp)
    except ConnectionRefusedError:
        return None


def post(http: tuple[str, int], path: str, body: bytes, token: str) -> bytes:
    req = urllib.request.Request(f"http://{http[0]}:{http[1]}{path}", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:
        data: bytes = resp.read()
        return data


@pytest.mark.slow
async def test_a_node_registers_restarts_and_stops_its_brokers(tmp_path: Path) -> None:
    ctrl: ServerProcess = start_controller(tmp_path / "c.db")
    assert ctrl.token is not None
    try:
        node = start_node(tmp_path / "node", 2, [
            "--broker-id", "10", "--host-id", "rack1-h1", "--controller",
            f"http://{ctrl.http_address}", "--mem-queue-size", "0", "--report-interval-s", "0.2",
        ], token=ctrl.token)  # fmt: skip
    except BaseException:
        ctrl.stop()
        raise
    try:
        assert node.host == "rack1-h1" and [b[0] for b in node.brokers] == [10, 11]
        await eventually(
            lambda: sorted(
                (b["id"], b["host"], b["down"]) for b in ctrl.json("/brokers")["brokers"]
            ),
            "both processes registered under the node's host id",
            until=lambda rows: rows == [("10", "rack1-h1", False), ("11", "rack1-h1", False)],
        )
        for _, _, http in node.brokers:
            assert post(http, "/pub?topic=both", b"hello", ctrl.token) == b"OK"
        tcp_ports = {tcp[1] for _, tcp, _ in node.brokers}
        await eventually(
            lambda: lookup_ports(ctrl, "both"),
            "/lookup lists both processes", until=lambda ports: ports == tcp_ports,
        )  # fmt: skip
        # Broker 11 acknowledges a message (on disk: --mem-queue-size 0), then is killed.
        _, tcp, http = node.brokers[1]
        pub = await RawClient.connect(*tcp)
        await pub.send(Pub("kept", b"acknowledged"))
        assert await pub.response() == b"OK"
        await pub.close()
        before = children(node.proc.pid)
        assert set(before) == {10, 11}
        cpus = sorted(os.sched_getaffinity(0))  # the node's, as its parent's
        pinned = {b: os.sched_getaffinity(pid) for b, pid in before.items()}
        assert pinned == {10: {cpus[0]}, 11: {cpus[1 % len(cpus)]}}
        os.kill(before[11], signal.SIGKILL)
        after = await eventually(
            lambda: children(node.proc.pid), "broker 11 started again",
            until=lambda now: now.get(11, before[11]) != before[11], timeout=30,
        )  # fmt: skip
        assert after[10] == before[10]  # the other process was left alone
        assert os.sched_getaffinity(after[11]) == pinned[11]  # on its CPU again
        sub = await eventually(lambda: connected(tcp), "broker 11 listening at its address")
        await sub.send(Sub("kept", "c"), Rdy(1))
        assert await sub.response() == b"OK"
        assert (await sub.message(timeout=10)).body == b"acknowledged"
        await sub.close()
        await eventually(
            lambda: {b["id"]: b["down"] for b in brokers(ctrl)},
            "broker 11 up at the controller again", until=lambda d: d == {"10": False, "11": False},
        )  # fmt: skip
        assert node.stop(timeout=60) == 0
        assert not any(alive(pid) for pid in after.values())
    finally:
        if node.alive():
            node.stop()
        ctrl.stop()


@pytest.mark.parametrize("pin", [True, False])
def test_a_node_pins_its_processes_to_a_cpu_each_unless_told_not_to(
    tmp_path: Path, pin: bool
) -> None:
    flag = "--cpu-affinity" if pin else "--no-cpu-affinity"
    node = start_node(tmp_path / "node", 2, ["--node-address", "127.0.0.1:0", flag])
    try:
        assert node.api is not None
        url = f"http://{node.api[0]}:{node.api[1]}/node"
        with urllib.request.urlopen(url, timeout=10) as resp:
            rows = {b["id"]: b["cpu"] for b in json.load(resp)["brokers"]}
        cpus = sorted(os.sched_getaffinity(0))
        mine = {b: os.sched_getaffinity(pid) for b, pid in children(node.proc.pid).items()}
        if pin:
            assert rows == {0: cpus[0], 1: cpus[1 % len(cpus)]}
            assert mine == {b: {cpu} for b, cpu in rows.items()}
        else:
            assert rows == {0: None, 1: None}
            assert mine == {0: set(cpus), 1: set(cpus)}
        assert node.stop(timeout=60) == 0
    finally:
        if node.alive():
            node.stop()


def test_a_process_that_cannot_start_stops_the_node_with_its_reason(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "srtm", "node", "--brokers", "2", "--tcp-address",
           "127.0.0.1:0", "--data-dir", str(tmp_path), "--insecure-loopback",
           "--mcap", "-5"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "srtm node" not in done.stdout
    assert "--mcap" in done.stderr and "exited with code" in done.stderr


@pytest.mark.slow
async def test_a_node_killed_moves_the_publishers_of_every_process_it_had(tmp_path: Path) -> None:
    """kill -9 of the node takes both its processes with it: the controller marks both
    down and every publisher they had goes to the broker of the other host."""
    ctrl = start_controller(tmp_path / "c.db", ["--broker-timeout-s", "2"])
    assert ctrl.token is not None
    url = f"http://{ctrl.http_address}"
    node = other = None
    try:
        node = start_node(tmp_path / "node", 2, [
            "--broker-id", "10", "--host-id", "h1", "--controller", url, "--mcap", "600",
            "--report-interval-s", "0.2",
        ], token=ctrl.token)  # fmt: skip
        other = start_broker(tmp_path / "b20", [
            "--broker-id", "20", "--host-id", "h2", "--controller", url, "--mcap", "2000",
            "--report-interval-s", "0.2",
        ], token=ctrl.token)  # fmt: skip
        await eventually(lambda: len(brokers(ctrl)), "three brokers registered",
                         until=lambda n: n == 3)  # fmt: skip
        pubs = [{"id": f"p{i}", "rate": 10, "group": f"g{i}"} for i in range(9)]
        doc = {"name": "spread", "slo_p99_ms": 50, "burst": 20, "policy": "lb",
               "publishers": pubs}  # fmt: skip
        plan = json.loads(ctrl.post("/topics", json.dumps(doc).encode()))
        assert sorted(b["id"] for b in plan["brokers"]) == ["10", "11", "20"]  # both carry some

        node.proc.kill()  # the host dies: its processes die with the node
        node.proc.wait(timeout=10)
        await eventually(
            lambda: {b["id"]: b["down"] for b in brokers(ctrl)},
            "both processes of the node down", until=lambda d: d["10"] and d["11"],
        )  # fmt: skip

        def placed() -> set[str]:
            return {ctrl.json(f"/assign?topic=spread&publisher={p['id']}")["tcp_address"]
                    for p in pubs}  # fmt: skip

        await eventually(placed, "every publisher on the other host's broker",
                         until=lambda where: where == {other.tcp_address})  # fmt: skip
    finally:
        if node is not None and node.alive():
            node.stop()
        if other is not None:
            other.stop()
        ctrl.stop()
