"""Forwarding (lazy plan propagation) and ALL_PUBLISHERS replication, the controller's side:
which broker gets which route, in which order, and what survives a restart (pure; the
endpoint and the live cluster are in tests/test_routes_live.py)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

from srtm.control import Controller
from srtm.control.actions import (
    Action,
    DropRoute,
    Hold,
    Migrate,
    PlanChanged,
    SetBucket,
    SetRoute,
)
from srtm.control.documents import Error, TopicStatus
from srtm.control.elastic import Elastic
from srtm.control.plans import adapt_topic
from srtm.control.routes import Routing, changes, home_channels
from srtm.control.state import ControlError
from srtm.placement import PublisherLoad, TopicSpec
from srtm.placement.rebalance import RebalanceSettings
from srtm.ratelimit import BucketParams
from support import ControllerClient, eventually
from support import registered as cluster


def spec(n: int = 4, rate: float = 10.0) -> TopicSpec:
    pubs = tuple(PublisherLoad(f"p{i}", rate, f"g{i % 2}") for i in range(n))
    return TopicSpec("t", pubs, 40, 5.0, 1.1 * n * rate)


def tcp(c: Controller, b: str) -> str:
    return c.brokers[b].tcp_address


def routes_of(actions: list[Action]) -> dict[str, dict[str, Any]]:
    return {a.broker: a.doc for a in actions if isinstance(a, SetRoute)}


def on_one(c: Controller, broker: str = "b0") -> None:
    c.create_topic(spec(), "srtm", now=0)
    pubs = [p.id for p in c.topics["t"].spec.publishers]
    c.set_assignment("t", {broker: pubs}, [], "test")


# -- forwarding ------------------------------------------------------------------------------


def test_a_move_gives_the_old_broker_a_forward_after_the_destination_has_its_share() -> None:
    c = cluster(3)
    on_one(c)
    actions = c.move("t", ["p0", "p1"], "b1")
    doc = routes_of(actions)["b0"]
    assert doc["self"] == "b0" and doc["topic"] == "t" and doc["replicas"] is None
    assert doc["forward"] == {
        "to": None,  # b0 still has publishers of t: only the moved ones are forwarded
        "publishers": {"p0": tcp(c, "b1"), "p1": tcp(c, "b1")},
        "grace_s": 10.0,
    }
    kinds = [type(a) for a in actions]
    grow = kinds.index(SetBucket) if SetBucket in kinds else -1
    route = kinds.index(SetRoute)
    # shares, then routes, then the migration orders, then the plan's version
    assert grow < route < kinds.index(Migrate) < kinds.index(PlanChanged)
    assert set(routes_of(actions)) == {"b0"}  # nobody else has anything to forward


def test_a_broker_dropped_from_the_plan_forwards_everything_to_the_largest_share() -> None:
    c = cluster(3)
    on_one(c)
    c.set_assignment("t", {"b1": ["p0", "p1", "p2"], "b2": ["p3"]}, [], "split")
    doc = c.topics["t"].routing.pushed["b0"]
    assert doc["forward"]["to"] == tcp(c, "b1")  # b1 has the larger share
    assert doc["forward"]["publishers"] == {
        "p0": tcp(c, "b1"), "p1": tcp(c, "b1"), "p2": tcp(c, "b1"), "p3": tcp(c, "b2"),
    }  # fmt: skip


def test_forwards_follow_later_moves_and_end_when_a_publisher_comes_back() -> None:
    c = cluster(3)
    on_one(c)
    c.move("t", ["p0"], "b1")
    actions = c.move("t", ["p0"], "b2")  # b0 and b1 both forward p0, to b2 now
    got = routes_of(actions)
    assert got["b0"]["forward"]["publishers"] == {"p0": tcp(c, "b2")}
    assert got["b1"]["forward"]["publishers"] == {"p0": tcp(c, "b2")}
    assert got["b1"]["forward"]["to"] == tcp(c, "b0")  # b1 carries none of t now
    actions = c.move("t", ["p0"], "b0")  # back home: b0 forwards nothing
    assert DropRoute("b0", "t") in actions
    assert routes_of(actions)["b2"]["forward"]["publishers"] == {"p0": tcp(c, "b0")}


def test_a_publisher_leaving_the_topic_is_no_longer_forwarded() -> None:
    c = cluster(2)
    on_one(c)
    c.move("t", ["p0"], "b1")
    actions = c.remove_publisher("t", "p0")
    assert DropRoute("b0", "t") in actions and not c.topics["t"].routing.left


def test_routes_survive_a_restart_and_a_registering_broker_gets_its_own_again() -> None:
    c = cluster(3)
    on_one(c)
    c.move("t", ["p0"], "b1")
    c.set_replicas("t", 1)  # not replicated: nothing
    again = Controller(forward_grace_s=3.0)
    again.restore(c.to_json(), now=0)
    r = again.topics["t"].routing
    assert r.left == {"b0": ["p0"]} and r.where["p0"] == "b1"
    assert set(r.pushed) == {"b0"}  # what the brokers kept
    assert not routes_of(again.tick(1.0))  # nothing to push again
    info = again.brokers["b0"]
    back = again.register("b0", info.tcp_address, info.http_address, 1000, now=2)
    assert routes_of(back)["b0"]["forward"]["grace_s"] == 3.0


def test_delete_drops_every_route() -> None:
    c = cluster(2)
    on_one(c)
    c.move("t", ["p0"], "b1")
    assert DropRoute("b0", "t") in c.delete_topic("t")


# -- replication -------------------------------------------------------------------------


def carry(c: Controller, broker: str, *channels: str, egress: float = 0.0) -> None:
    c.report(
        broker, 0.0, {}, now=1, carried={"t": frozenset(channels)}, resources=resources(egress)
    )


def resources(egress: float, cpu: float = 0.0) -> dict[str, Any]:
    """A report's ``resources`` (documents.BrokerResources)."""
    return {"cpu": cpu, "egress_bps": egress, "congested": {"cpu": False, "network": False}}


def test_replicas_each_shape_with_the_whole_bucket_and_the_ledger_counts_r_on_each() -> None:
    c = cluster(3)
    on_one(c)
    actions = c.set_replicas("t", 3)
    t = c.topics["t"]
    assert t.routing.replicas[0] == "b0" and set(t.routing.replicas) == {"b0", "b1", "b2"}
    whole = BucketParams(44.0, 40.0)
    assert t.buckets == dict.fromkeys(t.routing.replicas, whole)
    assert {e.id: e.allocated for e in c.ledger()} == dict.fromkeys(("b0", "b1", "b2"), 44.0)
    docs = routes_of(actions)
    for b in t.routing.replicas:
        rep = docs[b]["replicas"]
        assert rep["primary"] == "b0" and docs[b]["forward"] is None
        assert rep["peers"] == {o: tcp(c, o) for o in t.routing.replicas if o != b}
    assert c.assign("t", "p0")["broker"] == "b0"  # publishers publish to the primary
    assert [b.id for b in c.producers("t")] == t.routing.replicas  # /lookup lists all
    assert not adapt_topic(c, t, now=1e9)  # nothing to re-split: each has all of it
    assert not [a for a in c.tick(2.0) if isinstance(a, SetBucket | Hold)]


def test_channels_are_homed_on_the_least_egress_and_stay_put() -> None:
    c = cluster(3)
    on_one(c)
    c.set_replicas("t", 3)
    for b, egress in (("b0", 500.0), ("b1", 100.0), ("b2", 300.0)):
        carry(c, b, "a", egress=egress)
    actions = c.tick(2.0)
    assert c.topics["t"].routing.homes == {"a": "b1"}
    assert all(d["replicas"]["homes"] == {"a": "b1"} for d in routes_of(actions).values())
    order = [a.broker for a in actions if isinstance(a, SetRoute)]
    assert order[0] == "b1"  # the new home hears first: duplicates possible, loss never
    carry(c, "b1", "a", "b", "c", egress=900.0)
    c.tick(3.0)
    # a stays on b1, now the busiest; b goes to the least egress of those with no home
    # (b2: 300 B/s), then c to b0, the one replica still without a home
    assert c.topics["t"].routing.homes == {"a": "b1", "b": "b2", "c": "b0"}
    # one by one, idle replicas whose egress differs by noise: spread, not piled up
    assert home_channels({}, ["x", "y", "z"], ["a"], {"x": 10, "y": 12, "z": 15}) == {"a": "x"}
    noise = {"x": 10.0, "y": 12.0, "z": 15.0}
    homes: dict[str, str] = {}
    for ch in ("a", "b", "c"):
        homes = home_channels(homes, ["x", "y", "z"], [*homes, ch], noise)
    assert sorted(homes.values()) == ["x", "y", "z"]
    # all at once on idle replicas whose handshakes alone differ tenfold (measured live):
    # one each, not two on the two quietest
    idle = {"x": 2236.0, "y": 1831.0, "z": 21423.0}
    assert home_channels({}, ["x", "y", "z"], ["c1", "c2", "c3"], idle) == {
        "c1": "y",
        "c2": "x",
        "c3": "z",
    }
    assert not routes_of(c.tick(4.0))  # nothing changed: nothing pushed


def test_a_replica_lost_rehomes_only_its_channels_and_the_next_one_is_primary() -> None:
    c = cluster(3)
    on_one(c)
    c.set_replicas("t", 3)
    t = c.topics["t"]
    t.routing.homes = {"a": "b0", "b": "b1", "c": "b2"}
    for b in ("b0", "b1", "b2"):
        carry(c, b, "a", "b", "c")
    c.tick(2.0)
    actions = c.deregister("b0")  # the primary goes
    assert t.routing.replicas == ["b1", "b2"] and t.assignment == {"b1": ["p0", "p1", "p2", "p3"]}
    assert t.routing.homes["b"] == "b1" and t.routing.homes["c"] == "b2"
    assert t.routing.homes["a"] in {"b1", "b2"}
    assert routes_of(actions)["b2"]["replicas"]["primary"] == "b1"
    c.deregister("b2")  # one left: no replication, an ordinary topic on b1
    assert t.routing.replicas == [] and t.routing.homes == {}
    assert t.buckets == {"b1": BucketParams(44.0, 40.0)}


def test_unreplicate_shrinks_and_the_removed_replica_loses_its_route_last() -> None:
    c = cluster(3)
    on_one(c)
    c.set_replicas("t", 3)
    gone = c.topics["t"].routing.replicas[-1]
    actions = c.unreplicate("t", gone)
    assert gone not in c.topics["t"].routing.replicas
    routed = [a for a in actions if isinstance(a, SetRoute | DropRoute)]
    assert routed[-1] == DropRoute(gone, "t")
    assert all(gone not in a.doc["replicas"]["peers"] for a in routed if isinstance(a, SetRoute))
    # it may still hold messages waiting for tokens: it drains, within (r, b) with b0
    assert c.topics["t"].draining.keys() == {gone}
    with pytest.raises(ControlError) as err:
        c.unreplicate("t", "b0")  # the primary is not removed this way
    assert err.value.status == 400


def test_replication_refusals_and_moves_that_would_split_a_replicated_topic() -> None:
    c = cluster(3)
    c.create_topic(spec(), "srtm", now=0)
    c.set_assignment("t", {"b0": ["p0", "p1"], "b1": ["p2", "p3"]}, [], "split")
    for count, status in ((2, 409), (4, 400), (0, 400)):
        with pytest.raises(ControlError) as err:
            c.set_replicas("t", count)
        assert err.value.status == status
    c.move("t", ["p2", "p3"], "b0")
    c.set_replicas("t", 2)
    with pytest.raises(ControlError) as err:
        c.move("t", ["p0"], "b2")
    assert err.value.status == 409
    c.move("t", ["p0", "p1", "p2", "p3"], "b2")  # whole: b2 takes the primary's place
    assert c.topics["t"].routing.replicas[0] == "b2" and len(c.topics["t"].routing.replicas) == 2
    with pytest.raises(ControlError) as err:
        c.change_topic("t", policy="lb")  # placing again would split it
    assert err.value.status == 409 and c.topics["t"].policy == "srtm"


def test_a_refused_replication_changes_nothing() -> None:
    c = cluster(3)
    on_one(c)
    c.brokers["b2"].down = True
    with pytest.raises(ControlError) as err:
        c.set_replicas("t", 2, ["b2"])
    assert err.value.status == 400 and c.topics["t"].routing.replicas == []
    assert c.topics["t"].buckets.keys() == {"b0"}


def test_replicas_survive_a_restart() -> None:
    c = cluster(3)
    on_one(c)
    c.set_replicas("t", 3)
    c.topics["t"].routing.homes = {"a": "b2"}
    again = Controller()
    again.restore(c.to_json(), now=0)
    r = again.topics["t"].routing
    assert r.replicas == c.topics["t"].routing.replicas and r.homes == {"a": "b2"}
    assert set(r.pushed) == set(r.replicas)
    # no broker has reported its channels yet: homes stay, nothing is pushed
    assert not routes_of(again.tick(1.0)) and r.homes == {"a": "b2"}


def test_home_channels_and_changes_by_themselves() -> None:
    assert home_channels({}, ["x"], ["a"], {}) == {}  # one broker: nothing to home
    homes = home_channels({"a": "gone"}, ["x", "y"], ["a", "b"], {})
    assert homes == {"a": "x", "b": "y"}  # equal egress: the fewest homes, then the set's order
    assert home_channels({"e#ephemeral": "x", "k": "y"}, ["x", "y"], [], {}) == {"k": "y"}
    r = Routing()
    doc = {"topic": "t", "self": "x", "forward": None, "replicas": None}
    assert changes(r, {"x": doc}) == [SetRoute("x", "t", doc)]
    assert changes(r, {"x": doc}) == [] and changes(r, {}) == [DropRoute("x", "t")]


# -- the rebalancer's decisions and the reports --------------------------------------------


def test_the_elastic_loop_replicates_a_topic_with_too_much_fan_out() -> None:
    c = cluster(3, mcap=100)
    on_one(c)  # 40 msg/s, r 44
    for b in ("b0", "b1", "b2"):
        carry(c, b, "a", "b", "c")  # 3 channels: 40 x 3 x 100 B = 12 kB/s out
    el = Elastic(RebalanceSettings(window_s=1.0, min_plan_interval_s=0.0, egress_max=10_000))
    el.observe(c, 1.0)
    step = el.step(c, 1.0, lambda b: True)
    assert [d.to_json()["action"] for d in step.decisions] == ["replicate"]
    assert len(c.topics["t"].routing.replicas) == 2
    assert routes_of(step.actions).keys() == set(c.topics["t"].routing.replicas)


def test_report_resources_are_the_rebalancers_cpu_and_egress_and_default_to_zero() -> None:
    c = cluster(2)
    c.report("b0", 1.0, {}, now=1, resources=resources(egress=2e6, cpu=0.5))
    assert c.brokers["b0"].usage() == (0.5, 2e6)
    assert c.brokers["b1"].usage() == (0.0, 0.0)  # it told none
    el = Elastic(RebalanceSettings(window_s=1.0))
    el.observe(c, 1.0)
    w = el.averager.window("b0", 1000, 1.0)
    assert (w.cpu, w.egress) == (0.5, 2e6)


# -- over HTTP ----------------------------------------------------------------------------


async def test_the_replicas_endpoint(controller_api: ControllerClient) -> None:
    api = controller_api
    for i, port in enumerate((9, 19, 29)):  # nothing listens: pushes fail, logged
        addr = f"127.0.0.1:{port}"
        doc = {"id": f"b{i}", "tcp_address": addr, "http_address": addr, "mcap": 1000}
        assert (await api.call("POST", "/brokers", doc))[0] == 200
    pubs = [{"id": f"p{i}", "rate": 10} for i in range(4)]
    topic = {"name": "t", "slo_p99_ms": 5.0, "burst": 40, "publishers": pubs}
    assert (await api.call("POST", "/topics", topic))[0] == 201
    status, body = await api.call("POST", "/topics/t/replicas", {"count": 3})
    assert status == 200, body
    doc = TopicStatus.model_validate(body)
    assert len(doc.replicas) == 3 and doc.replicas[0] == doc.brokers[0].id
    _, lookup = await api.call("GET", "/lookup?topic=t")
    assert len(lookup["producers"]) == 3
    for path, body_, code in (
        ("/topics/nope/replicas", {"count": 2}, 404),
        ("/topics/t/replicas", {"count": 0}, 400),
        ("/topics/t/replicas", {"count": "2"}, 400),
        ("/topics/t/replicas", {"count": 9}, 400),
    ):
        got, answer = await api.call("POST", path, body_)
        assert got == code and Error.model_validate(answer).message
    status, body = await api.call("POST", "/topics/t/replicas", {"count": 1})
    assert status == 200 and TopicStatus.model_validate(body).replicas == []
    _, openapi = await api.call("GET", "/openapi.json")
    assert "post" in openapi["paths"]["/topics/{name}/replicas"]


async def test_the_service_pushes_the_forwarding_route_first_then_shares_then_orders(
    controller_api: ControllerClient,
) -> None:
    """At the edge: brokers (one fake HTTP API for both) see the old broker's forwarding
    route first (what its publishers still send it is forwarded, not shaped by its
    shrinking share), or with its decrease (a handoff: its body), then a move's
    sub-buckets, then the migration orders. A handoff arms the destination first
    (/srtm/bucket/arm changes no share)."""
    seen: list[str] = []

    async def record(request: web.Request) -> web.Response:
        routed = request.path.startswith("/srtm/bucket") and await request.read()
        seen.append(request.path + ("+route" if routed else ""))
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        api = controller_api
        for i in range(2):
            doc = {"id": f"b{i}", "tcp_address": f"127.0.0.1:{9 + 10 * i}",
                   "http_address": f"127.0.0.1:{port}", "mcap": 1000}  # fmt: skip
            assert (await api.call("POST", "/brokers", doc))[0] == 200
        pubs = [{"id": f"p{i}", "rate": 10} for i in range(4)]
        topic = {"name": "t", "slo_p99_ms": 5.0, "burst": 40, "publishers": pubs}
        status, body = await api.call("POST", "/topics", topic)
        assert status == 201 and len(body["brokers"]) == 1
        src = body["brokers"][0]["id"]
        dest = "b1" if src == "b0" else "b0"
        await eventually(lambda: "/srtm/bucket" in seen, "the first plan pushed")
        seen.clear()
        move = {"publishers": ["p0", "p1", "p2", "p3"], "to": dest}
        assert (await api.call("POST", "/topics/t/move", move))[0] == 200
        await eventually(lambda: seen.count("/srtm/migrate") == 4, "the orders sent")
    finally:
        await runner.cleanup()
    first_route = min(i for i, p in enumerate(seen) if p == "/srtm/route" or p.endswith("+route"))
    buckets = [i for i, p in enumerate(seen) if p.startswith("/srtm/bucket")]
    shares = [i for i in buckets if not seen[i].startswith("/srtm/bucket/arm")]
    assert shares and first_route <= min(shares), seen
    assert max(buckets) < seen.index("/srtm/migrate")
