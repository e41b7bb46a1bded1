"""No controller route answers 500 to bad input: every route that takes input is sent
malformed values (NaN, infinities, huge numbers, overlong strings, wrong types, missing
fields, bad JSON) and answers 4xx with a message naming what was wrong."""

from __future__ import annotations

import json
from typing import Any

import pytest

from support import ControllerClient

REGISTRATION = {"id": "a", "tcp_address": "127.0.0.1:9", "http_address": "127.0.0.1:9",
                "mcap": 1e6}  # fmt: skip
TOPIC = {"name": "t", "slo_p99_ms": 5.0, "burst": 20, "rate": 100, "open": True,
         "publishers": [{"id": "p0", "rate": 10}]}  # fmt: skip

#: Values wrong for every field of every request document.
BAD = [float("nan"), float("inf"), -float("inf"), 1e308, -1, 10**400, "x" * 100_000,
       [1, "x"], {"x": None}]  # fmt: skip

#: Each route that takes a JSON body: a valid body, to spoil one field at a time.
BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/brokers"): REGISTRATION,
    ("POST", "/brokers/a/report"): {"load": 1, "topics": {}, "version": 2,
                                    "resources": {"cpu": 0.1, "egress_bps": 1,
                                                  "congested": {"cpu": False, "network": False}}},
    ("POST", "/topics"): {**TOPIC, "name": "u", "max_publisher_rate": 5,
                          "join_secret": "s" * 16, "utility": None, "fit": False,
                          "policy": "srtm", "arrivals_ns": None},
    ("PATCH", "/topics/t"): {"slo_p99_ms": 5.0, "rate": 100, "burst": 20, "policy": "srtm",
                             "max_publisher_rate": 5, "join_secret": "s" * 16},
    ("POST", "/topics/t/publishers"): {"publishers": [{"id": "n1", "rate": 1, "group": "g"}]},
    ("POST", "/topics/t/move"): {"publishers": ["p0"], "to": "a"},
    ("POST", "/topics/t/replicas"): {"count": 1},
}  # fmt: skip

#: Fields where one of ``BAD`` is the value a field takes as valid: none but these.
VALID = {("fit", "x" * 100_000): False}

#: Each field of a topic's window in a broker's report.
WINDOW = {"rate": 1.0, "backlog": 0.0, "depth": 0, "waiting": 0, "arrived": 1,
          "channels": ["c"], "bucket": None, "held": True, "arrived_bytes": 1,
          "demand": {"default": 1}}  # fmt: skip

#: Each route that takes a query: a valid query, and per parameter values it refuses
#: (numbers not finite, negative, zero or huge; names too long or outside NSQ's rule).
#: nsqlookupd's /topic/delete and /topic/tombstone take any name (as nsqlookupd does:
#: nothing to delete is no error), so only their missing parameters are refused.
NAMES = ["x" * 10_000, "<script>", "a b", "\x00", "t\n"]
NUMBERS = ["nan", "inf", "-inf", "-1", "0", "1e400", "1e308", "x", "0x10"]
QUERIES: dict[tuple[str, str], tuple[dict[str, str], dict[str, list[str]]]] = {
    ("GET", "/plan"): ({"topic": "t"}, {"topic": ["", "x" * 10_000]}),
    ("GET", "/assign"): (
        {"topic": "t", "publisher": "p9", "rate": "1", "group": "g", "join_secret": "s" * 16},
        {"topic": ["", "x" * 10_000], "publisher": ["", *NAMES], "rate": NUMBERS,
         "group": ["x" * 300], "join_secret": ["short", "x" * 300, "a b" * 10]},
    ),
    ("GET", "/lookup"): ({"topic": "t"}, {"topic": ["x" * 10_000]}),
    ("GET", "/channels"): ({"topic": "t"}, {}),
    ("POST", "/topic/create"): ({"topic": "t"}, {"topic": ["", *NAMES]}),
    ("POST", "/topic/delete"): ({"topic": "t"}, {}),
    ("POST", "/channel/create"): (
        {"topic": "t", "channel": "c"}, {"topic": ["", *NAMES], "channel": ["", *NAMES]}
    ),
    ("POST", "/channel/delete"): ({"topic": "t", "channel": "c"}, {}),
    ("POST", "/topic/tombstone"): ({"topic": "t", "node": "127.0.0.1:9"}, {}),
}  # fmt: skip
#: The fields each body must have.
REQUIRED = {"/brokers": ["id", "tcp_address", "http_address", "mcap"],
            "/topics": ["name", "slo_p99_ms", "burst"],
            "/topics/t/publishers": ["publishers"], "/topics/t/move": ["publishers", "to"],
            "/topics/t/replicas": ["count"]}  # fmt: skip


@pytest.fixture
async def client(controller_api: ControllerClient) -> ControllerClient:
    assert (await controller_api.call("POST", "/brokers", REGISTRATION))[0] == 200
    assert (await controller_api.call("POST", "/topics", TOPIC))[0] == 201
    return controller_api


async def raw(client: ControllerClient, method: str, path: str, body: bytes) -> tuple[int, Any]:
    async with client.http.request(method, client.base + path, data=body) as resp:
        text = await resp.text()
    try:
        return resp.status, json.loads(text)
    except ValueError:  # a 500 is text
        return resp.status, {"message": text}


def _named(field: str, message: str) -> bool:
    return field.lower() in message.lower()


async def test_every_body_field_refuses_bad_values_naming_the_field(
    client: ControllerClient,
) -> None:
    failures = []
    for (method, path), good in BODIES.items():
        for field in good:
            for bad in BAD:
                if VALID.get((field, bad if isinstance(bad, str) else None)) is False:
                    continue
                body = json.dumps({**good, field: bad}).encode()
                status, doc = await raw(client, method, path, body)
                if not (400 <= status < 500 and _named(field, doc.get("message", ""))):
                    failures.append((method, path, field, repr(bad)[:30], status, doc))
    assert not failures, "\n".join(str(f)[:300] for f in failures)


async def test_every_field_of_a_reported_window_refuses_bad_values_naming_it(
    client: ControllerClient,
) -> None:
    failures = []
    for field in WINDOW:
        for bad in BAD:
            doc = {"load": 1, "version": 2, "topics": {"t": {**WINDOW, field: bad}}}
            status, answer = await raw(
                client, "POST", "/brokers/a/report", json.dumps(doc).encode()
            )
            if not (status == 400 and answer["message"].startswith(f"topics.t.{field}")):
                failures.append((field, repr(bad)[:30], status, answer))
    assert not failures, "\n".join(str(f)[:300] for f in failures)


@pytest.mark.parametrize(
    ("field", "bad"),
    [("id", "a b"), ("id", "x" * 129), ("id", "<img>"), ("id", ""), ("rate", float("nan")),
     ("rate", 1e308), ("rate", 0), ("rate", -5), ("rate", "1"), ("group", "g" * 300)],
)  # fmt: skip
async def test_publishers_in_bodies_refuse_bad_ids_and_rates(
    client: ControllerClient, field: str, bad: Any
) -> None:
    pub = {"id": "n1", "rate": 1, field: bad}
    for method, path, doc in [
        ("POST", "/topics", {**TOPIC, "name": "v", "publishers": [pub]}),
        ("POST", "/topics/t/publishers", {"publishers": [pub]}),
    ]:
        status, answer = await raw(client, method, path, json.dumps(doc).encode())
        assert status == 400, (path, answer)
        assert answer["message"].startswith(f"publishers[0].{field}: "), answer


async def test_missing_fields_and_bodies_that_are_not_objects_are_named(
    client: ControllerClient,
) -> None:
    for (method, path), good in BODIES.items():
        for body in (b"", b"{", b"[]", b"null", b"NaN", b'"x"', b"\xff\xfe"):
            status, doc = await raw(client, method, path, body)
            assert status == 400 and "body" in doc["message"], (path, body, doc)
        for field in REQUIRED.get(path, []):
            doc = {k: v for k, v in good.items() if k != field}
            status, answer = await raw(client, method, path, json.dumps(doc).encode())
            assert status == 400 and _named(field, answer["message"]), (path, field, answer)


async def test_every_query_parameter_refuses_bad_values_naming_it(
    client: ControllerClient,
) -> None:
    failures = []
    for (method, path), (good, refused) in QUERIES.items():
        cases = [(key, {k: v for k, v in good.items() if k != key}) for key in good]
        cases += [(key, {**good, key: bad}) for key, bads in refused.items() for bad in bads]
        for key, params in cases:
            if key in ("rate", "group", "join_secret") and key not in params:
                continue  # optional
            async with client.http.request(method, client.base + path, params=params) as resp:
                status, text = resp.status, await resp.text()
            try:
                message = json.loads(text)["message"]
            except (ValueError, KeyError, TypeError):
                message = text
            if not (400 <= status < 500 and _named(key, message)):
                failures.append((method, path, key, params.get(key, "")[:20], status, text))
    assert not failures, "\n".join(str(f)[:300] for f in failures)


async def test_no_route_answers_500_to_anything_here(client: ControllerClient) -> None:
    """Every value of every table above, on every route with a body, as the whole body
    and as a path parameter: never a 500."""
    paths = ["/topics/{x}", "/topics/{x}/publishers", "/topics/{x}/move",
             "/topics/{x}/replicas", "/brokers/{x}/report", "/brokers/{x}",
             "/topics/t/publishers/{x}", "/ui/{x}"]  # fmt: skip
    for template in paths:
        for x in ["x" * 5000, "%00", "..", "%ff", "<script>"]:
            for method in ("GET", "POST", "PATCH", "DELETE"):
                async with client.http.request(
                    method, client.base + template.replace("{x}", x), data=b"{}"
                ) as resp:
                    assert resp.status < 500, (method, template, x, await resp.text())
    for method, path in BODIES:
        for bad in BAD[:-1]:  # an object with no known field: the fields' defaults
            status, _ = await raw(client, method, path, json.dumps(bad).encode())
            assert status == 400, (path, bad)
