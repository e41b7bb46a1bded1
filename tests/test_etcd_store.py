"""``EtcdStore`` against a real etcd member (the contract it shares with ``SqliteStore``
is test_store's): a batch is one etcd revision, a controller's saved state loads back,
a dead or silent endpoint is passed over for the next, and failures say what failed."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from etcd_member import EtcdMember, free_ports
from srtm.control.etcd_store import EtcdStore, Fenced, StoreError
from srtm.control.state import Controller
from srtm.control.store import load_state
from srtm.control.store_writer import StoreWriter
from srtm.etcd import Compare, prefix_end
from srtm.placement import PublisherLoad, TopicSpec


def a_prefix() -> str:
    return f"/test-{uuid.uuid4().hex}"


@pytest.fixture
def silent() -> Iterator[str]:
    """An endpoint that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def not_etcd() -> Iterator[str]:
    """An HTTP server that answers every request with 404, as a wrong address would."""

    class NotFound(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_error(404, "no such path here")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_batch_of_many_keys_is_one_etcd_revision(etcd: EtcdMember) -> None:
    store = EtcdStore([etcd.url], a_prefix())
    start = store.revision
    store.write([(f"topic:{i:03d}", f'{{"n": {i}}}') for i in range(50)] + [("gone", None)])
    assert store.revision == start + 1
    entries = store.list("topic:")
    assert len(entries) == 50 and {e.revision for e in entries} == {start + 1}
    # The keys one transaction creates share their create_revision: listed by key.
    store.write([("k:b", "{}"), ("k:a", "{}")])
    assert [e.key for e in store.list("k:")] == ["k:a", "k:b"]


def test_keys_live_under_the_prefix_and_no_other(etcd: EtcdMember) -> None:
    mine, other = a_prefix(), a_prefix()
    EtcdStore([etcd.url], other).put("brokers", "[1]")
    store = EtcdStore([etcd.url], mine + "/")  # a trailing slash is the same prefix
    assert store.get("brokers") is None and store.list("") == []
    store.put("brokers", "[]")
    assert [e.key for e in EtcdStore([etcd.url], mine).list("")] == ["brokers"]
    assert EtcdStore([etcd.url], other).get("brokers").doc == "[1]"  # type: ignore[union-attr]


def controller() -> Controller:
    """Two brokers, an open topic and two closed ones (test_controller_store's state)."""
    ctrl = Controller()
    for b in ("a", "b"):
        ctrl.register(b, "127.0.0.1:9", f"127.0.0.1:{ord(b)}", 1e9, 0.0)
    spec = TopicSpec("O", (PublisherLoad("p0", 1.0),), 20, 5.0, 1e6)
    ctrl.create_topic(spec, "srtm", 0.0, open=True, join_secret="s" * 16)
    for i in range(2):
        ctrl.create_topic(TopicSpec(f"t{i}", spec.publishers, 20, 5.0, 100.0), "srtm", 0.0)
    return ctrl


async def test_load_state_restores_what_a_controller_wrote(etcd: EtcdMember) -> None:
    prefix = a_prefix()
    ctrl = controller()
    writer = StoreWriter(ctrl, EtcdStore([etcd.url], prefix))
    await writer.mark(topics=ctrl.topics, brokers=True)
    for i in range(5):
        ctrl.join_open("O", f"j{i}", 1.0 + i, None)
    ctrl.delete_topic("t0")
    ctrl.create_topic(TopicSpec("n", (PublisherLoad("p", 1.0),), 20, 5.0, 10.0), "srtm", 0.0)
    await writer.mark(topics=["O", "t0", "n"], buckets=["t1"])
    await writer.close()
    loaded = load_state(EtcdStore([etcd.url], prefix))
    assert loaded == ctrl.to_json()
    assert [t["name"] for t in loaded["topics"]] == ["O", "t1", "n"]
    again = Controller()
    again.restore(loaded, 0.0)
    assert again.to_json() == ctrl.to_json()
    assert load_state(EtcdStore([etcd.url], a_prefix())) is None  # nothing saved there


def test_the_next_endpoint_answers_when_one_is_dead_or_silent(
    etcd: EtcdMember, silent: str
) -> None:
    (port,) = free_ports(1)
    dead = f"http://127.0.0.1:{port}"  # nothing listens: connection refused
    store = EtcdStore([dead, silent, etcd.url], a_prefix(), timeout_s=1.0)
    started = time.monotonic()
    store.put("brokers", "[]")
    assert store.get("brokers") is not None
    # Kept to the endpoint that answered: the silent one's timeout is not waited again.
    assert time.monotonic() - started < 1.0


def test_no_endpoint_answering_is_a_clear_error(silent: str) -> None:
    (port,) = free_ports(1)
    dead = f"http://127.0.0.1:{port}"
    with pytest.raises(StoreError) as error:
        EtcdStore([dead, silent], timeout_s=0.3)
    message = str(error.value)
    assert "no etcd endpoint answered /v3/kv/range" in message
    assert f"{dead}: [Errno 111] Connection refused" in message
    assert f"{silent}: no answer in 0.3 s" in message


def test_an_endpoint_that_answers_with_an_error_is_not_passed_over(
    etcd: EtcdMember, not_etcd: str
) -> None:
    refused = f"etcd at {not_etcd} refused /v3/kv/range: HTTP Error 404"
    with pytest.raises(StoreError, match=refused):
        EtcdStore([not_etcd, etcd.url], a_prefix())


def test_a_closed_store_says_so(etcd: EtcdMember) -> None:
    store = EtcdStore([etcd.url], a_prefix())
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.get("brokers")


@pytest.mark.parametrize(
    ("endpoints", "message"),
    [([], "at least one endpoint"), (["127.0.0.1:2379"], "'127.0.0.1:2379' is not http://")],
)
def test_bad_endpoints_are_refused(endpoints: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EtcdStore(endpoints)


def test_prefix_end_is_the_first_key_after_the_prefix() -> None:
    assert prefix_end(b"/srtm/topic:") == b"/srtm/topic;"
    assert prefix_end(b"a\xff\xff") == b"b"
    assert prefix_end(b"\xff") == b"\0"  # every key


def test_a_fenced_write_goes_through_only_while_its_fence_holds(etcd: EtcdMember) -> None:
    prefix = a_prefix()
    store = EtcdStore([etcd.url], prefix)
    store.put("leader", "me")
    epoch = store.get("leader")
    assert epoch is not None
    store.fence = Compare.created(prefix + "/leader", epoch.revision)
    store.put("topic:a", "{}")
    store.delete("leader")  # deposed: the key another leader would create is gone
    store.fence = Compare.created(prefix + "/leader", epoch.revision)
    with pytest.raises(Fenced, match="no longer this leader's"):
        store.write([("topic:a", None), ("topic:b", "{}")])
    assert store.get("topic:a") is not None and store.get("topic:b") is None  # nothing applied


async def test_a_fenced_write_nobody_waits_for_leaves_no_unretrieved_error() -> None:
    """A caller cancelled while its write was on its way (a task ended as the leader
    stepped down): the write's error is logged once, not warned of again by asyncio."""

    class FencedStore:
        def get(self, key: str) -> str | None:
            return None

        def write(self, rows: object) -> None:
            raise Fenced("not written: /p/leader is no longer this leader's")

    loop = asyncio.get_running_loop()
    warned: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: warned.append(context))
    try:
        writer = StoreWriter(controller(), FencedStore())  # type: ignore[arg-type]
        waiter = writer.mark(brokers=True)
        waiter.cancel()
        while writer._next_write is not None or writer._writing is not None:
            await asyncio.sleep(0.001)
        del waiter
        gc.collect()
        await asyncio.sleep(0)
        await writer.close()
    finally:
        loop.set_exception_handler(None)
    assert not warned, warned
