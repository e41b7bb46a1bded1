"""The broker's HTTP route table, its documents and the OpenAPI document generated from
both: the app, the table and the served document list the same routes; refusals name the
field; /pub's hand parsing answers as its model does; /stats has nsqd's fields in order."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from srtm.broker import Broker, BrokerOptions
from srtm.broker.documents import (
    ChannelDoc,
    ClientDoc,
    MpubQuery,
    PubQuery,
    StatsDoc,
    TopicDoc,
)
from srtm.broker.http import ROUTES, BrokerHttp, api_document, make_app
from srtm.broker.http_requests import defer_param, parse_query, topic_param
from srtm.httpkit import HttpError
from support import BrokerApi, call


# -- the table, the app and the document ---------------------------------------------------
def app_routes(broker: Broker) -> set[tuple[str, str]]:
    """What the built app's router answers (HEAD rides along with GET)."""
    router = make_app(broker).router
    routes = {(r.method, r.resource.canonical) for r in router.routes() if r.resource}
    gets = {path for method, path in routes if method == "GET"}
    assert {path for method, path in routes if method == "HEAD"} == gets
    return {(m, p) for m, p in routes if m != "HEAD"}


async def test_the_app_the_table_and_the_document_have_the_same_routes(
    broker_api: BrokerApi,
) -> None:
    broker, s = broker_api
    table = [(r.method, r.path) for r in ROUTES]
    assert len(set(table)) == len(table), "a route is in the table twice"
    status, doc = await call(s, "GET", "/srtm/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.1")
    documented = {(m.upper(), path) for path, ops in doc["paths"].items() for m in ops}
    assert app_routes(broker) == set(table) == documented
    assert doc == json.loads(json.dumps(api_document().model_dump()))
    # Each operation is named for its handler, a method of BrokerHttp.
    for r in ROUTES:
        name = doc["paths"][r.path][r.method.lower()]["operationId"]
        assert name == r.handler.__name__ and getattr(BrokerHttp, name) is r.handler
    assert len({r.handler for r in ROUTES}) == len(ROUTES)


def walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)


def test_the_document_describes_each_query_and_resolves_every_reference() -> None:
    doc = api_document().model_dump()
    schemas = doc["components"]["schemas"]
    refs = [n["$ref"] for n in walk(doc) if "$ref" in n]
    assert refs and all(r.removeprefix("#/components/schemas/") in schemas for r in refs)
    for node in walk(doc):  # JSON Schema's words for bounds, not pydantic's
        assert "type" not in node or not {"ge", "le", "gt", "lt"} & set(node), node
    for r in ROUTES:
        op = doc["paths"][r.path][r.method.lower()]
        names = [p["name"] for p in op.get("parameters", [])]
        in_path = re.findall(r"\{(\w+)\}", r.path)  # /config/{opt}
        assert names == in_path + (list(r.query.model_fields) if r.query else []), r.path
        required = {p["name"] for p in op.get("parameters", []) if p["required"]}
        wanted = set(in_path) | (
            {n for n, f in r.query.model_fields.items() if f.is_required()} if r.query else set()
        )
        assert required == wanted, r.path
        if r.method != "GET" and r.path.startswith("/srtm/"):
            assert op["security"] == [{"token": []}] and "401" in op["responses"]
        for model in (r.answer, r.body):
            if isinstance(model, type) and issubclass(model, BaseModel):
                assert model.__name__ in schemas


# -- refusals name the field ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body", "code", "field"),
    [
        ("/topic/create?topic=", b"", "MISSING_ARG_TOPIC", "topic"),
        ("/topic/create", b"", "MISSING_ARG_TOPIC", "topic"),
        ("/channel/create?topic=t&channel=bad*", b"", "INVALID_CHANNEL", "channel"),
        ("/srtm/bucket?topic=t&rate=fast&burst=5", b"", "INVALID_RATE", "rate"),
        ("/srtm/bucket?topic=t&rate=5", b"", "MISSING_ARG_BURST", "burst"),
        ("/srtm/bucket?topic=t&rate=5&burst=inf", b"", "INVALID_BURST", "burst"),
        ("/srtm/migrate?topic=t&to=h:1", b"", "MISSING_ARG_PUBLISHER", "publisher"),
        ("/srtm/migrate?topic=t&publisher=&to=h:1", b"", "MISSING_ARG_PUBLISHER", "publisher"),
        ("/srtm/migrate?topic=t&publisher=p", b"", "INVALID_TO", "to"),
        ("/srtm/migrate?topic=t&publisher=p&to=h", b"", "INVALID_TO", "to"),
        ("/srtm/migrate?topic=t&publisher=p&to=h:1&version=-1", b"", "INVALID_VERSION", "version"),
        ("/srtm/measure?topic=t&window_ms=0", b"", "INVALID_WINDOW_MS", "window_ms"),
        ("/srtm/measure?topic=t&window_ms=5", b'{"publishers": ["a", 1]}',
         "INVALID_PUBLISHERS", "publishers[1]"),
        ("/srtm/measure?topic=t&window_ms=5", b'{"publishers": "a"}',
         "INVALID_PUBLISHERS", "publishers"),
        ("/pub?topic=bad*", b"x", "INVALID_TOPIC", "topic"),
        ("/pub?topic=t&defer=x", b"x", "INVALID_DEFER", "defer"),
        ("/mpub", b"x", "MISSING_ARG_TOPIC", "topic"),
    ],
)  # fmt: skip
async def test_refusals_name_the_field(
    broker_api: BrokerApi, path: str, body: bytes, code: str, field: str
) -> None:
    broker, s = broker_api
    status, doc = await call(s, "POST", path, body)
    assert (status, doc["message"]) == (400, code), doc
    assert doc["detail"].startswith(f"{field}: "), doc
    assert not broker.measurements and all(t.message_count == 0 for t in broker.topics.values())


#: Every broker endpoint that takes a JSON body, with a query it accepts.
JSON_BODIES = [
    ("POST", "/srtm/route"),
    ("POST", "/srtm/admission?topic=t"),
    ("POST", "/srtm/measure?topic=t&window_ms=5"),
    ("POST", "/srtm/bucket?topic=t&rate=5&burst=5"),
    ("POST", "/srtm/bucket/hold?topic=t"),
    ("PUT", "/config/nsqlookupd_tcp_addresses"),
]


@pytest.mark.parametrize(("method", "path"), JSON_BODIES)
@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"topic": "t",\n "self": }', "is not JSON: expecting value at line 2 column 10"),
        (b'{"classes": {"a": 1,}}', "is not JSON: expecting property name enclosed in double "
         "quotes at line 1 column 21"),
        (b'{"topic": "t"} {}', "is not JSON: extra data at line 1 column 16"),
        (b'{"topic": "\xff"}', "is not JSON: not UTF-8 text at byte 11"),
        (b"[" * 5_000, "is nested too deeply to be read as JSON"),
    ],
)  # fmt: skip
async def test_a_body_that_is_not_json_is_refused_naming_line_and_column(
    broker_api: BrokerApi, method: str, path: str, body: bytes, says: str
) -> None:
    broker, s = broker_api
    status, doc = await call(s, method, path, body)
    assert status == 400, doc
    assert doc["message"] in ("INVALID_BODY", "INVALID_VALUE"), doc
    assert doc["detail"] == f"body {says}", doc
    assert "t" not in broker.topics and not broker.admission and broker.relay.get_route("t") is None


@pytest.mark.parametrize(("method", "path"), JSON_BODIES[:-1])
@pytest.mark.parametrize(
    ("body", "kind"),
    [(b"[1]", "an array"), (b"null", "null"), (b'"t"', "a string"), (b"NaN", "a number")],
)
async def test_json_that_is_not_an_object_is_refused_saying_what_it_is(
    broker_api: BrokerApi, method: str, path: str, body: bytes, kind: str
) -> None:
    _, s = broker_api
    status, doc = await call(s, method, path, body)
    assert (status, doc["message"]) == (400, "INVALID_BODY"), doc
    assert doc["detail"] == f"body must be a JSON object, got {kind}", doc


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        ("/srtm/route", b'{"topic": "t", "self": "a", "forward": {"grace_s": NaN}}',
         "INVALID_FORWARD"),
        ("/srtm/route", b'{"topic": "t", "self": "a", "forward": {"grace_s": 1e999}}',
         "INVALID_FORWARD"),
        ("/srtm/route", b'{"topic": 5, "self": "a"}', "INVALID_TOPIC"),
        ("/srtm/admission?topic=t", b'{"classes": {"a": NaN}}', "INVALID_CLASSES"),
        ("/srtm/admission?topic=t", b'{"classes": {"a": -Infinity}}', "INVALID_CLASSES"),
        ("/srtm/admission?topic=t", b'{"classes": []}', "INVALID_CLASSES"),
        ("/srtm/measure?topic=t&window_ms=5", b'{"publishers": [NaN]}', "INVALID_PUBLISHERS"),
    ],
)  # fmt: skip
async def test_non_finite_numbers_and_wrong_types_are_refused_not_a_500(
    broker_api: BrokerApi, path: str, body: bytes, code: str
) -> None:
    _, s = broker_api
    status, doc = await call(s, "POST", path, body)
    assert (status, doc["message"]) == (400, code), doc


async def test_methods_a_path_does_not_take_are_405_as_in_nsqd(broker_api: BrokerApi) -> None:
    _, s = broker_api
    async with s.get("/pub?topic=t") as resp:
        assert resp.status == 405 and resp.headers["Allow"] == "POST"
        assert await resp.json() == {"message": "METHOD_NOT_ALLOWED"}
    async with s.delete("/srtm/migrate") as resp:
        assert resp.status == 405
    assert await call(s, "GET", "/nothing/here") == (404, {"message": "NOT_FOUND"})
    async with s.head("/ping") as resp:
        assert resp.status == 200


# -- /pub and /mpub: parsed by hand, as their models would ---------------------------------
def by_hand(query: dict[str, str], most: int) -> tuple[str, str] | None:
    """What /pub's handler refuses in ``query`` (None: nothing), in its order."""
    try:
        topic_param(query)
        if "defer" in query:
            defer_param(query["defer"], most)
    except HttpError as err:
        return err.code, err.detail
    return None


def by_model(query: dict[str, str]) -> tuple[str, str] | None:
    try:
        parse_query(PubQuery, query)
    except HttpError as err:
        return err.code, err.detail
    return None


@pytest.mark.parametrize(
    "query",
    [{}, {"topic": ""}, {"topic": "bad*"}, {"topic": "x" * 65}, {"topic": "x" * 64},
     {"topic": "t#ephemeral"}, {"topic": "ok", "publisher": ""}, {"topic": "bad*", "defer": "x"},
     *({"topic": "t", "defer": d}
       for d in ("0", "10", "1111111", "", "-1", "x", "²", "४", "1.0", " 1", "1_0", "+1"))],
)  # fmt: skip
def test_pub_parsed_by_hand_answers_as_its_model(query: dict[str, str]) -> None:
    # Beyond the broker's --max-req-timeout only the hand parser refuses (the model cannot
    # know the limit); every value here is within the default one.
    most = BrokerOptions().limits.max_req_timeout_ms
    hand, model = by_hand(query, most), by_model(query)
    assert (hand and hand[0]) == (model and model[0]), (hand, model)
    if hand is not None and model is not None:
        field = hand[1].partition(":")[0]
        assert model[1].startswith(field + ": ")
        if field == "topic":
            assert hand[1] == model[1]


@pytest.mark.parametrize("value", ["true", "TRUE", "1", "false", "0", "", "yes"])
def test_mpub_binary_flag_is_read_as_its_model_reads_it(value: str) -> None:
    from srtm.broker.documents import flag

    assert parse_query(MpubQuery, {"topic": "t", "binary": value}).binary is flag(value)


# -- /stats keeps nsqd's fields, in nsqd's order -------------------------------------------
NSQD_TOPIC = ["topic_name", "channels", "depth", "backend_depth", "message_count",
              "message_bytes", "paused", "e2e_processing_latency"]  # fmt: skip
NSQD_CHANNEL = ["channel_name", "depth", "backend_depth", "in_flight_count", "deferred_count",
                "message_count", "requeue_count", "timeout_count", "client_count", "clients",
                "paused", "e2e_processing_latency"]  # fmt: skip
NSQD_CLIENT = ["client_id", "hostname", "version", "remote_address", "state", "ready_count",
               "in_flight_count", "message_count", "finish_count", "requeue_count",
               "connect_ts", "sample_rate", "deflate", "snappy", "user_agent", "tls",
               "tls_version", "tls_cipher_suite", "authed", "auth_identity",
               "auth_identity_url", "pub_counts"]  # fmt: skip


async def test_stats_is_its_document_with_nsqds_fields_in_order(broker_api: BrokerApi) -> None:
    from nsq_raw import RawClient
    from srtm.protocol import Rdy, Sub

    broker, s = broker_api
    assert broker.tcp_address is not None
    sub = await RawClient.connect(*broker.tcp_address)
    await sub.send(Sub("st", "c"), Rdy(1))
    assert await sub.response() == b"OK"
    await call(s, "POST", "/mpub?topic=st&publisher=p", b"a\nb\n")
    status, doc = await call(s, "GET", "/stats?format=json")
    await sub.close()
    assert status == 200
    assert StatsDoc.model_validate(doc).model_dump() == doc  # nothing more, nothing less
    (topic,) = doc["topics"]
    (channel,) = topic["channels"]
    (client,) = channel["clients"]
    assert list(topic) == NSQD_TOPIC == list(TopicDoc.model_fields)
    assert list(channel) == NSQD_CHANNEL == list(ChannelDoc.model_fields)
    assert list(client) == NSQD_CLIENT == list(ClientDoc.model_fields)
    assert list(doc) == ["version", "health", "start_time", "topics", "memory", "producers", "srtm"]
