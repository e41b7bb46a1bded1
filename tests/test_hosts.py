"""Brokers that share a host (``srtm node``): the host each registers under is kept,
saved and shown; placement spreads a topic over hosts before processes; a host down moves
the publishers of every process it had."""

from __future__ import annotations

import pytest

from srtm.control import Controller
from srtm.control.documents import Brokers
from srtm.placement import BrokerCapacity, PublisherLoad, TopicSpec, for_topic, place
from srtm.placement.policies import by_residual
from support import ControllerClient


def topic(name: str, n: int, rate: float = 100.0) -> TopicSpec:
    pubs = tuple(PublisherLoad(f"{name}p{i}", rate, f"g{i // 2}") for i in range(n))
    return TopicSpec(name, pubs, 50, 5.0, 1.1 * rate * n)


def two_hosts(host: bool = True) -> list[BrokerCapacity]:
    """b0, b1 on host A and b2, b3 on host B (``host=False``: four hosts)."""
    return [BrokerCapacity(f"b{i}", 1000.0, 0.0, ("A" if i < 2 else "B") if host else "")
            for i in range(4)]  # fmt: skip


# -- the pure policies ------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["conc", "maxmin", "srtm"])
def test_a_topic_reaches_a_second_host_before_a_second_process(policy: str) -> None:
    spec = topic("t", 15)  # 1650 msg/s of bucket: two brokers of 1000
    placed = place(policy, for_topic(spec, two_hosts()), spec)  # type: ignore[arg-type]
    assert set(placed.brokers) == {"b0", "b2"}
    # one broker per host, as every fleet was before hosts: the first two by id
    alone = place(policy, for_topic(spec, two_hosts(False)), spec)  # type: ignore[arg-type]
    assert set(alone.brokers) == {"b0", "b1"}


def test_ties_are_ranked_round_the_hosts_and_capacity_still_comes_first() -> None:
    fleet = [*two_hosts(), BrokerCapacity("b4", 1000.0, 0.0, "A")]
    assert [b.id for b in by_residual(fleet)] == ["b0", "b2", "b1", "b3", "b4"]
    # more room on a host already ranked beats equal hosts: hosts only break ties
    fleet = [BrokerCapacity("b0", 1000, 0, "A"), BrokerCapacity("b1", 1000, 0, "A"),
             BrokerCapacity("b2", 1000, 500, "B")]  # fmt: skip
    assert [b.id for b in by_residual(fleet)] == ["b0", "b1", "b2"]
    # a host ranked in a run before counts in the next run
    fleet = [
        BrokerCapacity("a0", 1000, 0, "A"),
        BrokerCapacity("a1", 1000, 100, "A"),
        BrokerCapacity("b0", 1000, 100, "B"),
        BrokerCapacity("b1", 1000, 100, "B"),
    ]
    assert [b.id for b in by_residual(fleet)] == ["a0", "b0", "a1", "b1"]


def test_the_ledger_and_the_topic_view_keep_the_host() -> None:
    spec = topic("t", 10)
    assert [b.host for b in for_topic(spec, two_hosts())] == ["A", "A", "B", "B"]


# -- the controller ------------------------------------------------------------------------


def node_cluster(hosts: int = 2, per_host: int = 2) -> Controller:
    """``hosts`` hosts h0… of ``per_host`` brokers each (b0, b1 on h0, …), mcap 1000."""
    c = Controller(broker_timeout_s=5)
    for i in range(hosts * per_host):
        addr = f"127.0.0.1:{4150 + i}"
        c.register(f"b{i}", addr, addr, 1000.0, now=0, host=f"h{i // per_host}")
    return c


def placed(c: Controller, name: str) -> set[str]:
    return {b for b, ps in c.topics[name].assignment.items() if ps}


def test_the_host_is_kept_saved_and_restored_and_old_rows_have_their_own() -> None:
    c = node_cluster()
    c.register("old", "127.0.0.1:9", "127.0.0.1:9", 1000.0, now=0)  # a broker telling none
    assert [b.host for b in c.brokers.values()] == ["h0", "h0", "h1", "h1", "old"]
    doc = c.to_json()
    again = Controller()
    again.restore(doc, now=0)
    assert {b.id: b.host for b in again.brokers.values()} == {
        b.id: b.host for b in c.brokers.values()
    }
    for row in doc["brokers"]:
        del row["host"]  # saved before hosts
    older = Controller()
    older.restore(doc, now=0)
    assert all(b.host == b.id for b in older.brokers.values())


def test_the_controller_spreads_a_topic_over_hosts() -> None:
    c = node_cluster()
    c.create_topic(topic("t0", 15), "srtm", now=0)
    assert placed(c, "t0") == {"b0", "b2"}  # without hosts: b0 and b1, one host


def test_a_host_down_moves_the_publishers_of_every_process_it_had() -> None:
    c = node_cluster(hosts=3)
    c.create_topic(topic("t0", 15), "srtm", now=0)
    c.create_topic(topic("t1", 12, rate=10.0), "lb", now=0)  # beside it
    assert placed(c, "t0") == {"b0", "b2"} and "b1" in placed(c, "t1")  # both on h0
    for b in ("b2", "b3", "b4", "b5"):  # host h0 (b0, b1) goes silent
        c.report(b, 0.0, {}, now=5.5)
    c.tick(now=5.5)
    assert c.brokers["b0"].down and c.brokers["b1"].down
    for name in ("t0", "t1"):
        t = c.topics[name]
        assert not placed(c, name) & {"b0", "b1"} and not t.unassigned
        assert sum(map(len, t.assignment.values())) == len(t.spec.publishers)
    assert any(e.startswith("broker b0 down") for e in c.topics["t0"].events)
    # b0's publishers went straight to other hosts, never to b1, down in the same tick
    assert not any("b1" in e for e in c.topics["t0"].events)
    assert any(e.startswith("broker b1 down") for e in c.topics["t1"].events)


# -- over HTTP ----------------------------------------------------------------------------


async def test_brokers_and_nodes_show_the_host(controller_api: ControllerClient) -> None:
    api = controller_api
    for i, host in enumerate(["n1", "n1", None]):
        addr = f"127.0.0.1:{9 + i}"  # nothing listens: pushes fail, logged
        doc: dict[str, object] = {"id": f"b{i}", "tcp_address": addr, "http_address": addr}
        doc |= {"mcap": 1000} | ({"host": host} if host else {})
        assert (await api.call("POST", "/brokers", doc))[0] == 200
    status, body = await api.call("GET", "/brokers")
    assert status == 200
    assert [(b.id, b.host) for b in Brokers.model_validate(body).brokers] == [
        ("b0", "n1"), ("b1", "n1"), ("b2", "b2")
    ]  # fmt: skip
    status, body = await api.call("GET", "/nodes")
    assert status == 200
    assert [(p["hostname"], p["broadcast_address"], p["tcp_port"]) for p in body["producers"]] == [
        ("n1", "127.0.0.1", 9), ("n1", "127.0.0.1", 10), ("b2", "127.0.0.1", 11)
    ]  # fmt: skip
    status, body = await api.call("POST", "/brokers", {"id": "b3", "tcp_address": "127.0.0.1:12",
                                                       "http_address": "127.0.0.1:12",
                                                       "mcap": 1000, "host": ""})  # fmt: skip
    assert status == 400 and "host" in str(body)


def test_part_of_a_topic_placed_again_goes_to_a_host_it_does_not_have() -> None:
    fleet = [BrokerCapacity(f"b{i}", 1000.0, 0.0, "AABBCC"[i]) for i in range(6)]
    spec = topic("t", 5)  # one broker's worth
    assert place("srtm", fleet, spec).brokers == ("b0",)
    assert place("srtm", fleet, spec, hosts_used={"A"}).brokers == ("b2",)
    assert place("srtm", fleet, spec, hosts_used={"A", "B"}).brokers == ("b4",)


def test_a_failover_places_a_topic_on_a_host_it_does_not_have_yet() -> None:
    c = node_cluster(hosts=3)
    c.create_topic(topic("t0", 15), "srtm", now=0)
    assert placed(c, "t0") == {"b0", "b2"}
    for b in ("b0", "b1", "b3", "b4", "b5"):
        c.report(b, 0.0, {}, now=5.5)
    c.tick(now=5.5)  # b2 is down: b1 (on h0, with b0) ranks first of the empty brokers
    assert c.brokers["b2"].down and placed(c, "t0") == {"b0", "b3"}
