"""``srtm.etcd.Etcd`` against a real etcd member: keys, fenced transactions, leases that
expire or are revoked with their keys, a watch that resumes where it broke, and an endpoint
that does not answer passed over for the next."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from etcd_member import EtcdMember
from srtm.etcd import (
    Compare,
    Etcd,
    EtcdError,
    EventKind,
    Op,
    WatchEvent,
    check_prefix,
    endpoint_urls,
    prefix_end,
    txn_body,
)


def a_prefix() -> str:
    return f"/test-{uuid.uuid4().hex}/"


@pytest.fixture
def dead() -> Iterator[str]:
    """An address nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield f"http://127.0.0.1:{port}"


@pytest.fixture
async def client(etcd: EtcdMember) -> AsyncIterator[Etcd]:
    async with Etcd([etcd.url]) as c:
        yield c


def test_bodies_are_what_the_gateway_takes() -> None:
    body = txn_body(
        [Compare.created("/a", 0), Compare.value("/b", "x")],
        [Op.put("/a", "v", lease=7), Op.delete("/c")],
        [],
    )
    assert body["compare"] == [
        {"key": "L2E=", "target": "CREATE", "result": "EQUAL", "create_revision": "0"},
        {"key": "L2I=", "target": "VALUE", "result": "EQUAL", "value": "eA=="},
    ]
    assert body["success"] == [
        {"request_put": {"key": "L2E=", "value": "dg==", "lease": "7"}},
        {"request_delete_range": {"key": "L2M="}},
    ]
    assert prefix_end(b"/srtm/") == b"/srtm0"


def test_flags_are_checked_by_name() -> None:
    assert endpoint_urls("127.0.0.1:2379, h:1") == ["http://127.0.0.1:2379", "http://h:1"]
    with pytest.raises(ValueError, match="--etcd-endpoints: 'http://h:1'"):
        endpoint_urls("http://h:1")
    with pytest.raises(ValueError, match="--etcd-prefix"):
        check_prefix("/")
    with pytest.raises(ValueError, match="--x: 'nohost'"):
        endpoint_urls("nohost", flag="--x")


async def test_keys_and_a_fenced_transaction(client: Etcd) -> None:
    p = a_prefix()
    assert await client.get(p + "k") is None
    rev = await client.put(p + "k", "one")
    kv = await client.get(p + "k")
    assert kv is not None and kv.value == "one" and kv.create_revision == rev
    # Only the first of two campaigns for a key wins.
    first = await client.txn([Compare.created(p + "leader", 0)], [Op.put(p + "leader", "a")])
    second = await client.txn([Compare.created(p + "leader", 0)], [Op.put(p + "leader", "b")])
    assert first.succeeded and not second.succeeded
    assert (await client.get(p + "leader")).value == "a"  # type: ignore[union-attr]
    # A write fenced on the winner's epoch goes through; on another, it does not.
    fenced = await client.txn(
        [Compare.created(p + "leader", first.revision)], [Op.put(p + "x", "1")]
    )
    stale = await client.txn([Compare.created(p + "leader", rev)], [Op.put(p + "x", "2")])
    assert fenced.succeeded and not stale.succeeded
    assert [kv.value for kv in await client.range_prefix(p)] == ["one", "a", "1"]
    await client.delete(p + "k")
    assert await client.get(p + "k") is None
    assert await client.revision() >= fenced.revision


async def test_a_lease_kept_alive_holds_its_key_and_one_left_expires(client: Etcd) -> None:
    p = a_prefix()
    kept, left = await client.grant(1), await client.grant(1)
    await client.put(p + "kept", "x", lease=kept)
    await client.put(p + "left", "y", lease=left)
    assert (await client.get(p + "kept")).lease == kept  # type: ignore[union-attr]
    for _ in range(40):  # until etcd expires the one not renewed (about 1-2 s)
        assert await client.keepalive(kept) >= 1
        if await client.get(p + "left") is None:
            break
        await asyncio.sleep(0.1)
    assert await client.get(p + "left") is None
    assert await client.keepalive(left) == 0  # gone
    assert await client.get(p + "kept") is not None
    await client.revoke(kept)
    assert await client.get(p + "kept") is None
    await client.revoke(kept)  # already gone: not an error


async def test_a_watch_gives_every_change_and_opens_on_another_endpoint(
    etcd: EtcdMember, dead: str
) -> None:
    p = a_prefix()
    async with Etcd([etcd.url]) as writer, Etcd([dead, etcd.url], timeout_s=1) as watcher:
        start = await writer.put(p + "a", "1")
        seen: list[WatchEvent] = []

        async def follow() -> None:
            async for event in watcher.watch(p, start):
                seen.append(event)

        task = asyncio.create_task(follow())
        try:
            await writer.put(p + "b", "2")
            await writer.delete(p + "a")
            await writer.put("/elsewhere" + p, "not ours")
            for _ in range(100):
                if len(seen) >= 3:
                    break
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert [(e.kind, e.key, e.value) for e in seen] == [
        (EventKind.PUT, p + "a", "1"),
        (EventKind.PUT, p + "b", "2"),
        (EventKind.DELETE, p + "a", ""),
    ]
    assert seen[0].revision == start


async def test_a_dead_endpoint_is_passed_over(etcd: EtcdMember, dead: str) -> None:
    async with Etcd([dead, etcd.url], timeout_s=1) as c:
        p = a_prefix()
        await c.put(p + "k", "v")
        assert c.endpoints[0] == etcd.url  # keeps to the one that answered
        assert (await c.get(p + "k")).value == "v"  # type: ignore[union-attr]
    async with Etcd([dead], timeout_s=1) as c:
        with pytest.raises(EtcdError, match="no etcd endpoint answered /v3/kv/range"):
            await c.get("/k")


@pytest.fixture
def silent() -> Iterator[str]:
    """An endpoint that accepts connections (the kernel's backlog) and never answers, as
    an etcd member does with a keepalive while the cluster has no leader."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_a_keepalive_is_asked_of_every_endpoint_at_once(
    etcd: EtcdMember, silent: str, dead: str
) -> None:
    """One after another, a silent endpoint first would cost its whole timeout (30 s
    here) before the member that answers is asked."""
    async with Etcd([etcd.url]) as c:
        lease = await c.grant(30)
    async with Etcd([silent, dead, etcd.url], timeout_s=30) as c:
        async with asyncio.timeout(10):
            assert await c.keepalive(lease) >= 1
    async with Etcd([silent, dead], timeout_s=0.5) as c:
        with pytest.raises(EtcdError, match="no etcd endpoint answered /v3/lease/keepalive"):
            await c.keepalive(lease)


def test_an_endpoint_must_be_a_url() -> None:
    with pytest.raises(ValueError, match="not http://host:port"):
        Etcd(["127.0.0.1:2379"])
    with pytest.raises(ValueError, match="at least one"):
        Etcd([])
