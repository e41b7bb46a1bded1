"""The relay's links to peers that require TLS or AUTH, over real sockets: two in-process
brokers, the peer with ``--tls-required`` (a client certificate too), or with an auth
server; the relay negotiates as an NSQ client (IDENTIFY ``tls_v1``, the upgrade, AUTH).
A link that cannot (an untrusted certificate, a bad secret) falls back here with nothing
lost and says why, naming the peer.

The certificates and the auth server are ``test_broker_tls_auth``'s fixtures.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import test_broker_tls_auth
from nsq_raw import RawClient
from srtm.broker import Broker, BrokerOptions
from srtm.broker.relay import counters_of
from srtm.broker.routes import Forward, Replicas, TopicRoute
from srtm.protocol import Pub
from support import tcp_address as tcp
from test_broker_tls_auth import AuthServer, Certs

MakeBroker = Callable[..., Awaitable[Broker]]
#: That module's fixtures, used here too (pytest finds them as this module's names).
certs = test_broker_tls_auth.certs
auth_server = test_broker_tls_auth.auth_server


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[MakeBroker]:
    """``await make(**options)``: a broker on ephemeral ports, its own data dir."""
    started: list[Broker] = []

    async def start(**options: Any) -> Broker:
        n = len(started)
        opts = BrokerOptions(
            tcp_port=0, http_port=0, broker_id=n, data_dir=tmp_path / f"b{n}", **options
        )
        broker = Broker(opts)
        await broker.start()
        started.append(broker)
        return broker

    yield start
    for b in reversed(started):
        await b.stop()


def forward(a: Broker, topic: str, to: Broker) -> None:
    a.relay.set_route(TopicRoute(topic, "0", Forward(tcp(to), {}, 3600.0), None, 0.0))


async def publish(broker: Broker, topic: str, n: int) -> list[bytes]:
    """PUB n bodies to ``broker`` and wait for each OK (which waits for the relay)."""
    assert broker.tcp_address is not None
    c = await RawClient.connect(*broker.tcp_address)
    await c.identify()
    bodies = [b"m%d" % i for i in range(n)]
    await c.send(*(Pub(topic, b) for b in bodies))
    for _ in bodies:
        assert await c.response() == b"OK"
    await c.close()
    return bodies


def count(broker: Broker, topic: str) -> int:
    t = broker.topics.get(topic)
    return 0 if t is None else t.message_count


def relay_clients(broker: Broker) -> list[Any]:
    return [c for c in broker.clients if c.identity.get("srtm_relay") is True]


def server_tls(certs: Certs, **more: Any) -> dict[str, Any]:
    return {"tls_cert": certs.server_cert, "tls_key": certs.server_key, **more}


# -- TLS ------------------------------------------------------------------------------------
async def test_forwarding_to_a_tls_required_peer_goes_over_tls(
    make: MakeBroker, certs: Certs
) -> None:
    b = await make(**server_tls(certs, tls_required="tcp-https"))
    a = await make(relay_tls_root_ca_file=certs.ca)
    forward(a, "t", b)
    await publish(a, "t", 20)
    assert counters_of(a.relay.routes["t"]) == {"forwarded": 20, "relayed": 0, "fallback_local": 0}
    assert (count(a, "t"), count(b, "t")) == (0, 20)
    (link,) = relay_clients(b)
    assert link.tls is not None and link.tls.established


async def test_replication_to_a_peer_that_verifies_client_certificates(
    make: MakeBroker, certs: Certs
) -> None:
    b = await make(
        **server_tls(certs, tls_root_ca_file=certs.ca, tls_client_auth_policy="require-verify")
    )
    a = await make(
        relay_tls="required",
        relay_tls_root_ca_file=certs.ca,
        relay_tls_cert=certs.client_cert,
        relay_tls_key=certs.client_key,
    )
    peers = {"0": tcp(a), "1": tcp(b)}
    a.relay.set_route(TopicRoute("t", "0", None, Replicas(peers, "0", {"c1": "1"}), 0.0))
    await publish(a, "t", 15)
    assert counters_of(a.relay.routes["t"]) == {"forwarded": 0, "relayed": 15, "fallback_local": 0}
    assert count(b, "t") == 15
    (link,) = relay_clients(b)
    assert link.tls is not None and link.tls.common_name == "alice"


async def test_an_untrusted_certificate_falls_back_here_and_says_why(
    make: MakeBroker, certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    b = await make(**server_tls(certs, tls_required="tcp-https"))
    a = await make()  # the system's CAs: the test CA is not among them
    forward(a, "t", b)
    with caplog.at_level(logging.ERROR, "srtm.broker.relay"):
        sent = await publish(a, "t", 10)
    assert counters_of(a.relay.routes["t"]) == {"forwarded": 0, "relayed": 0, "fallback_local": 10}
    assert (count(a, "t"), count(b, "t")) == (len(sent), 0)  # nothing lost: kept here
    failed = [r.getMessage() for r in caplog.records if "TLS handshake failed" in r.getMessage()]
    assert failed and all(tcp(b) in m and "retrying" in m for m in failed)


async def test_tls_required_refuses_a_peer_without_tls(
    make: MakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    b = await make()
    a = await make(relay_tls="required")
    forward(a, "t", b)
    with caplog.at_level(logging.ERROR, "srtm.broker.relay"):
        await publish(a, "t", 5)
    assert (count(a, "t"), count(b, "t")) == (5, 0)
    assert any(tcp(b) in r.getMessage() and "offers none" in r.getMessage() for r in caplog.records)


# -- AUTH -----------------------------------------------------------------------------------
async def test_forwarding_to_a_peer_with_an_auth_server_sends_auth(
    make: MakeBroker, auth_server: AuthServer, tmp_path: Path
) -> None:
    b = await make(auth_http_address=(auth_server.address,))
    secret = tmp_path / "relay.secret"
    secret.write_text("relay\n")
    a = await make(relay_auth_secret_file=secret)
    forward(a, "allowed_t", b)
    await publish(a, "allowed_t", 12)
    assert counters_of(a.relay.routes["allowed_t"])["forwarded"] == 12
    assert count(b, "allowed_t") == 12
    assert [q["secret"] for q in auth_server.queries] == ["relay"]
    (link,) = relay_clients(b)
    assert link.relay and link.gate is not None and link.gate.state.identity == "broker"


async def test_a_secret_the_auth_server_does_not_vouch_for_as_a_relay_is_refused(
    make: MakeBroker, auth_server: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    # "good" is a tenant's secret: its answer has no srtm_relay, so the link is not one.
    b = await make(auth_http_address=(auth_server.address,))
    a = await make(relay_auth_secret="good")
    forward(a, "allowed_t", b)
    with caplog.at_level(logging.ERROR, "srtm.broker.relay"):
        await publish(a, "allowed_t", 4)
    assert (count(a, "allowed_t"), count(b, "allowed_t")) == (4, 0)  # kept here
    assert any(
        tcp(b) in m and "does not take it for a relay link" in m
        for m in (r.getMessage() for r in caplog.records)
    )


async def test_a_bad_secret_falls_back_here_and_retries(
    make: MakeBroker, auth_server: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    b = await make(auth_http_address=(auth_server.address,))
    a = await make(relay_auth_secret="bad")
    forward(a, "allowed_t", b)
    with caplog.at_level(logging.ERROR, "srtm.broker.relay"):
        await publish(a, "allowed_t", 8)
    assert (count(a, "allowed_t"), count(b, "allowed_t")) == (8, 0)
    assert counters_of(a.relay.routes["allowed_t"])["fallback_local"] == 8
    assert any(
        tcp(b) in r.getMessage() and "AUTH refused" in r.getMessage() for r in caplog.records
    )
    link = a.relay.links[tcp(b)]
    assert not link.connected and link.down_until > 0  # tried again after its backoff


async def test_a_peer_that_wants_auth_without_a_secret_is_named(
    make: MakeBroker, auth_server: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    b = await make(auth_http_address=(auth_server.address,))
    a = await make()
    forward(a, "allowed_t", b)
    with caplog.at_level(logging.ERROR, "srtm.broker.relay"):
        await publish(a, "allowed_t", 3)
    assert (count(a, "allowed_t"), count(b, "allowed_t")) == (3, 0)
    assert any("--relay-auth-secret" in r.getMessage() for r in caplog.records)
    assert auth_server.queries == []  # no secret was sent


# -- settings -------------------------------------------------------------------------------
def test_bad_relay_settings_are_refused_with_the_flag_named(tmp_path: Path, certs: Certs) -> None:
    def broker(**options: Any) -> Broker:
        return Broker(BrokerOptions(data_dir=tmp_path, **options))

    with pytest.raises(ValueError, match="--relay-tls-cert and --relay-tls-key"):
        broker(relay_tls_cert=certs.client_cert)
    with pytest.raises(ValueError, match="--relay-tls-root-ca-file"):
        broker(relay_tls_root_ca_file=tmp_path / "missing.pem")
    with pytest.raises(ValueError, match="--relay-tls-cert/--relay-tls-key"):
        broker(relay_tls_cert=certs.ca, relay_tls_key=certs.client_key)
    with pytest.raises(ValueError, match="not both"):
        broker(relay_auth_secret="x", relay_auth_secret_file=tmp_path / "s")
    with pytest.raises(ValueError, match="--relay-auth-secret-file"):
        broker(relay_auth_secret_file=tmp_path / "missing")
    assert "x" not in repr(broker(relay_auth_secret="x").relay.security)
