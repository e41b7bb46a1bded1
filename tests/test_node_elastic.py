"""Idle cores before new hosts: a node says how many processes it runs and may run, the
controller's provisioner adds a spawned broker to the node with the most idle cores, and
only when every node is full starts a new host's. The choice is pure; the live test runs
a real node, a real controller and the provisioner between them."""

from __future__ import annotations

import asyncio
import json
import re
import stat
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from srtm.broker.node import ChildPlan, NodeFull, added_plan
from srtm.control.nodes import (
    NodeProvisioner,
    NodeRoom,
    node_room,
    node_urls,
    pick_node,
    provisioner_for,
)
from srtm.control.options import ControllerOptions
from srtm.control.provision import CommandProvisioner, LocalProvisioner, ProvisionError
from srtm.control.service import ControllerService
from srtm.launch import ServerProcess, new_token, start_controller, start_node
from support import eventually

# -- pure: the node's side ------------------------------------------------------------------


def plans(*ids: int) -> list[ChildPlan]:
    return [ChildPlan(i, b, Path(f"d/b{i}"), ("10.0.0.1", 4150 + i), ("10.0.0.1", 4160 + i))
            for i, b in enumerate(ids)]  # fmt: skip


def test_an_added_process_gets_its_own_directory_by_id_and_any_ports() -> None:
    plan = added_plan(plans(10, 11), 1001, 4, Path("d"))
    assert plan == ChildPlan(2, 1001, Path("d/broker-1001"), ("10.0.0.1", 0), ("10.0.0.1", 0))


@pytest.mark.parametrize(
    ("ids", "new", "error"),
    [
        ((10, 11), 11, "broker 11 already runs on this node"),
        ((10,), 4096, "broker id 4096 is not in 0..4095"),
        ((10,), -1, "broker id -1 is not in 0..4095"),
    ],
)
def test_an_added_process_that_cannot_be_is_refused_by_name(
    ids: tuple[int, ...], new: int, error: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        added_plan(plans(*ids), new, 4, Path("d"))


def test_a_full_node_says_so() -> None:
    with pytest.raises(NodeFull, match="runs 2 of its 2 processes"):
        added_plan(plans(10, 11), 12, 2, Path("d"))


# -- pure: the controller's choice ----------------------------------------------------------


def room(url: str, running: int, most: int) -> NodeRoom:
    return NodeRoom(url, url.removeprefix("http://"), running, most)


def test_the_node_with_most_idle_cores_is_asked_first_ties_in_the_given_order() -> None:
    a, b, c = room("http://a", 4, 4), room("http://b", 1, 3), room("http://c", 0, 2)
    assert pick_node([a, b, c]) == b
    assert pick_node([a, c, b]) == c  # 2 idle each: the first given
    assert pick_node([a]) is None and pick_node([]) is None  # all full: a new host
    assert room("http://x", 5, 4).idle == 0  # running past its maximum is not room


def test_a_node_document_is_read_and_a_bad_one_refused_by_field() -> None:
    doc = {"host": "h1", "processes": 1, "max_processes": 2, "brokers": []}
    assert node_room("http://n", doc) == NodeRoom("http://n", "h1", 1, 2)
    for bad, field in (({**doc, "host": ""}, "'host'"), ({**doc, "processes": -1}, "'processes'"),
                       ({**doc, "max_processes": True}, "'max_processes'")):  # fmt: skip
        with pytest.raises(ValueError, match=field):
            node_room("http://n", bad)
    with pytest.raises(ValueError, match="not a JSON object"):
        node_room("http://n", [])


def test_node_urls_are_checked_by_name() -> None:
    assert node_urls("http://a:1/, http://b:2,http://a:1") == ("http://a:1", "http://b:2")
    for bad in ("", "a:1", "http://a:x", "ftp://a"):
        with pytest.raises(ValueError, match="--nodes"):
            node_urls(bad)


# -- live -----------------------------------------------------------------------------------


def node_doc(api: tuple[str, int]) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{api[0]}:{api[1]}/node", timeout=10) as resp:
        doc: dict[str, Any] = json.load(resp)
        return doc


def call(url: str, method: str, query: str, token: str) -> tuple[int, str]:
    """``/node/brokers?QUERY`` with the token: the status and the refusal's code."""
    req = urllib.request.Request(f"{url}/node/brokers?{query}", method=method,
                                 headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)["message"]


def hosts(ctrl: ServerProcess) -> dict[str, tuple[str, bool]]:
    return {b["id"]: (b["host"], b["down"]) for b in ctrl.json("/brokers")["brokers"]}


@pytest.mark.slow
async def test_a_spawn_takes_a_nodes_idle_core_before_a_new_host(tmp_path: Path) -> None:
    ctrl = start_controller(tmp_path / "c.db")
    assert ctrl.token is not None
    node = None
    try:
        node = start_node(tmp_path / "node", 1, [
            "--broker-id", "10", "--host-id", "h1", "--max-brokers", "2",
            "--node-address", "127.0.0.1:0", "--controller", f"http://{ctrl.http_address}",
            "--report-interval-s", "0.2",
        ], token=ctrl.token)  # fmt: skip
        assert node.api is not None
        url = f"http://{node.api[0]}:{node.api[1]}"
        # Without the token the node adds nothing.
        req = urllib.request.Request(f"{url}/node/brokers?id=7", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 401
        # New hosts through a real --provision-cmd hook that writes down what it is asked.
        log = tmp_path / "hook.log"
        hook = tmp_path / "hook.sh"
        hook.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
        hook.chmod(hook.stat().st_mode | stat.S_IXUSR)
        prov = NodeProvisioner([url], ctrl.token, CommandProvisioner(str(hook)), timeout_s=60)
        assert node_doc(node.api)["processes"] == 1

        await prov.start("1001")  # the node has an idle core: it runs the broker
        doc = node_doc(node.api)
        assert (doc["processes"], doc["max_processes"]) == (2, 2)
        assert [(b["id"], b["added"]) for b in doc["brokers"]] == [(10, False), (1001, True)]
        assert (tmp_path / "node" / "broker-1001").is_dir()
        await eventually(
            lambda: hosts(ctrl), "broker 1001 registered under the node's host",
            until=lambda h: h.get("1001") == ("h1", False),
        )  # fmt: skip
        assert not log.exists()  # no new host was asked for

        # The node's API refuses by name what it cannot do.
        for method, query, status, code in (
            ("POST", "id=1003", 409, "NODE_FULL"), ("POST", "id=x", 400, "INVALID_ID"),
            ("POST", "", 400, "MISSING_ARG_ID"), ("DELETE", "id=77", 404, "NOT_FOUND"),
        ):  # fmt: skip
            assert call(url, method, query, ctrl.token) == (status, code)

        await prov.start("1002")  # the node is full: a new host
        assert log.read_text().split("\n")[:-1] == ["start 1002"]
        assert prov.new_hosts == ["1002"] and prov.can_stop("1001")

        await prov.stop("1001")  # a despawn gives the core back to the node
        assert [b["id"] for b in node_doc(node.api)["brokers"]] == [10]
        assert call(url, "DELETE", "id=10", ctrl.token) == (400, "BAD_REQUEST")  # the last
        assert "1001" not in prov.added  # the hook may stop any broker: can_stop stays true
        await prov.stop("1002")
        assert log.read_text().split("\n")[:-1] == ["start 1002", "stop 1002"]
        assert node.stop(timeout=60) == 0
    finally:
        if node is not None and node.alive():
            node.stop()
        ctrl.stop()


async def test_no_node_and_no_new_host_is_a_provisioning_error() -> None:
    prov = NodeProvisioner(["http://127.0.0.1:9"], None, None, timeout_s=5)  # nothing there
    with pytest.raises(ProvisionError, match="no node has an idle core"):
        await prov.start("1001")


def test_the_controller_puts_its_nodes_before_its_new_host_provisioner() -> None:
    opts = ControllerOptions(nodes="http://n1:4149,http://n2:4149", provision_cmd="hook")
    prov = provisioner_for(opts, "http://c:4161")
    assert isinstance(prov, NodeProvisioner)
    assert prov.urls == ["http://n1:4149", "http://n2:4149"]
    assert isinstance(prov.new_host, CommandProvisioner)
    assert isinstance(provisioner_for(ControllerOptions(), "http://c:4161"), LocalProvisioner)


@pytest.mark.slow
async def test_the_elastic_loop_grows_a_node_before_it_asks_for_a_host(tmp_path: Path) -> None:
    """A controller under --rebalance with --min-brokers 2 and one broker up spawns one:
    with the node's API among its --nodes, the node runs it, under the node's host."""
    log, hook = tmp_path / "hook.log", tmp_path / "hook.sh"
    hook.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR)
    token = new_token()
    # The grace (one broker timeout) keeps the first spawn until the node is known.
    opts = ControllerOptions(
        db=tmp_path / "c.db", http_port=0, tick_s=0.2, token=token, rebalance=True,
        rebalance_interval_s=0.3, min_brokers=2, max_brokers=3, broker_timeout_s=15.0,
        provision_cmd=str(hook),
    )  # fmt: skip
    service = ControllerService(opts)
    await service.start()
    assert service.http_address is not None and service.elastic is not None
    url = "http://{}:{}".format(*service.http_address)
    node = None
    try:
        node = await asyncio.to_thread(start_node, tmp_path / "node", 1, [
            "--broker-id", "10", "--host-id", "h1", "--max-brokers", "2", "--node-address",
            "127.0.0.1:0", "--controller", url, "--report-interval-s", "0.2",
        ], token=token)  # fmt: skip
        assert node.api is not None
        # What --nodes URL would have built at the start, now that the node's port is known.
        with_nodes = replace(opts, nodes="http://{}:{}".format(*node.api))
        service.provisioner = provisioner_for(with_nodes, url)
        ctrl = service.ctrl
        await eventually(
            lambda: {b.id: b.host for b in ctrl.up()}, "the loop spawned 1001 on the node",
            until=lambda up: up == {"10": "h1", "1001": "h1"}, timeout=60,
        )  # fmt: skip
        doc = await asyncio.to_thread(node_doc, node.api)
        assert [(b["id"], b["added"]) for b in doc["brokers"]] == [(10, False), (1001, True)]
        assert not log.exists()  # no new host was asked for
        assert any("spawn 1001" in e for e in service.elastic.events)
    finally:
        await service.stop()
        if node is not None:
            await asyncio.to_thread(node.stop, 60)
