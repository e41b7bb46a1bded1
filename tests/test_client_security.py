"""srtm.client against a broker that requires TLS or AUTH, over real sockets: the
publisher and the subscriber negotiate as NSQ clients do (IDENTIFY ``tls_v1``, the
upgrade, AUTH) through ``srtm.nsq_connection``; a wrong or missing secret, or a broker
without the TLS asked for, is a clear error at start, not a hang.

The certificates, the auth server and the in-process brokers are
``test_broker_tls_auth``'s fixtures.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import test_broker_tls_auth
from srtm.broker import Broker
from srtm.client import BrokerError, HandshakeError, Publisher, Received, Subscriber
from support import tcp_address as tcp
from test_broker_tls_auth import AuthServer, Certs, MakeBroker, tls_options

#: That module's fixtures, used here too (pytest finds them as this module's names).
certs = test_broker_tls_auth.certs
auth_server = test_broker_tls_auth.auth_server
make_broker = test_broker_tls_auth.make_broker

#: Only against hanging: every wait here ends long before.
HANG_S = 10


async def round_trip(broker: Broker, topic: str, **security: Any) -> tuple[list[bytes], list[bool]]:
    """Subscribe, publish three messages; what the subscriber received, and whether each
    of the broker's connections spoke TLS (seen before they close)."""
    got: list[bytes] = []
    all_in = asyncio.Event()

    def on_message(r: Received) -> None:
        got.append(r.message.body)
        if len(got) == 3:
            all_in.set()

    sub = Subscriber(topic, "ch", addresses=[tcp(broker)], on_message=on_message, **security)
    pub = Publisher(topic, "p1", address=tcp(broker), **security)
    try:
        await asyncio.wait_for(sub.start(), HANG_S)
        await asyncio.wait_for(pub.start(), HANG_S)
        for i in range(3):
            await asyncio.wait_for(await pub.publish(b"m%d" % i), HANG_S)
        await asyncio.wait_for(all_in.wait(), HANG_S)
        tls = [c.tls is not None and c.tls.established for c in broker.clients]
    finally:
        await pub.close()
        await sub.close()
    return got, tls


async def test_publish_and_subscribe_to_a_broker_that_requires_tls(
    make_broker: MakeBroker, certs: Certs
) -> None:
    broker = await make_broker(**tls_options(certs, tls_required="tcp-https"))
    got, tls = await round_trip(broker, "secure", tls=certs.client_context())
    assert got == [b"m0", b"m1", b"m2"]
    assert tls == [True, True]


async def test_tls_asked_of_a_broker_without_it_is_refused(
    make_broker: MakeBroker, certs: Certs
) -> None:
    broker = await make_broker()
    pub = Publisher("t", "p1", address=tcp(broker), tls=certs.client_context())
    with pytest.raises(HandshakeError, match="offers no TLS"):
        await asyncio.wait_for(pub.start(), HANG_S)
    await pub.close()
    assert "t" not in broker.topics


async def test_an_untrusted_broker_certificate_fails_the_start(
    make_broker: MakeBroker, certs: Certs
) -> None:
    broker = await make_broker(**tls_options(certs, tls_required="tcp-https"))
    sub = Subscriber("t", "ch", addresses=[tcp(broker)], tls=True)  # the system's CAs
    with pytest.raises(OSError, match="certificate verify failed"):
        await asyncio.wait_for(sub.start(), HANG_S)
    await sub.close()


async def test_publish_and_subscribe_to_a_broker_that_requires_auth(
    make_broker: MakeBroker, auth_server: AuthServer
) -> None:
    broker = await make_broker(auth_http_address=(auth_server.address,))
    got, tls = await round_trip(broker, "allowed_t", auth_secret="good")
    assert got == [b"m0", b"m1", b"m2"] and tls == [False, False]
    assert {q["secret"] for q in auth_server.queries} == {"good"}


async def test_auth_over_tls(
    make_broker: MakeBroker, certs: Certs, auth_server: AuthServer
) -> None:
    broker = await make_broker(
        **tls_options(certs, tls_required="tcp-https"), auth_http_address=(auth_server.address,)
    )
    got, tls = await round_trip(broker, "allowed_t", tls=certs.client_context(), auth_secret="good")
    assert got == [b"m0", b"m1", b"m2"] and tls == [True, True]
    assert {q["tls"] for q in auth_server.queries} == {"true"}


async def test_a_wrong_secret_is_a_broker_error_not_a_hang(
    make_broker: MakeBroker, auth_server: AuthServer
) -> None:
    broker = await make_broker(auth_http_address=(auth_server.address,))
    pub = Publisher("allowed_t", "p1", address=tcp(broker), auth_secret="wrong")
    with pytest.raises(BrokerError) as refused:
        await asyncio.wait_for(pub.start(), HANG_S)
    assert refused.value.code == "E_AUTH_FAILED"
    await pub.close()
    sub = Subscriber("allowed_t", "ch", addresses=[tcp(broker)], auth_secret="wrong")
    with pytest.raises(BrokerError) as refused:
        await asyncio.wait_for(sub.start(), HANG_S)
    assert refused.value.code == "E_AUTH_FAILED"
    await sub.close()
    assert "allowed_t" not in broker.topics


async def test_auth_required_without_a_secret_says_so(
    make_broker: MakeBroker, auth_server: AuthServer
) -> None:
    broker = await make_broker(auth_http_address=(auth_server.address,))
    pub = Publisher("allowed_t", "p1", address=tcp(broker))
    with pytest.raises(HandshakeError, match="requires AUTH and no auth_secret"):
        await asyncio.wait_for(pub.start(), HANG_S)
    await pub.close()
