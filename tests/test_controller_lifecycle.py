"""The topic and publisher lifecycle: delete, change (PATCH), publishers joining and
leaving, open topics whose publishers register themselves on /assign."""

from __future__ import annotations

import asyncio
import json
import math
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from srtm.client import Publisher, Received, Subscriber
from srtm.control import Controller
from srtm.control.actions import Migrate, PlanChanged, SetBucket, Unmanage
from srtm.control.documents import Brokers, Deleted, Error, TopicStatus
from srtm.control.state import ControlError
from srtm.launch import start_cluster
from srtm.placement import PublisherLoad, TopicSpec
from support import ControllerClient, eventually
from support import registered as cluster


def spec(name: str, n: int = 8, rate: float = 100.0, groups: int = 4) -> TopicSpec:
    pubs = tuple(PublisherLoad(f"p{i}", rate, f"g{i % groups}") for i in range(n))
    return TopicSpec(name, pubs, 50, 5.0, 1.1 * n * rate)


def where(c: Controller, topic: str) -> dict[str, str]:
    return {p: b for b, ps in c.topics[topic].assignment.items() for p in ps}


def allocated(c: Controller) -> dict[str, float]:
    return {e.id: e.allocated for e in c.ledger()}


# -- the controller's decisions, no I/O -------------------------------------------------------


def test_delete_frees_the_ledger_and_unmanages_on_every_broker_up() -> None:
    c = cluster(3)
    c.create_topic(spec("t"), "srtm", now=0)
    assert allocated(c)["b0"] == pytest.approx(880)
    c.brokers["b2"].down = True
    actions = c.delete_topic("t")
    assert actions == [Unmanage("b0", "t"), Unmanage("b1", "t")]
    assert "t" not in c.topics and allocated(c) == {"b0": 0.0, "b1": 0.0, "b2": 0.0}
    with pytest.raises(ControlError) as err:
        c.delete_topic("t")
    assert err.value.status == 404
    again = Controller()
    again.restore(c.to_json(), now=0)
    assert "t" not in again.topics


def test_a_deleted_topic_is_looked_up_where_brokers_still_hold_it() -> None:
    c = cluster(2)
    c.create_topic(spec("t"), "srtm", now=0)
    c.delete_topic("t")
    assert c.producers("t") == []
    c.report("b1", 0.0, {}, now=1, depths={"t": 3})
    assert [b.id for b in c.producers("t")] == ["b1"]


def test_join_moves_nobody_and_fills_the_group_furthest_below_its_quota() -> None:
    c = cluster(2, mcap=1000)
    # 800 msg/s, rate following (1.1 x): b0 only
    c.create_topic(spec("t", n=16, rate=50.0), "srtm", now=0, rate_auto=True)
    before = where(c, "t")
    version = c.topics["t"].version
    actions = c.add_publishers("t", [PublisherLoad("n0", 50.0, "g1")])
    assert {k: v for k, v in where(c, "t").items() if k in before} == before
    assert where(c, "t")["n0"] == "b0"  # b0 still has room: no new broker
    assert c.topics["t"].version == version + 1
    assert isinstance(actions[-1], PlanChanged) and not any(isinstance(a, Migrate) for a in actions)
    assert allocated(c)["b0"] == pytest.approx(c.topics["t"].spec.rate) == pytest.approx(935)
    # b0 takes one more (990 promised of 1000), then b1 opens: the ledger never goes over
    c.add_publishers("t", [PublisherLoad(f"m{i}", 50.0, "g2") for i in range(4)])
    assert {where(c, "t")[f"m{i}"] for i in range(4)} == {"b0", "b1"}
    assert {k: v for k, v in where(c, "t").items() if k in before} == before
    assert sorted(where(c, "t")[f"m{i}"] for i in range(4)).count("b0") == 1
    assert allocated(c)["b0"] == pytest.approx(990) and not c.over()


def test_a_new_group_member_goes_where_its_group_is_thinnest() -> None:
    c = cluster(2, mcap=500)
    c.create_topic(spec("t", n=8, rate=100.0, groups=2), "srtm", now=0)  # two brokers
    counts = {b: sum(1 for p in ps if p in {"p0", "p2", "p4", "p6"})
              for b, ps in c.topics["t"].assignment.items()}  # fmt: skip
    c.remove_publisher("t", next(p for p in c.topics["t"].assignment["b0"] if p in
                                 {"p0", "p2", "p4", "p6"}))  # fmt: skip
    c.add_publishers("t", [PublisherLoad("n0", 10.0, "g0")])
    assert counts == {"b0": 2, "b1": 2}
    assert where(c, "t")["n0"] == "b0"


def test_leave_resplits_and_moves_nobody() -> None:
    c = cluster(2, mcap=500)
    c.create_topic(spec("t"), "srtm", now=0)
    before = where(c, "t")
    actions = c.remove_publisher("t", "p3")
    assert "p3" not in where(c, "t")
    assert all(where(c, "t")[p] == b for p, b in before.items() if p != "p3")
    assert {type(a) for a in actions} == {SetBucket, PlanChanged}
    assert math.fsum(b.rate for b in c.topics["t"].buckets.values()) == pytest.approx(880)
    with pytest.raises(ControlError) as err:
        c.remove_publisher("t", "p3")
    assert err.value.status == 404


def test_patch_rate_resplits_policy_places_again_and_over_mcap_is_flagged() -> None:
    c = cluster(2)
    c.create_topic(spec("t"), "srtm", now=0)
    v = c.topics["t"].version
    c.change_topic("t", slo_p99_ms=9.0)
    assert c.topics["t"].spec.slo_p99_ms == 9.0 and c.topics["t"].version == v
    c.change_topic("t", rate=1200.0)
    assert c.topics["t"].version == v + 1 and allocated(c)["b0"] == pytest.approx(1200)
    assert [e.id for e in c.over()] == ["b0"]
    assert c.note_over("t") and "warning" in c.topics["t"].events[-1]
    actions = c.change_topic("t", policy="lb", rate=880.0)
    assert c.topics["t"].policy == "lb" and set(c.topics["t"].assignment) == {"b0", "b1"}
    assert any(isinstance(a, Migrate) for a in actions) and not c.over()
    with pytest.raises(ControlError) as err:
        c.change_topic("t", rate=1e-9)
    assert err.value.status == 400 and "rate" in str(err.value)


def test_join_refusals() -> None:
    c = cluster(1)
    c.create_topic(spec("t"), "srtm", now=0)
    for pubs, status in (([PublisherLoad("p0", 1.0)], 409), ([], 400)):
        with pytest.raises(ControlError) as err:
            c.add_publishers("t", pubs)
        assert err.value.status == status
    with pytest.raises(ControlError) as err:
        c.add_publishers("nope", [PublisherLoad("x", 1.0)])
    assert err.value.status == 404


def test_an_open_topic_places_unknown_publishers_and_its_rate_follows_them() -> None:
    c = cluster(2)
    empty = TopicSpec("o", (), 20, 5.0, 0.0)
    c.create_topic(empty, "srtm", now=0, open=True, rate_auto=True)
    assert c.topics["o"].status == "placed" and not c.topics["o"].assignment
    with pytest.raises(ControlError) as err:
        c.join_open("o", "s1", None, "g")
    assert err.value.status == 400 and "rate" in str(err.value)
    c.join_open("o", "s1", 100.0, "g")
    assert c.assign("o", "s1")["broker"] == "b0"
    assert c.join_open("o", "s1", 100.0, "g") == []  # known: nothing
    assert c.topics["o"].spec.rate == pytest.approx(110)
    again = Controller()
    again.restore(c.to_json(), now=0)
    assert again.topics["o"].open and again.topics["o"].rate_auto
    c.create_topic(spec("closed"), "srtm", now=0)
    with pytest.raises(ControlError) as err:
        c.join_open("closed", "zz", 1.0, None)
    assert err.value.status == 404


# -- over HTTP ----------------------------------------------------------------------------


@pytest.fixture
async def api(controller_api: ControllerClient) -> ControllerClient:
    """The controller with brokers b0 and b1 (mcap 1000) registered."""
    for i, port in enumerate((9, 19)):  # nothing listens: pushes fail, logged
        addr = f"127.0.0.1:{port}"
        doc = {"id": f"b{i}", "tcp_address": addr, "http_address": addr, "mcap": 1000}
        assert (await controller_api.call("POST", "/brokers", doc))[0] == 200
    return controller_api


def topic_doc(name: str, **extra: Any) -> dict[str, Any]:
    pubs = [{"id": f"p{i}", "rate": 100, "group": f"g{i // 2}"} for i in range(4)]
    return {"name": name, "slo_p99_ms": 5.0, "burst": 50, "publishers": pubs} | extra


async def test_create_join_leave_patch_delete_over_http(api: ControllerClient) -> None:
    assert (await api.call("POST", "/topics", topic_doc("t")))[0] == 201
    new = {"publishers": [{"id": "n0", "rate": 100, "group": "g0"}, {"id": "n1", "rate": 50}]}
    status, body = await api.call("POST", "/topics/t/publishers", new)
    assert status == 200, body
    doc = TopicStatus.model_validate(body)
    assert doc.publishers == 6 and not doc.unassigned
    status, body = await api.call("DELETE", "/topics/t/publishers/n1")
    assert status == 200 and TopicStatus.model_validate(body).publishers == 5
    status, body = await api.call("PATCH", "/topics/t", {"rate": 2000})
    assert status == 200 and TopicStatus.model_validate(body).rate == 2000
    _, rows = await api.call("GET", "/brokers")
    over = {b.id: b.over for b in Brokers.model_validate(rows).brokers}
    assert over == {"b0": True, "b1": False}
    status, body = await api.call("DELETE", "/topics/t")
    assert status == 200 and Deleted.model_validate(body).deleted
    _, rows = await api.call("GET", "/brokers")
    assert all(b.allocated == 0 for b in Brokers.model_validate(rows).brokers)
    assert (await api.call("GET", "/lookup?topic=t"))[0] == 404


@pytest.mark.parametrize(
    ("method", "path", "doc", "status", "names"),
    [
        ("DELETE", "/topics/nope", None, 404, "nope"),
        ("PATCH", "/topics/nope", {"rate": 5}, 404, "nope"),
        ("PATCH", "/topics/t", {}, 400, "at least one"),
        ("PATCH", "/topics/t", {"rate": -1}, 400, "rate"),
        ("PATCH", "/topics/t", {"sloo": 1}, 400, "sloo"),
        ("POST", "/topics/t/publishers", {"publishers": [{"id": "p0", "rate": 1}]}, 409, "p0"),
        ("POST", "/topics/t/publishers", {"publishers": [{"id": "x", "rate": 0}]}, 400, "rate"),
        ("POST", "/topics/t/publishers", {"publishers": []}, 400, "publishers"),
        ("DELETE", "/topics/t/publishers/nope", None, 404, "nope"),
        ("GET", "/assign?topic=t&publisher=zz&rate=5", None, 404, "zz"),
        ("GET", "/assign?topic=o&publisher=zz", None, 400, "rate"),
        ("GET", "/assign?topic=o&publisher=zz&rate=inf", None, 400, "rate"),
    ],
)
async def test_refusals_are_messages_with_their_status(
    api: ControllerClient, method: str, path: str, doc: Any, status: int, names: str
) -> None:
    assert (await api.call("POST", "/topics", topic_doc("t")))[0] == 201
    open_doc = topic_doc("o", open=True, publishers=[])
    assert (await api.call("POST", "/topics", open_doc))[0] == 201
    got, body = await api.call(method, path, doc)
    assert got == status and names in Error.model_validate(body).message


async def test_a_closed_topic_still_needs_publishers(api: ControllerClient) -> None:
    status, body = await api.call("POST", "/topics", topic_doc("t", publishers=[]))
    assert status == 400 and "publishers" in body["message"]


async def test_the_openapi_document_has_the_lifecycle_routes(api: ControllerClient) -> None:
    _, doc = await api.call("GET", "/openapi.json")
    assert {"delete", "patch"} <= set(doc["paths"]["/topics/{name}"])
    assert "post" in doc["paths"]["/topics/{name}/publishers"]
    assert "delete" in doc["paths"]["/topics/{name}/publishers/{id}"]


async def test_concurrent_joins_do_not_double_book(api: ControllerClient) -> None:
    """Two joins of 800 msg/s each: each fits one broker of 1000, not both the same."""
    doc = topic_doc("t", publishers=[{"id": "p0", "rate": 10}])
    assert (await api.call("POST", "/topics", doc))[0] == 201

    def batch(k: int) -> dict[str, Any]:
        return {"publishers": [{"id": f"j{k}-{i}", "rate": 100} for i in range(8)]}

    answers = await asyncio.gather(*(api.call("POST", "/topics/t/publishers", batch(k))
                                     for k in range(2)))  # fmt: skip
    assert [s for s, _ in answers] == [200, 200]
    plan = TopicStatus.model_validate((await api.call("GET", "/topics/t"))[1])
    assert not plan.unassigned and {b.id for b in plan.brokers} == {"b0", "b1"}
    _, rows = await api.call("GET", "/brokers")
    for row in Brokers.model_validate(rows).brokers:  # the rate auto-follows: 1.1 x 1610
        assert 0 < row.allocated <= row.mcap and not row.over


# -- live: brokers, publishers and a subscriber ------------------------------------------------


@pytest.mark.slow
async def test_an_open_topic_takes_a_publisher_and_delete_loses_nothing(tmp_path: Path) -> None:
    c = start_cluster(tmp_path, 2, broker_args=["--mcap", "1000"])
    try:
        doc = {"name": "o", "slo_p99_ms": 50.0, "burst": 100, "open": True, "publishers": []}
        answer = json.loads(c.controller.post("/topics", json.dumps(doc).encode()))
        assert answer["open"] and answer["brokers"] == []
        pub = Publisher("o", "s1", controller=c.url, rate=200.0, group="g", max_pending=50)
        await pub.start()
        try:
            for _ in range(200):
                await pub.publish()
            await pub.flush()
        finally:
            await pub.close()
        plan = json.loads(c.controller.get("/plan?topic=o"))
        assert [b["publishers"] for b in plan["brokers"]] == [["s1"]]
        c.controller.request("/topics/o", "DELETE")
        # No longer managed; /topics (nsqlookupd's) lists it while a broker carries it.
        with pytest.raises(urllib.error.HTTPError) as gone:
            c.controller.get("/topics/o")
        assert gone.value.code == 404
        # The broker's report names what it holds; /lookup lists it while it does.
        got: list[int] = []

        def record(r: Received) -> None:
            assert r.header is not None
            got.append(r.header.seq)

        def lookup() -> Any:
            try:
                return json.loads(c.controller.get("/lookup?topic=o"))["producers"]
            except urllib.error.HTTPError:
                return None

        await eventually(lookup, "/lookup of the deleted topic naming its broker")
        sub = Subscriber("o", "all", controller=c.url, on_message=record, refresh_s=0.2)
        await sub.start()
        try:
            await eventually(lambda: len(got) >= 200, "every message", timeout=30)
        finally:
            await sub.close()
        assert sorted(got) == list(range(200))
    finally:
        c.stop()
