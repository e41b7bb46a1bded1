"""--protect-managed: nsqd's destructive endpoints need the token on managed topics
(issue 29, finding 7: /channel/empty, /topic/empty and /topic/delete destroyed 300
acknowledged messages of a managed topic, from anyone who could reach the broker).

Live: brokers started as ``srtm broker`` is, with a cluster token, on 127.0.0.1.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from srtm.broker.http import DESTRUCTIVE, ROUTES
from srtm.launch import BrokerProcess, start_broker

MANAGED, HELD, PLAIN = "managed", "held", "plain"
#: Every destructive endpoint, on topic T (channel c where it takes one).
ENDPOINTS = sorted(DESTRUCTIVE)


def query(path: str, topic: str) -> str:
    return f"{path}?topic={topic}" + ("&channel=c" if path.startswith("/channel/") else "")


def post(
    proc: BrokerProcess, path: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> tuple[int, dict[str, Any] | str, dict[str, str]]:
    """POST without the token unless ``headers`` carry it: status, body, headers."""
    req = urllib.request.Request(proc.url(path), data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), dict(err.headers)


def topic_doc(proc: BrokerProcess, topic: str) -> dict[str, Any]:
    (doc,) = proc.stats(topic)["topics"]
    return dict(doc)


def set_up(proc: BrokerProcess, n: int = 300) -> None:
    """A shaped topic, a held one and a plain one, each with channel c; the held one
    keeps ``n`` acknowledged messages (released by no bucket)."""
    proc.post(f"/srtm/bucket?topic={MANAGED}&rate=100&burst=10")
    proc.post(f"/srtm/bucket/hold?topic={HELD}")
    proc.post(f"/topic/create?topic={PLAIN}")
    for topic in (MANAGED, HELD, PLAIN):
        proc.post(f"/channel/create?topic={topic}&channel=c")
    proc.post(f"/mpub?topic={HELD}", b"\n".join(b"m%d" % i for i in range(n)))


@pytest.fixture
def protected(broker_proc: BrokerProcess) -> BrokerProcess:
    set_up(broker_proc)
    return broker_proc


def test_every_destructive_endpoint_is_an_nsqd_route_that_documents_the_401() -> None:
    routes = {r.path: r for r in ROUTES if r.method == "POST"}
    assert len(DESTRUCTIVE) == 8
    for path in DESTRUCTIVE:
        assert 401 in routes[path].errors, path


def test_without_the_token_a_managed_topic_is_left_alone(protected: BrokerProcess) -> None:
    """Every destructive endpoint, on a shaped and on a held topic, with no token, a wrong
    one, or another scheme: 401, and nothing changed."""
    for path in ENDPOINTS:
        for topic in (MANAGED, HELD):
            for auth in (None, "Bearer wrong", "Basic x"):
                headers = {} if auth is None else {"Authorization": auth}
                status, body, answer_headers = post(protected, query(path, topic), headers)
                assert status == 401, (path, topic, auth)
                assert isinstance(body, dict) and body["message"] == "E_UNAUTHORIZED"
                assert body["detail"] == f"topic {topic} is managed: {path} needs the cluster token"
                assert answer_headers["WWW-Authenticate"].startswith("Bearer")
    for topic in (MANAGED, HELD):
        doc = topic_doc(protected, topic)
        assert [c["channel_name"] for c in doc["channels"]] == ["c"]
        assert doc["paused"] is False and doc["channels"][0]["paused"] is False
    assert topic_doc(protected, HELD)["depth"] == 300  # every acknowledged message kept


def test_the_token_holder_may_and_unmanaged_topics_stay_nsqds(protected: BrokerProcess) -> None:
    token = protected.headers
    for path in ("/channel/pause", "/channel/unpause", "/topic/pause", "/topic/unpause"):
        for topic in (MANAGED, HELD):
            assert post(protected, query(path, topic), token)[0] == 200
        assert post(protected, query(path, PLAIN))[0] == 200  # nsqadmin, nsq tools
    assert post(protected, query("/channel/empty", HELD), token)[0] == 200
    assert post(protected, query("/topic/empty", HELD), token)[0] == 200
    assert topic_doc(protected, HELD)["depth"] == 0
    for topic in (MANAGED, HELD):
        assert post(protected, query("/channel/delete", topic), token)[0] == 200
        assert post(protected, query("/topic/delete", topic), token)[0] == 200
    assert post(protected, query("/channel/empty", PLAIN))[0] == 200
    assert post(protected, query("/channel/delete", PLAIN))[0] == 200
    assert post(protected, query("/topic/delete", PLAIN))[0] == 200
    assert protected.stats()["topics"] == []


def test_unknown_names_answer_as_before(protected: BrokerProcess) -> None:
    """A topic the broker does not have is nobody's: nsqd's 404. A managed topic's
    unknown channel is asked for the token first, as /srtm/* endpoints are."""
    status, body, _ = post(protected, "/topic/delete?topic=nope")
    assert (status, body) == (404, {"message": "TOPIC_NOT_FOUND"})
    nope = f"/channel/delete?topic={MANAGED}&channel=nope"
    assert post(protected, nope)[0] == 401
    status, body, _ = post(protected, nope, protected.headers)
    assert (status, body) == (404, {"message": "CHANNEL_NOT_FOUND"})


def test_no_protect_managed_is_plain_nsqd(tmp_path: Path) -> None:
    proc = start_broker(tmp_path / "data", ["--no-protect-managed"])
    try:
        set_up(proc)
        assert post(proc, query("/channel/empty", HELD))[0] == 200
        assert post(proc, query("/topic/empty", HELD))[0] == 200
        assert topic_doc(proc, HELD)["depth"] == 0
        assert post(proc, query("/topic/delete", MANAGED))[0] == 200
    finally:
        proc.stop()
