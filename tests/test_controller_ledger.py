"""The controller places with its capacity ledger: what it has promised counts, not only
what brokers measured; placements are serialised; GET /brokers shows the ledger."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from srtm.control import Controller
from srtm.control.documents import Brokers, TopicStatus
from srtm.placement import PublisherLoad, TopicSpec, place
from support import ControllerClient
from support import registered as cluster


def topic_800(name: str) -> TopicSpec:
    """800 msg/s from 8 publishers; rate 880 (the 10 % margin)."""
    pubs = tuple(PublisherLoad(f"p{i}", 100.0, f"g{i // 2}") for i in range(8))
    return TopicSpec(name, pubs, 50, 5.0, 880.0)


def brokers_of(c: Controller, topic: str) -> set[str]:
    return {b for b, ps in c.topics[topic].assignment.items() if ps}


def assert_ledger_is_the_plans(c: Controller) -> None:
    """allocated is, per broker, the sum of the current sub-buckets; rcap follows."""
    for e in c.ledger():
        want = math.fsum(t.buckets[e.id].rate for t in c.topics.values() if e.id in t.buckets)
        assert e.allocated == pytest.approx(want)
        assert e.rcap == pytest.approx(max(0.0, e.mcap - max(want, e.measured)))


# -- the controller's decisions, no I/O -------------------------------------------------------


def test_two_topics_of_800_on_two_brokers_of_1000_land_on_different_brokers() -> None:
    c = cluster(2)
    c.create_topic(topic_800("t0"), "srtm", now=0)
    c.create_topic(topic_800("t1"), "srtm", now=0)
    assert brokers_of(c, "t0") == {"b0"}
    assert brokers_of(c, "t1") == {"b1"}  # on main: b0 again (rcap read from traffic only)
    rows = {e.id: e for e in c.ledger()}
    assert rows["b0"].allocated == pytest.approx(880) and rows["b0"].rcap == pytest.approx(120)
    assert rows["b1"].allocated == pytest.approx(880) and rows["b1"].measured == 0.0
    assert_ledger_is_the_plans(c)


def test_measured_load_above_the_promise_counts() -> None:
    c = cluster(2)
    c.report("b0", 950.0, {}, now=0)  # traffic nobody placed here (unmanaged topics)
    c.create_topic(topic_800("t0"), "srtm", now=0)
    assert brokers_of(c, "t0") == {"b1"}
    assert {e.id: e.rcap for e in c.ledger()}["b0"] == pytest.approx(50)


def test_the_ledger_follows_moves_and_failover_by_construction() -> None:
    c = cluster(3)
    c.create_topic(topic_800("t0"), "srtm", now=0)
    c.create_topic(topic_800("t1"), "srtm", now=0)
    assert (brokers_of(c, "t0"), brokers_of(c, "t1")) == ({"b0"}, {"b1"})
    c.move("t0", ["p0", "p1"], "b2")
    assert_ledger_is_the_plans(c)
    assert {e.id: e.allocated for e in c.ledger()}["b2"] == pytest.approx(220)
    c.move("t0", ["p0", "p1"], "b0")
    # b0 goes silent: t0's publishers go where capacity is free (b2), not onto b1,
    # which t1's plan fills although b1 has measured nothing.
    for b in ("b1", "b2"):
        c.report(b, 0.0, {}, now=5.5)
    c.tick(now=5.5)
    assert c.brokers["b0"].down
    assert brokers_of(c, "t0") == {"b2"}
    assert_ledger_is_the_plans(c)
    assert {e.id: e.allocated for e in c.ledger()}["b0"] == 0.0


def test_a_placement_made_off_the_loop_is_redone_when_the_ledger_filled_meanwhile() -> None:
    """The tick (failover, unassigned publishers) may commit plans while a big topic is
    placed on a thread: the commit sees its broker is now promised and places again."""
    c = cluster(2)
    spec = topic_800("late")
    read = c.check_new_topic(spec)
    computed = place("srtm", read, spec, 0)
    assert computed.brokers == ("b0",)
    c.create_topic(topic_800("t0"), "srtm", now=0)  # commits on b0 first
    c.create_topic(spec, "srtm", now=0, placement=computed, placed_on=read)
    assert brokers_of(c, "late") == {"b1"}
    # Still room where it was computed: used as is (no second placement).
    c2 = cluster(2)
    read = c2.check_new_topic(spec)
    small = place("srtm", read, spec, 0)
    c2.report("b0", 100.0, {}, now=0)  # measured grew, but 900 left covers 800
    c2.create_topic(spec, "srtm", now=0, placement=small, placed_on=read)
    assert brokers_of(c2, "late") == {"b0"}


def test_a_restarted_controller_has_the_same_ledger() -> None:
    """Nothing to persist beside the plans: the ledger is rebuilt from them."""
    c = cluster(2)
    c.create_topic(topic_800("t0"), "srtm", now=0)
    again = Controller()
    again.restore(c.to_json(), now=0)
    assert again.ledger() == c.ledger()
    again.create_topic(topic_800("t1"), "srtm", now=0)
    assert brokers_of(again, "t1") == {"b1"}


def test_an_empty_cluster_places_as_before() -> None:
    """Nothing promised: the fleet is the brokers' measured load, as it always was."""
    c = cluster(3)
    c.report("b1", 10.0, {}, now=0)
    assert [(b.id, b.mcap, b.load) for b in c.fleet()] == [
        ("b0", 1000, 0.0), ("b1", 1000, 10.0), ("b2", 1000, 0.0)
    ]  # fmt: skip


# -- over HTTP ----------------------------------------------------------------------------


@pytest.fixture
async def api(controller_api: ControllerClient) -> ControllerClient:
    """The controller with brokers b0 and b1 (mcap 1000) registered."""
    for i, port in enumerate((9, 19)):  # nothing listens: pushes fail, logged
        addr = f"127.0.0.1:{port}"
        doc = {"id": f"b{i}", "tcp_address": addr, "http_address": addr, "mcap": 1000}
        assert (await controller_api.call("POST", "/brokers", doc))[0] == 200
    return controller_api


def topic_doc(name: str) -> dict[str, Any]:
    pubs = [{"id": f"p{i}", "rate": 100, "group": f"g{i // 2}"} for i in range(8)]
    return {"name": name, "slo_p99_ms": 5.0, "burst": 50, "publishers": pubs}


def placed_on(body: Any) -> set[str]:
    return {b.id for b in TopicStatus.model_validate(body).brokers}


async def test_two_topics_created_one_after_the_other_land_on_two_brokers(
    api: ControllerClient,
) -> None:
    status, first = await api.call("POST", "/topics", topic_doc("t0"))
    assert status == 201
    status, second = await api.call("POST", "/topics", topic_doc("t1"))
    assert status == 201
    assert placed_on(first) == {"b0"} and placed_on(second) == {"b1"}
    status, body = await api.call("GET", "/brokers")
    assert status == 200
    rows = {b.id: b for b in Brokers.model_validate(body).brokers}
    for b in ("b0", "b1"):
        assert rows[b].mcap == 1000 and rows[b].allocated == pytest.approx(880)
        assert rows[b].measured == 0.0 and rows[b].rcap == pytest.approx(120)
        assert not rows[b].down


async def test_concurrent_creations_do_not_double_book_a_broker(
    api: ControllerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Placement runs on a thread; made slow here, both requests are in flight together.
    Without the lock both read the same empty ledger and pick b0."""
    import srtm.control.topics_api as control_api

    real_place = control_api.place

    def slow_place(*args: Any) -> Any:
        import time

        time.sleep(0.3)
        return real_place(*args)

    monkeypatch.setattr(control_api, "place", slow_place)
    answers = await asyncio.gather(
        api.call("POST", "/topics", topic_doc("t0")), api.call("POST", "/topics", topic_doc("t1"))
    )
    assert [s for s, _ in answers] == [201, 201]
    assert placed_on(answers[0][1]) | placed_on(answers[1][1]) == {"b0", "b1"}
    _, body = await api.call("GET", "/brokers")
    for b in Brokers.model_validate(body).brokers:
        assert b.allocated == pytest.approx(880) and b.allocated <= b.mcap
