"""Open topics and GET /assign are safe (issue 29, finding 3): an unknown publisher's
rate is bounded per topic, a join that cannot be placed changes nothing, joining can
need a secret or the cluster token, and publisher ids are checked."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from srtm.control.service import ControllerOptions, ControllerService
from support import ControllerClient

REGISTRATION = {"id": "a", "tcp_address": "127.0.0.1:9", "http_address": "127.0.0.1:9",
                "mcap": 1e6}  # fmt: skip
OPEN = {"name": "O", "slo_p99_ms": 5.0, "burst": 20, "rate": 100, "open": True,
        "publishers": [{"id": "p1", "rate": 10}]}  # fmt: skip
SECRET = "correct-horse-battery"


async def setup(client: ControllerClient, topic: dict[str, Any], mcap: float = 1e6) -> None:
    assert (await client.call("POST", "/brokers", {**REGISTRATION, "mcap": mcap}))[0] == 200
    assert (await client.call("POST", "/topics", topic))[0] == 201


def plan_of(topic: dict[str, Any]) -> tuple[Any, ...]:
    """What a refused join must leave as it was."""
    return (topic["version"], topic["rate"], topic["status"], topic["brokers"],
            topic["unassigned"], topic["publishers"])  # fmt: skip


async def test_a_huge_rate_cannot_take_an_open_topic_down(controller_api: ControllerClient) -> None:
    """The finding: ``rate=1e308`` was taken, the next joins answered 500 (fsum overflow)
    with the topic's publishers already changed, and normal joins failed after it."""
    await setup(controller_api, OPEN)
    _, before = await controller_api.call("GET", "/topics/O")
    for _ in range(2):
        status, body = await controller_api.call("GET", "/assign?topic=O&publisher=big&rate=1e308")
        assert status == 400 and body["message"].startswith("rate: "), body
    _, after = await controller_api.call("GET", "/topics/O")
    assert plan_of(after) == plan_of(before)
    assert math.isfinite(after["rate"]) and after["status"] == "placed"
    # Normal joins and the existing publisher go on.
    assert (await controller_api.call("GET", "/assign?topic=O&publisher=p2&rate=5"))[0] == 200
    status, body = await controller_api.call("GET", "/assign?topic=O&publisher=p1")
    assert status == 200 and body["broker"] == "a"


@pytest.mark.parametrize("rate", ["nan", "NaN", "inf", "-inf", "Infinity", "-1", "0", "1e308",
                                  "1e400", "101", "x", "true"])  # fmt: skip
async def test_a_rate_outside_the_topics_bound_is_refused_naming_rate(
    controller_api: ControllerClient, rate: str
) -> None:
    await setup(controller_api, OPEN)
    status, body = await controller_api.call("GET", f"/assign?topic=O&publisher=n&rate={rate}")
    assert status == 400 and body["message"].startswith("rate: "), body
    assert (await controller_api.call("GET", "/topics/O"))[1]["publishers"] == 1


async def test_max_publisher_rate_bounds_joins_and_a_patch_changes_it(
    controller_api: ControllerClient,
) -> None:
    await setup(controller_api, {**OPEN, "max_publisher_rate": 5})
    _, doc = await controller_api.call("GET", "/topics/O")
    assert doc["max_publisher_rate"] == 5
    status, body = await controller_api.call("GET", "/assign?topic=O&publisher=n&rate=6")
    assert status == 400 and "at most 5 msg/s" in body["message"]
    assert (await controller_api.call("GET", "/assign?topic=O&publisher=n&rate=5"))[0] == 200
    assert (await controller_api.call("PATCH", "/topics/O", {"max_publisher_rate": 50}))[0] == 200
    assert (await controller_api.call("GET", "/assign?topic=O&publisher=m&rate=50"))[0] == 200
    # null: back to the default, the topic's rate
    assert (await controller_api.call("PATCH", "/topics/O", {"max_publisher_rate": None}))[0] == 200
    assert (await controller_api.call("GET", "/topics/O"))[1]["max_publisher_rate"] == 100


async def test_a_join_that_cannot_be_placed_leaves_the_topic_as_it_was(
    controller_api: ControllerClient,
) -> None:
    """Before, the joiner became unassigned: the topic went ``short`` and every placed
    publisher's share shrank by the unplaced rate's part (to nothing for a huge one)."""
    auto = {**OPEN, "rate": None, "publishers": [{"id": "p1", "rate": 100}]}
    await setup(controller_api, auto, mcap=200)
    _, before = await controller_api.call("GET", "/topics/O")
    status, body = await controller_api.call("GET", "/assign?topic=O&publisher=big&rate=500")
    assert status == 503 and "'big' cannot be placed" in body["message"], body
    _, after = await controller_api.call("GET", "/topics/O")
    assert plan_of(after) == plan_of(before)
    assert after["brokers"][0]["bucket"] == {"rate": pytest.approx(110.0), "burst": 20.0}
    status, body = await controller_api.call("GET", "/assign?topic=O&publisher=p1")
    assert status == 200 and body["version"] == before["version"]
    # The refused publisher is not in the topic: it may try again with a smaller rate.
    status, body = await controller_api.call("GET", "/assign?topic=O&publisher=big")
    assert status == 400 and body["message"].startswith("rate: required")
    assert (await controller_api.call("GET", "/assign?topic=O&publisher=big&rate=50"))[0] == 200


async def test_a_join_secret_is_needed_and_never_shown(controller_api: ControllerClient) -> None:
    await setup(controller_api, {**OPEN, "join_secret": SECRET})
    for path in ("/topics/O", "/plan?topic=O", "/ui/state", "/topics"):
        async with controller_api.http.get(controller_api.base + path) as resp:
            assert SECRET not in await resp.text(), path
    _, doc = await controller_api.call("GET", "/topics/O")
    assert doc["join_secret_set"] is True
    for query in ("", "&join_secret=wrong-secret-of-16", f"&join_secret={SECRET}x"):
        status, body = await controller_api.call(
            "GET", f"/assign?topic=O&publisher=n&rate=1{query}"
        )
        assert status == 401 and body["message"].startswith("join_secret: "), body
    status, _ = await controller_api.call(
        "GET", f"/assign?topic=O&publisher=n&rate=1&join_secret={SECRET}"
    )
    assert status == 200
    async with controller_api.http.get(
        controller_api.base + "/assign?topic=O&publisher=m&rate=1",
        headers={"X-SRTM-Join-Secret": SECRET},
    ) as resp:
        assert resp.status == 200
    # A known publisher needs no secret to ask where to publish.
    assert (await controller_api.call("GET", "/assign?topic=O&publisher=n"))[0] == 200
    assert (await controller_api.call("PATCH", "/topics/O", {"join_secret": None}))[0] == 200
    assert (await controller_api.call("GET", "/assign?topic=O&publisher=k&rate=1"))[0] == 200
    _, doc = await controller_api.call("GET", "/topics/O")
    assert doc["join_secret_set"] is False


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[tuple[ControllerClient, str]]:
    """A controller with a cluster token and --joins-need-auth."""
    token = "t" * 32
    opts = ControllerOptions(
        db=tmp_path / "c.db", http_port=0, tick_s=60, token=token, joins_need_auth=True
    )
    service = ControllerService(opts)
    await service.start()
    assert service.http_address is not None
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            base = "http://{}:{}".format(*service.http_address)
            async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=10), headers=headers
            ) as admin:
                await setup(ControllerClient(admin, base), OPEN)
            yield ControllerClient(http, base), token
    finally:
        await service.stop()


async def test_joins_need_auth_asks_every_joiner_for_a_secret_or_the_token(
    guarded: tuple[ControllerClient, str],
) -> None:
    client, token = guarded
    status, body = await client.call("GET", "/assign?topic=O&publisher=n&rate=1")
    assert status == 401 and body["message"].startswith("join_secret: ")
    async with client.http.get(
        client.base + "/assign?topic=O&publisher=n&rate=1",
        headers={"Authorization": f"Bearer {token}"},
    ) as resp:
        assert resp.status == 200
    assert (await client.call("GET", "/assign?topic=O&publisher=p1"))[0] == 200


@pytest.mark.parametrize(
    "publisher", ["<script>alert(1)</script>", "a b", "x" * 129, "%00", "t%0A", "é", "a;b"]
)
async def test_a_publisher_id_outside_the_rule_is_refused_naming_publisher(
    controller_api: ControllerClient, publisher: str
) -> None:
    await setup(controller_api, OPEN)
    status, body = await controller_api.call("GET", f"/assign?topic=O&publisher={publisher}&rate=1")
    assert status == 400 and body["message"].startswith("publisher: "), body
    assert (await controller_api.call("GET", "/topics/O"))[1]["publishers"] == 1


async def test_ids_with_the_allowed_characters_join(controller_api: ControllerClient) -> None:
    await setup(controller_api, OPEN)
    for publisher in ["host-1.example:4150", "svc@host", "Zm9v+YmFy/cXV4=", "x" * 128]:
        params = {"topic": "O", "publisher": publisher, "rate": "1"}
        async with controller_api.http.get(controller_api.base + "/assign", params=params) as r:
            assert r.status == 200 and (await r.json())["publisher"] == publisher


async def test_the_openapi_document_describes_joining(controller_api: ControllerClient) -> None:
    _, doc = await controller_api.call("GET", "/openapi.json")
    assign = doc["paths"]["/assign"]["get"]
    params = {p["name"]: p for p in assign["parameters"]}
    assert {"publisher", "rate", "join_secret"} <= set(params)
    assert "max_publisher_rate" in params["rate"]["description"]
    assert "401" in assign["responses"] and "X-SRTM-Join-Secret" in assign["description"]
    schemas = doc["components"]["schemas"]
    assert {"max_publisher_rate", "join_secret"} <= set(schemas["NewTopic"]["properties"])
    assert {"max_publisher_rate", "join_secret"} <= set(schemas["TopicChange"]["properties"])
    status = next(s for n, s in schemas.items() if n.startswith("TopicStatus"))
    assert "join_secret" not in status["properties"] and "join_secret_set" in status["properties"]


async def test_the_client_publisher_joins_with_the_topics_secret(
    controller_api: ControllerClient,
) -> None:
    from srtm.client.publisher import Publisher

    await setup(controller_api, {**OPEN, "join_secret": SECRET})
    for secret, joined in ((None, False), (SECRET, True)):
        pub = Publisher("O", "sensor-1", controller=controller_api.base, rate=2.0,
                        join_secret=secret)  # fmt: skip
        pub._session = aiohttp.ClientSession()
        try:
            if joined:
                assert await pub._where() == "127.0.0.1:9"
            else:
                with pytest.raises(ConnectionError, match="join_secret"):
                    await pub._where()
        finally:
            await pub._session.close()
