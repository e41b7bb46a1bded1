"""Identities (issue 29, items 6 and 7), on real in-process brokers over real sockets: a
relay link proves it is one (AUTH with the cluster token or the relay secret, or the auth
server's ``srtm_relay``), and a consumer class above ``default`` is proven (its
``--class-secret`` or the token, in IDENTIFY or AUTH, or the auth server's
``srtm_class``). A claim without proof is refused with nsqd's E_AUTH_FAILED, before it is
counted anywhere. A broker with no key and no auth server takes claims as said (covered by
test_admission and test_broker_relay)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import test_broker_tls_auth
import test_relay_security
from nsq_raw import RawClient
from srtm.broker import Broker, BrokerOptions
from srtm.broker.relay import counters_of
from srtm.broker.reporter import report_document
from srtm.broker.routes import Replicas, TopicRoute
from srtm.client import Subscriber
from srtm.protocol import Auth, Handoff, Identify, Pub, Sub
from srtm.protocol.session import Keys, Session, SessionSettings
from support import tcp_address as tcp
from test_broker_tls_auth import AuthServer

MakeBroker = Callable[..., Awaitable[Broker]]
TOKEN = "cluster-token-for-tests"
GOLD = "gold-secret"
#: test_broker_tls_auth's auth server (secret "good": alice; "relay": a relay link).
auth_server = test_broker_tls_auth.auth_server
#: ``await make(**options)``: a broker on ephemeral ports, its own data dir.
make = test_relay_security.make


async def connect(broker: Broker, **ident: Any) -> RawClient:
    """A connection that IDENTIFYed with ``ident``."""
    assert broker.tcp_address is not None
    c = await RawClient.connect(*broker.tcp_address)
    await c.identify(**ident)
    return c


async def replicated(
    make: MakeBroker, topic: str, a_options: dict[str, Any], b_options: dict[str, Any]
) -> tuple[Broker, Broker]:
    """Two brokers; ``topic`` replicated on both (ALL_PUBLISHERS), channel c1 homed on b."""
    a, b = await make(**a_options), await make(**b_options)
    peers = {"0": tcp(a), "1": tcp(b)}
    for x, me in ((a, "0"), (b, "1")):
        x.relay.set_route(TopicRoute(topic, me, None, Replicas(peers, "0", {"c1": "1"}), 0.0))
    return a, b


def count(broker: Broker, topic: str) -> int:
    t = broker.topics.get(topic)
    return 0 if t is None else t.message_count


async def publish(broker: Broker, topic: str, n: int) -> None:
    """PUB n bodies as a plain client and wait for each OK (which waits for the relay)."""
    c = await connect(broker)
    await c.send(*(Pub(topic, b"m%d" % i) for i in range(n)))
    for _ in range(n):
        assert await c.response() == b"OK"
    await c.close()


# -- relay links ----------------------------------------------------------------------------
async def test_a_self_declared_relay_is_refused(make: MakeBroker) -> None:
    # The finding: on a replicated topic, IDENTIFY srtm_relay got 100 OKs that the other
    # replica never saw. Now the first PUB is refused, and nothing is kept.
    a, b = await replicated(make, "t", {"token": TOKEN}, {"token": TOKEN})
    fake = await connect(a, srtm_relay=True)
    await fake.send(*(Pub("t", b"m%d" % i) for i in range(100)))
    err = await fake.error()
    assert err.startswith("E_AUTH_FAILED") and "srtm_relay" in err
    assert await fake.closed()
    assert count(a, "t") == 0 and count(b, "t") == 0
    handoff = await connect(a, srtm_relay=True)
    await handoff.send(Handoff("t", "a-token"))
    assert (await handoff.error()).startswith("E_AUTH_FAILED")


async def test_a_wrong_secret_is_refused_at_auth(make: MakeBroker) -> None:
    a = await make(token=TOKEN)
    fake = await connect(a, srtm_relay=True)
    await fake.send(Auth(b"a guess"))
    assert await fake.error() == "E_AUTH_FAILED AUTH failed"
    assert await fake.closed()


@pytest.mark.parametrize("key", ["token", "relay_auth_secret"])
async def test_brokers_with_a_token_or_relay_secret_still_replicate(
    make: MakeBroker, key: str
) -> None:
    a, b = await replicated(make, "t", {key: TOKEN}, {key: TOKEN})
    await publish(a, "t", 20)
    assert counters_of(a.relay.routes["t"]) == {"forwarded": 0, "relayed": 20, "fallback_local": 0}
    assert count(b, "t") == 20
    (link,) = [c for c in b.clients if c.identity.get("srtm_relay") is True]
    assert link.relay and link.session.operator  # proven by AUTH


async def test_a_peer_of_another_cluster_refuses_the_link_and_nothing_is_lost(
    make: MakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = await replicated(make, "t", {"token": TOKEN}, {"token": "another-cluster"})
    with caplog.at_level(logging.ERROR, "srtm.broker.relay"):
        await publish(a, "t", 6)
    assert counters_of(a.relay.routes["t"])["fallback_local"] == 6
    assert (count(a, "t"), count(b, "t")) == (6, 0)
    assert any(
        tcp(b) in r.getMessage() and "AUTH refused" in r.getMessage() for r in caplog.records
    )


async def test_a_relay_without_a_key_names_what_is_missing(
    make: MakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = await replicated(make, "t", {}, {"token": TOKEN})
    with caplog.at_level(logging.ERROR, "srtm.broker.relay"):
        await publish(a, "t", 3)
    assert (count(a, "t"), count(b, "t")) == (3, 0)
    assert any("--token" in r.getMessage() for r in caplog.records)


# -- consumer classes -----------------------------------------------------------------------
async def test_a_claimed_class_without_proof_is_refused_and_not_counted(make: MakeBroker) -> None:
    # The finding: two claimers took both gold places, and waiting claimers inflated gold's
    # demand. Now a claim is refused at SUB, before admission sees it.
    # The token alone is a key: classes above default need proof (here the token itself).
    broker = await make(token=TOKEN)
    broker.set_admission("t", {"gold": 2}, ["gold"])
    fakes = [await connect(broker, srtm_class="gold") for _ in range(5)]
    for c in fakes:
        await c.send(Sub("t", "c"))
        err = await c.error()
        assert err.startswith("E_AUTH_FAILED") and "'gold' is not proven" in err
        assert await c.closed()
    real = [await connect(broker, srtm_class="gold", srtm_class_secret=TOKEN) for _ in range(2)]
    for c in real:
        await c.send(Sub("t", "c"))
        assert await c.response() == b"OK"
    assert report_document(broker)["topics"]["t"]["demand"] == {"gold": 2}
    assert broker.admission["t"].counts() == [("gold", 2, 2)]


async def test_a_wrong_class_secret_is_refused_at_identify(make: MakeBroker) -> None:
    broker = await make(class_secret=(f"gold={GOLD}", "silver=s2"))
    assert broker.tcp_address is not None
    c = await RawClient.connect(*broker.tcp_address)
    await c.send(Identify({"srtm_class": "gold", "srtm_class_secret": "s2"}))  # silver's
    assert await c.error() == "E_AUTH_FAILED srtm_class_secret is not the secret of class 'gold'"
    assert await c.closed()


@pytest.mark.parametrize(
    ("ident", "auth"),
    [
        ({"srtm_class": "gold", "srtm_class_secret": GOLD}, None),  # IDENTIFY: its secret
        ({"srtm_class": "gold", "srtm_class_secret": TOKEN}, None),  # the token: any class
        ({}, GOLD),  # AUTH with the class's secret: that class, unclaimed
        ({"srtm_class": "gold"}, GOLD),  # AUTH proves what IDENTIFY claimed
    ],
)
async def test_a_proven_class_is_admitted(
    make: MakeBroker, ident: dict[str, Any], auth: str | None
) -> None:
    broker = await make(token=TOKEN, class_secret=(f"gold={GOLD}",))
    c = await connect(broker, **ident)
    if auth is not None:
        await c.send(Auth(auth.encode()))
        assert json.loads(await c.response())["identity"] == "srtm-class:gold"
    await c.send(Sub("t", "c"))
    assert await c.response() == b"OK"
    assert broker.admission["t"].counts() == [("gold", None, 1)]


async def test_the_subscriber_presents_its_class_secret(make: MakeBroker) -> None:
    broker = await make(token=TOKEN, class_secret=(f"gold={GOLD}",))
    sub = Subscriber("t", "c", addresses=[tcp(broker)], consumer_class="gold", class_secret=GOLD)
    try:
        await sub.start()
        assert sub.brokers == [tcp(broker)]
        assert broker.admission["t"].counts() == [("gold", None, 1)]
    finally:
        await sub.close()


async def test_the_auth_server_gives_the_class(make: MakeBroker, auth_server: AuthServer) -> None:
    auth_server.klass = "gold"
    broker = await make(auth_http_address=(auth_server.address,))
    c = await connect(broker)
    await c.send(Auth(b"good"), Sub("allowed_t", "c"))
    assert json.loads(await c.response())["identity"] == "alice"
    assert await c.response() == b"OK"
    assert broker.admission["allowed_t"].counts() == [("gold", None, 1)]
    # A class the answer does not give is a claim: refused, uncounted.
    other = await connect(broker, srtm_class="platinum")
    await other.send(Auth(b"good"), Sub("allowed_t", "c"))
    assert json.loads(await other.response())["identity"] == "alice"
    assert (await other.error()).startswith("E_AUTH_FAILED")
    assert report_document(broker)["topics"]["allowed_t"]["demand"] == {"gold": 1}


async def test_the_auth_servers_relay_and_the_token_prove_a_link(
    make: MakeBroker, auth_server: AuthServer
) -> None:
    broker = await make(token=TOKEN, auth_http_address=(auth_server.address,))
    # A tenant's secret does not make a relay link.
    tenant = await connect(broker, srtm_relay=True)
    await tenant.send(Auth(b"good"))
    assert "srtm_relay" not in json.loads(await tenant.response())
    await tenant.send(Pub("allowed_t", b"x"))
    assert (await tenant.error()).startswith("E_AUTH_FAILED")
    # The token is checked here: the auth server never hears it.
    link = await connect(broker, srtm_relay=True)
    await link.send(Auth(TOKEN.encode()), Pub("any_topic", b"x"))
    assert json.loads(await link.response())["srtm_relay"] is True
    assert await link.response() == b"OK"
    assert [q["secret"] for q in auth_server.queries] == ["good"]


async def test_bad_class_secrets_are_refused_with_the_flag_named(tmp_path: Path) -> None:
    for bad in (("gold",), ("gold=",), ("default=x",), ("a b=x",), ("gold=x", "gold=y")):
        with pytest.raises(ValueError, match="--class-secret"):
            Broker(BrokerOptions(data_dir=tmp_path, class_secret=bad))
    assert GOLD not in repr(
        Broker(BrokerOptions(data_dir=tmp_path, class_secret=(f"gold={GOLD}",))).keys
    )


# -- the session, sans-I/O ------------------------------------------------------------------
class _Host:
    def __init__(self) -> None:
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def negotiated(self, heartbeat_changed: bool) -> None:
        pass


def test_the_session_believes_claims_only_where_it_has_nothing_to_check() -> None:
    keyless = Session(_Host(), SessionSettings())  # type: ignore[arg-type]
    keyless.receive(Identify({"srtm_relay": True}), 0)
    assert keyless.relay and not keyless.fake_relay
    keyed = Session(_Host(), SessionSettings(keys=Keys((TOKEN,))))  # type: ignore[arg-type]
    keyed.receive(Identify({"srtm_relay": True}), 0)
    assert not keyed.relay and keyed.fake_relay
    keyed.receive(Auth(TOKEN.encode()), 0)
    assert keyed.relay and not keyed.fake_relay
    assert repr(Keys((TOKEN,), {"gold": GOLD})) == "Keys(operator=1, classes=['gold'])"
