"""The controller's HTTP API against its declared documents: the OpenAPI document lists
exactly the routes the app serves, refusals name the failing field, and real answers
have the declared shapes."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from srtm.control.api import ROUTES
from srtm.control.documents import (
    Brokers,
    Error,
    FitSettings,
    Lookup,
    NewTopic,
    Nodes,
    Plan,
    PublisherAssignment,
    Registered,
    Taken,
    TopicStatus,
    parse,
)
from srtm.control.service import ControllerOptions, ControllerService
from srtm.control.validate import ControlError
from srtm.protocol import is_valid_name
from support import ControllerClient, eventually

REGISTRATION = {"id": "a", "tcp_address": "127.0.0.1:9", "http_address": "127.0.0.1:9",
                "mcap": 1e6}  # fmt: skip


def topic_doc(name: str, n: int = 4) -> dict[str, Any]:
    pubs = [{"id": f"p{i}", "rate": 10, "group": f"g{i // 2}"} for i in range(n)]
    return {"name": name, "slo_p99_ms": 5.0, "burst": 20, "publishers": pubs}


# -- the route table and the OpenAPI document ----------------------------------------------


async def test_the_openapi_document_lists_every_route_of_the_app_and_no_other(
    controller_api: ControllerClient, tmp_path: Path
) -> None:
    status, doc = await controller_api.call("GET", "/openapi.json")
    assert status == 200
    documented = {(m.upper(), path) for path, ops in doc["paths"].items() for m in ops}
    app = ControllerService(ControllerOptions(db=tmp_path / "other.db")).app()
    served = {
        (r.method, r.resource.canonical)
        for r in app.router.routes()
        if r.method != "HEAD" and r.resource is not None  # HEAD comes with every GET
    }
    assert served == documented
    assert ("POST", "/topics/{name}/move") in documented
    assert ("GET", "/openapi.json") in documented


async def test_move_and_the_fitting_status_are_documented(controller_api: ControllerClient) -> None:
    _, doc = await controller_api.call("GET", "/openapi.json")
    schemas = doc["components"]["schemas"]
    move = doc["paths"]["/topics/{name}/move"]["post"]
    assert move["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Move"
    }
    assert set(schemas["Move"]["required"]) == {"publishers", "to"}
    assert move["security"] == [{"token": []}] and "401" in move["responses"]
    topic = doc["paths"]["/topics/{name}"]["get"]["responses"]["200"]
    ref = topic["content"]["application/json"]["schema"]["$ref"]
    fitting = schemas[ref.rsplit("/", 1)[1]]["properties"]["fitting"]
    assert {"$ref": "#/components/schemas/FittingStatus"} in fitting["anyOf"]
    assert "steps" in schemas["FittingStatus"]["properties"]
    # Reads need no token; every other route does.
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert ("security" in op) == (method != "get"), (method, path)


def test_the_documented_topic_name_pattern_is_the_brokers_rule() -> None:
    from srtm.control.api import _openapi

    schema = _openapi()["components"]["schemas"]["NewTopic"]["properties"]["name"]
    pattern = re.compile(schema["pattern"])
    for name in ["t", "a.b-c_d", "x#ephemeral", "has space", "a/b", "", "x" * 64, "x" * 65]:
        documented = pattern.match(name) is not None and len(name) <= schema["maxLength"]
        assert documented == is_valid_name(name), name


# -- refusals name the field ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "doc", "where"),
    [
        ("/topics", topic_doc("t") | {"publishers": [{"id": "p", "rate": 1}] * 0}, "publishers"),
        ("/topics", {**topic_doc("t"), "publishers": [{"id": "p0", "rate": 1},
         {"id": "p1", "rate": 1}, {"id": "p2", "rate": "fast"}]}, "publishers[2].rate: "),
        ("/topics", {**topic_doc("t"), "publishers": [{"id": "p0"}]}, "publishers[0].rate: "),
        ("/topics", {**topic_doc("t"), "fit": {"window_s": -1}}, "fit.window_s: "),
        ("/topics", {**topic_doc("t"), "fit": {"windows": 1}}, "fit.windows: "),
        ("/topics", {**topic_doc("t"), "fit": "yes"}, "fit: "),
        ("/topics", {**topic_doc("t"), "burst": 0.5}, "burst: "),
        ("/topics", {**topic_doc("t"), "slo_p99_ms": True}, "slo_p99_ms: "),
        ("/topics", {**topic_doc("t"), "policy": "random"}, "policy: "),
        ("/topics", {**topic_doc("t"), "name": "a/b"}, "name: "),
        ("/brokers", {**REGISTRATION, "mcap": "fast"}, "mcap: "),
        ("/brokers", {**REGISTRATION, "mcap": 0}, "mcap: "),
        ("/brokers", {**REGISTRATION, "http_address": "127.0.0.1"}, "http_address: "),
        ("/brokers", {k: v for k, v in REGISTRATION.items() if k != "id"}, "id: "),
        ("/brokers/a/report", {"topics": {"t": {"depth": 1.5}}}, "topics.t.depth: "),
        ("/brokers/a/report", {"topics": {"t": {"rate": -1}}}, "topics.t.rate: "),
        ("/brokers/a/report", {"load": "high"}, "load: "),
        ("/topics/t/move", {"publishers": "p0", "to": "a"}, "publishers: "),
        ("/topics/t/move", {"publishers": ["p0", 3], "to": "a"}, "publishers[1]: "),
        ("/topics/t/move", {"publishers": ["p0"]}, "to: "),
    ],
)  # fmt: skip
async def test_a_bad_document_is_refused_naming_the_field(
    controller_api: ControllerClient, path: str, doc: dict[str, Any], where: str
) -> None:
    assert (await controller_api.call("POST", "/brokers", REGISTRATION))[0] == 200
    status, body = await controller_api.call("POST", path, doc)
    assert status == 400 and body["message"].startswith(where), body
    Error.model_validate(body)


#: Every controller endpoint that takes a JSON body (topic t exists where one is needed).
JSON_BODIES = [
    ("POST", "/brokers"),
    ("POST", "/brokers/a/report"),
    ("POST", "/topics"),
    ("PATCH", "/topics/t"),
    ("POST", "/topics/t/publishers"),
    ("POST", "/topics/t/move"),
    ("POST", "/topics/t/replicas"),
]


async def raw_call(
    client: ControllerClient, method: str, path: str, body: bytes
) -> tuple[int, Any]:
    async with client.http.request(method, client.base + path, data=body) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize(("method", "path"), JSON_BODIES)
async def test_a_body_that_is_not_json_is_refused_naming_line_and_column(
    controller_api: ControllerClient, method: str, path: str
) -> None:
    assert (await controller_api.call("POST", "/brokers", REGISTRATION))[0] == 200
    assert (await controller_api.call("POST", "/topics", topic_doc("t")))[0] == 201

    async def unchanged() -> tuple[int, list[str], int]:
        _, topic = await controller_api.call("GET", "/topics/t")
        return topic["version"], topic["events"], topic["publishers"]

    before = await unchanged()
    # A topic document with one value left out, as a user might send it with curl -d.
    text = b'{"name": "u", "slo_p99_ms": 5, "burst": 20,\n "publishers": [{"id": "p", "rate": }]}'
    for body, says in [
        (text, "body is not JSON: expecting value at line 2 column 37"),
        (b'{"count": 2,}', "body is not JSON: expecting property name enclosed in double "
         "quotes at line 1 column 13"),
        (b'{"count": 2} {"count": 3}', "body is not JSON: extra data at line 1 column 14"),
        (b"", "body is empty, not JSON"),
        (b"\xff", "body is not JSON: not UTF-8 text at byte 0"),
        (b"[" * 5_000, "body is nested too deeply to be read as JSON"),
        (b"[1]", "body must be a JSON object, got an array"),
        (b'"text"', "body must be a JSON object, got a string"),
        (b"NaN", "body must be a JSON object, got a number"),
    ]:  # fmt: skip
        status, doc = await raw_call(controller_api, method, path, body)
        assert (status, doc) == (400, {"message": says}), body
    assert await unchanged() == before
    assert [b["id"] for b in (await controller_api.call("GET", "/brokers"))[1]["brokers"]] == ["a"]


@pytest.mark.parametrize(
    ("path", "doc", "where"),
    [
        ("/topics", {**topic_doc("t"), "slo_p99_ms": float("nan")}, "slo_p99_ms: "),
        ("/topics", {**topic_doc("t"), "burst": float("inf")}, "burst: "),
        ("/topics", {**topic_doc("t"), "rate": float("-inf")}, "rate: "),
        ("/topics", {**topic_doc("t"), "publishers": [{"id": "p", "rate": float("nan")}]},
         "publishers[0].rate: "),
        ("/brokers/a/report", {"load": float("nan")}, "load: "),
        ("/brokers", {**REGISTRATION, "mcap": float("inf")}, "mcap: "),
        ("/topics/t/replicas", {"count": float("nan")}, "count: "),
    ],
)  # fmt: skip
async def test_non_finite_numbers_are_refused_naming_the_field(
    controller_api: ControllerClient, path: str, doc: dict[str, Any], where: str
) -> None:
    assert (await controller_api.call("POST", "/brokers", REGISTRATION))[0] == 200
    body = json.dumps(doc).encode()  # NaN and Infinity, as Python writes them
    status, answer = await raw_call(controller_api, "POST", path, body)
    assert status == 400 and answer["message"].startswith(where), answer


def one_topic(publishers: list[tuple[str, float]], **extra: Any) -> dict[str, Any]:
    pubs = [{"id": p, "rate": r} for p, r in publishers]
    return {"name": "t", "slo_p99_ms": 5.0, "burst": 20, "publishers": pubs, **extra}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (one_topic([("p1", 1e9)]),
         "topic: publisher 'p1' rate 1e+09 msg/s gives the topic a rate of 1.1e+09 msg/s "
         "(1.1 × the sum of its publishers), over the limit of 1e+09 msg/s"),
        (one_topic([("p0", 4e8), ("p1", 6e8)]),
         "topic: the rates of its 2 publishers (the largest 'p1' 6e+08 msg/s) sum to 1e+09 "
         "msg/s, which gives the topic a rate of 1.1e+09 msg/s (1.1 × the sum of its "
         "publishers), over the limit of 1e+09 msg/s"),
        (one_topic([("p1", 1e-4)]),
         "topic: publisher 'p1' rate 0.0001 msg/s gives the topic a rate of 0.00011 msg/s "
         "(1.1 × the sum of its publishers), under the least of 0.001 msg/s"),
        (one_topic([("p1", 0.001)], burst=1e9),
         "topic: publisher 'p1' rate 0.001 msg/s gives the topic a rate of 0.0011 msg/s "
         "(1.1 × the sum of its publishers); burst 1e+09 at rate 0.0011 is 9.09e+11 s of "
         "tokens; at most 1e+09 s (burst/rate) is allowed"),
        (one_topic([("p1", 10)], rate=1e10),
         "topic: rate must be between 0.001 and 1e+09 per second, got 10000000000.0"),
        (one_topic([("p1", 10)], burst=1e30),
         'burst: must be a number from 1 (a bucket holds one token) to 1e+09, or "profile", '
         "got 1e+30"),
    ],
)  # fmt: skip
async def test_a_refused_bucket_quotes_what_was_sent_and_what_came_of_it(
    controller_api: ControllerClient, doc: dict[str, Any], message: str
) -> None:
    assert (await controller_api.call("POST", "/brokers", REGISTRATION))[0] == 200
    assert await controller_api.call("POST", "/topics", doc) == (400, {"message": message})


async def test_joining_publishers_are_refused_when_the_rate_they_give_the_topic_is(
    controller_api: ControllerClient,
) -> None:
    """A rate that follows the publishers is checked as they join (by POST and by
    /assign), quoting their rates; before, it became the topic's and every broker's."""
    big = {**REGISTRATION, "mcap": 1e12}
    assert (await controller_api.call("POST", "/brokers", big))[0] == 200
    doc = {"name": "o", "slo_p99_ms": 5.0, "burst": 20, "open": True}
    assert (await controller_api.call("POST", "/topics", doc))[0] == 201
    joining = {"publishers": [{"id": "x", "rate": 5e8}, {"id": "y", "rate": 5e8}]}
    assert await controller_api.call("POST", "/topics/o/publishers", joining) == (
        400,
        {"message": "publishers: the rates of its 2 publishers (the largest 'x' 5e+08 msg/s) "
         "sum to 1e+09 msg/s, which gives the topic a rate of 1.1e+09 msg/s (1.1 × the sum "
         "of its publishers), over the limit of 1e+09 msg/s"},
    )  # fmt: skip
    assert await controller_api.call("GET", "/assign?topic=o&publisher=z&rate=1e9") == (
        400,
        {"message": "rate: publisher 'z' rate 1e+09 msg/s gives the topic a rate of 1.1e+09 "
         "msg/s (1.1 × the sum of its publishers), over the limit of 1e+09 msg/s"},
    )  # fmt: skip
    _, topic = await controller_api.call("GET", "/topics/o")
    assert (topic["publishers"], topic["rate"], topic["version"]) == (0, 0.0, 1)
    assert (await controller_api.call("GET", "/assign?topic=o&publisher=z&rate=0.001"))[0] == 200
    status, body = await controller_api.call("PATCH", "/topics/o", {"burst": 1e9})
    assert (status, body) == (
        400,
        {"message": "topic: publisher 'z' rate 0.001 msg/s gives the topic a rate of 0.0011 "
         "msg/s (1.1 × the sum of its publishers); burst 1e+09 at rate 0.0011 is 9.09e+11 s "
         "of tokens; at most 1e+09 s (burst/rate) is allowed"},
    )  # fmt: skip


async def test_the_first_failing_field_is_named_and_the_rest_counted(
    controller_api: ControllerClient,
) -> None:
    bad = [{"id": f"p{i}", "rate": -1} for i in range(3)]
    status, body = await controller_api.call(
        "POST", "/topics", {**topic_doc("t"), "publishers": bad}
    )
    assert status == 400 and body["message"].startswith("publishers[0].rate: ")
    assert body["message"].endswith("(and 2 more)")


def test_fit_settings_take_a_model_and_refuse_a_bad_one(tmp_path: Path) -> None:
    assert FitSettings.model_validate({"model": "paper"}) == FitSettings(model="paper")
    missing = topic_doc("t") | {"fit": {"model": str(tmp_path / "missing.json")}}
    with pytest.raises(ControlError, match=r"^fit\.model: .*--models-dir"):
        parse(NewTopic, missing)
    (tmp_path / "m.json").write_text("{}")
    chosen = parse(FitSettings, {"model": "m.json"}, models_dir=tmp_path).model
    assert chosen == str((tmp_path / "m.json").resolve())
    with pytest.raises(ControlError, match="not a file under"):
        parse(FitSettings, {"model": "../m.json"}, models_dir=tmp_path / "sub")


# -- answers have the declared shapes ------------------------------------------------------


async def test_answers_have_their_documented_shapes(controller_api: ControllerClient) -> None:
    status, body = await controller_api.call("POST", "/brokers", REGISTRATION)
    assert status == 200 and Registered.model_validate(body).registered
    status, body = await controller_api.call("POST", "/brokers/a/report", {"load": 1, "topics": {}})
    assert status == 200 and Taken.model_validate(body).ok
    status, body = await controller_api.call("POST", "/topics", topic_doc("t"))
    assert status == 201 and TopicStatus.model_validate(body).publishers == 4
    status, body = await controller_api.call("POST", "/topics", topic_doc("f") | {"fit": True})
    fitting = TopicStatus.model_validate(body).fitting
    assert status == 201 and fitting is not None and fitting.state == "running"
    status, body = await controller_api.call(
        "POST", "/topics/t/move", {"publishers": ["p0"], "to": "a"}
    )
    assert status == 200 and Plan.model_validate(body).topic == "t"
    queries = {"/plan": "?topic=t", "/assign": "?topic=t&publisher=p0", "/lookup": "?topic=t",
               "/channels": "?topic=t", "/topics/{name}": ""}  # fmt: skip
    for route in ROUTES:
        if route.method != "GET" or route.answer is None:
            continue
        path = route.path.replace("{name}", "t") + queries.get(route.path, "")
        status, body = await controller_api.call("GET", path)
        assert status == route.status, (path, body)
        route.answer.model_validate(body)
    _, body = await controller_api.call("GET", "/assign?topic=t&publisher=p0")
    assert PublisherAssignment.model_validate(body).broker == "a"
    (producer,) = Nodes.model_validate((await controller_api.call("GET", "/nodes"))[1]).producers
    assert producer.tcp_port == 9
    (broker,) = Brokers.model_validate((await controller_api.call("GET", "/brokers"))[1]).brokers
    assert (broker.id, broker.measured, broker.down) == ("a", 1.0, False)
    assert Lookup.model_validate((await controller_api.call("GET", "/lookup?topic=t"))[1]).producers


async def test_refusals_outside_validation_keep_their_status_and_shape(
    controller_api: ControllerClient,
) -> None:
    for method, path, doc, status in [
        ("GET", "/lookup?topic=none", None, 404),
        ("GET", "/plan", None, 400),
        ("GET", "/topics/none", None, 404),
        ("POST", "/topics", topic_doc("t"), 503),  # no broker yet
        ("POST", "/brokers/x/report", {}, 404),
    ]:
        got, body = await controller_api.call(method, path, doc)
        assert got == status, (path, body)
        Error.model_validate(body)
    assert (await controller_api.call("GET", "/lookup?topic=none"))[1] == {
        "message": "TOPIC_NOT_FOUND"
    }


async def test_a_plan_is_in_place_only_once_its_shares_are_pushed(
    controller_api: ControllerClient,
) -> None:
    """``in_place`` is false while the controller still pushes a version's share changes
    (a client moving by the plan waits for it): a move's decrease held up at the broker
    keeps the moved plan out of place until the broker takes it."""
    from aiohttp import web

    holds_pass = asyncio.Event()
    holds_pass.set()

    async def any_order(request: web.Request) -> web.Response:
        if request.path == "/srtm/bucket/hold":
            await holds_pass.wait()
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", any_order)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    fake = f"127.0.0.1:{runner.addresses[0][1]}"
    try:
        for broker in ("a", "b"):
            doc = REGISTRATION | {"id": broker, "http_address": fake}
            assert (await controller_api.call("POST", "/brokers", doc))[0] == 200
        assert (await controller_api.call("POST", "/topics", topic_doc("t")))[0] == 201

        async def plan() -> dict[str, Any]:
            return (await controller_api.call("GET", "/plan?topic=t"))[1]

        placed = await eventually(plan, "the first plan in place", until=lambda p: p["in_place"])
        (home,) = [b["id"] for b in placed["brokers"]]
        holds_pass.clear()
        status, moved = await controller_api.call(
            "POST", "/topics/t/move",
            {"publishers": ["p0", "p1", "p2", "p3"], "to": "b" if home == "a" else "a"},
        )  # fmt: skip
        assert status == 200 and moved["version"] > placed["version"]
        assert moved["in_place"] is False
        now = await plan()
        assert (now["version"], now["in_place"]) == (moved["version"], False)
        holds_pass.set()
        await eventually(plan, "the move in place", until=lambda p: p["in_place"])
    finally:
        holds_pass.set()
        await runner.cleanup()


async def test_a_registration_mid_change_holds_the_topic_its_share_comes_by_push(
    tmp_path: Path,
) -> None:
    """A registration answer's share would not wait for the other brokers' decreases:
    a topic whose change is on its way is held in it (its share comes by the push)."""
    import aiohttp

    from etcd_member import free_ports

    service = ControllerService(ControllerOptions(db=tmp_path / "c.db", http_port=0, tick_s=60))
    await service.start()
    assert service.http_address is not None
    ports = free_ports(4)  # nothing listens: every push fails, a decrease is retried
    try:
        async with aiohttp.ClientSession() as http:
            c = ControllerClient(http, "http://{}:{}".format(*service.http_address))

            async def register(bid: str, i: int) -> dict[str, Any]:
                doc = {"id": bid, "tcp_address": f"127.0.0.1:{ports[2 * i]}",
                       "http_address": f"127.0.0.1:{ports[2 * i + 1]}", "mcap": 600}  # fmt: skip
                status, answer = await c.call("POST", "/brokers", doc)
                assert status == 200, answer
                return answer

            await register("a", 0)
            await register("b", 1)
            pubs = [{"id": f"p{i}", "rate": 100} for i in range(4)]
            status, _ = await c.call("POST", "/topics", {"name": "t", "slo_p99_ms": 5,
                                     "burst": 40, "policy": "lb", "publishers": pubs})  # fmt: skip
            assert status == 201
            plan = service.ctrl.topics["t"].assignment
            assert plan.get("a") and plan.get("b")
            # The first shares are increases: pushed once, failed, done.
            await eventually(lambda: service.in_place("t"), "the first shares pushed")
            answer = await register("b", 1)
            assert set(answer["buckets"]) == {"t"} and answer["held"] == []
            status, _ = await c.call("POST", "/topics/t/move", {"publishers": plan["a"], "to": "b"})
            assert status == 200
            assert not service.in_place("t")  # a's decrease is retried: a is up
            answer = await register("b", 1)
            assert answer["buckets"] == {} and answer["held"] == ["t"]
    finally:
        await service.stop()


async def test_registration_answers_are_numbered_among_the_orders_to_brokers(
    controller_api: ControllerClient,
) -> None:
    """Each answer's ``order`` comes after every earlier one (and after every push the
    controller sent before it): a broker refuses pushes older than its answer."""
    _, first = await controller_api.call("POST", "/brokers", REGISTRATION)
    _, second = await controller_api.call("POST", "/brokers", REGISTRATION)
    assert first["order"][0] == 0 and second["order"][0] == 0  # no epoch on SQLite
    assert second["order"][1] > first["order"][1] > 0


def test_the_pushers_numbers_go_up_and_carry_the_leaders_epoch() -> None:
    from types import SimpleNamespace

    from srtm.control.push import Pusher

    pusher = Pusher(SimpleNamespace(), None, 0.1)  # type: ignore[arg-type]
    a = pusher.next_order()
    headers = pusher._headers()
    pusher.epoch = 7
    b = pusher.next_order()
    assert a[0] == 0 and "X-SRTM-Epoch" not in headers
    assert a[1] < int(headers["X-SRTM-Order"]) < b[1] and b[0] == 7
