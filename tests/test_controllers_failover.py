"""Brokers and clients given several controllers (``srtm.controllers``): the URL list and
the next-URL rule without I/O; then real controllers on 127.0.0.1, one of them dead,
stopped mid-run, a standby answering 307 (a small aiohttp server in the test, pointing at
a real controller) or 503 NO_LEADER; and NSQ 1.3.0's nsq_tail given two lookupd addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from srtm.client import Publisher, Received, Subscriber
from srtm.controllers import (
    MAX_HOPS,
    Controllers,
    ControllerSet,
    ControllerUnreachable,
    Walk,
    controller_urls,
    origin,
)
from srtm.launch import BrokerProcess, ServerProcess, new_token, start_broker, start_controller
from support import eventually, nsq_bin

A, B, C = "http://127.0.0.1:4161", "http://127.0.0.1:4162", "https://ctl.example:443"


# -- the URL list, without I/O ------------------------------------------------------------
def test_one_url_and_several_are_read_alike() -> None:
    assert controller_urls(A) == (A,)
    assert controller_urls(f"{A}/, {B} ,{C}") == (A, B, C)
    assert controller_urls([A, B]) == (A, B)
    assert controller_urls(f"{A},{A}/") == (A,)  # a repeat is kept once


@pytest.mark.parametrize(
    ("given", "bad"),
    [
        ("", "no controller URL"),
        (f"{A},,{B}", "empty URL"),
        (f"{A},ftp://h:1", "'ftp://h:1'"),
        ("127.0.0.1:4161", "'127.0.0.1:4161'"),  # HOST:PORT is not a URL
        ("http://", "'http://'"),
        ("http://h:port", "'http://h:port' has a bad port"),
        (f"{B}/?x=1", "query"),
    ],
)
def test_a_bad_url_is_refused_naming_the_flag_and_the_part(given: str, bad: str) -> None:
    with pytest.raises(ValueError, match=r"^--controller: ") as err:
        controller_urls(given, "--controller")
    assert bad in str(err.value)


def test_the_origin_of_a_location() -> None:
    assert origin("http://10.0.0.2:4161/brokers?x=1", A) == "http://10.0.0.2:4161"
    assert origin("/brokers", A) == A  # relative: the same controller
    assert origin("ftp://x/", A) is None


def test_the_current_controller_is_tried_first_then_the_rest_in_order() -> None:
    known = ControllerSet([A, B, C])
    assert known.order() == [A, B, C]
    assert known.settle(B) is True
    assert known.order() == [B, A, C]
    assert known.settle(B) is False  # no switch: nothing to log
    leader = "http://10.0.0.9:4161"
    assert known.settle(leader) is True  # learned from a redirect: it joins the list
    assert known.order() == [leader, A, B, C]
    # Only the newest learned address is kept: redirects cannot grow the list.
    other = "http://10.0.0.10:4161"
    assert known.settle(other) is True and known.order() == [other, A, B, C]


def test_a_walk_passes_over_what_does_not_answer_and_ends() -> None:
    walk = Walk([A, B, C])
    assert [walk.next(), walk.next(), walk.next(), walk.next()] == [A, B, C, None]


def test_a_walk_follows_a_redirect_to_its_origin_and_never_back() -> None:
    walk = Walk([A, B])
    assert walk.next() == A
    assert walk.redirected(f"{C}/brokers", A) == C  # the leader, not in the list
    assert walk.redirected(f"{A}/brokers", C) == B  # back to A: a loop, so the next one
    assert walk.redirected(f"{C}/brokers", B) is None  # tried already, and nothing left


def test_a_walk_follows_at_most_max_hops_redirects() -> None:
    leaders = [f"http://10.0.0.{i}:1" for i in range(MAX_HOPS + 1)]
    walk = Walk([A])
    assert walk.next() == A
    for to in leaders[:MAX_HOPS]:
        assert walk.redirected(to, A) == to
    assert walk.redirected(leaders[MAX_HOPS], A) is None


# -- servers in the test: a standby naming the leader, one knowing none --------------------
def free_url() -> str:
    """A URL nobody listens on (the port was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@dataclass
class FakeController:
    """An aiohttp server answering every request alike; counts them."""

    answer: Callable[[web.Request], web.Response]
    hits: int = 0
    url: str = ""
    runner: web.AppRunner | None = field(default=None, repr=False)

    async def start(self) -> None:
        async def handle(request: web.Request) -> web.Response:
            self.hits += 1
            return self.answer(request)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def redirect_to(leader: str) -> Callable[[web.Request], web.Response]:
    """A standby: every request 307 to the leader, same path and query."""
    return lambda request: web.Response(
        status=307, headers={"Location": f"{leader}{request.path_qs}"}
    )


def no_leader(request: web.Request) -> web.Response:
    return web.json_response({"message": "NO_LEADER"}, status=503)


@contextlib.asynccontextmanager
async def fakes(
    *answers: Callable[[web.Request], web.Response],
) -> AsyncIterator[list[FakeController]]:
    servers = [FakeController(a) for a in answers]
    try:
        for s in servers:
            await s.start()
        yield servers
    finally:
        for s in servers:
            await s.stop()


async def test_redirects_in_a_loop_and_503_everywhere_end_the_walk() -> None:
    four = (no_leader, no_leader, no_leader, no_leader)
    async with fakes(*four) as (n1, n2, s1, s2), aiohttp.ClientSession() as session:
        # Two standbys naming each other: each is tried once, then nothing answered.
        s1.answer, s2.answer = redirect_to(s2.url), redirect_to(s1.url)
        dead = free_url()
        with pytest.raises(ControllerUnreachable, match=dead.split("//")[1]):
            await Controllers([dead, s1.url]).request(session, "GET", "/info")
        assert (s1.hits, s2.hits) == (1, 1)
        # No leader anywhere: the last 503 comes back, it says why.
        answer = await Controllers([n1.url, n2.url]).request(session, "POST", "/brokers")
        assert (answer.status, answer.json()) == (503, {"message": "NO_LEADER"})
        assert (n1.hits, n2.hits) == (1, 1)


async def test_odd_lookup_answers_do_not_end_the_subscriber_s_refreshes(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "b", ["--insecure-loopback"], token="")
    try:
        assert b.request("/pub?topic=odd", "POST", b"hello") == b"OK"
        good = {"producers": [{"broadcast_address": b.tcp[0], "tcp_port": b.tcp[1]}]}
        odd: list[web.Response] = [
            web.Response(text="<html>a proxy's page</html>"),
            web.json_response({"producers": [{"address": "x"}]}),
            web.json_response({"producers": "none"}),
            web.json_response([1, 2]),
            web.json_response({"message": "INTERNAL_ERROR"}, status=500),
        ]

        def answer(request: web.Request) -> web.Response:
            return odd.pop(0) if odd else web.json_response(good)

        async with fakes(answer) as (ctl,):
            got: list[bytes] = []
            sub = Subscriber("odd", "c", controller=ctl.url, refresh_s=0.02,
                             on_message=lambda r: got.append(r.message.body))  # fmt: skip
            await sub.start()  # its first refresh meets the first odd answer
            try:
                await eventually(lambda: got, "the message, once the answers make sense")
                assert got == [b"hello"] and ctl.hits >= 6
            finally:
                await sub.close()
    finally:
        b.stop()


# -- real controllers and brokers ----------------------------------------------------------
@pytest.fixture
def token() -> str:
    return new_token()


@pytest.fixture
def controllers(tmp_path: Path, token: str) -> Iterator[list[ServerProcess]]:
    """Two independent controllers (each its own SQLite file), one cluster token."""
    started: list[ServerProcess] = []
    try:
        for name in ("c1", "c2"):
            started.append(
                start_controller(tmp_path / f"{name}.db", ["--broker-timeout-s", "3"], token=token)
            )
        yield started
    finally:
        for c in started:
            c.stop()


def url_of(server: ServerProcess) -> str:
    return f"http://{server.http_address}"


@contextlib.asynccontextmanager
async def broker(
    tmp_path: Path, token: str, controller: str
) -> AsyncIterator[tuple[BrokerProcess, Path]]:
    """A broker reporting every 0.1 s to ``controller`` (URL[,URL...]); its log in a file.
    Started and stopped on a thread: the test's loop serves the fake controllers meanwhile."""
    log = tmp_path / "broker.log"
    args = ["--broker-id", "1", "--controller", controller, "--report-interval-s", "0.1"]
    with log.open("w") as err:
        b = await asyncio.to_thread(start_broker, tmp_path / "b1", args, stderr=err, token=token)
    try:
        yield b, log
    finally:
        try:
            await asyncio.to_thread(b.stop)
        except subprocess.TimeoutExpired:
            tail = log.read_text()[-4000:]
            raise AssertionError(f"the broker did not stop; its log:\n{tail}") from None


def listed(c: ServerProcess) -> list[int]:
    """The TCP ports of the brokers ``c`` lists up (nsqlookupd's /nodes); [] if it is away."""
    try:
        return [p["tcp_port"] for p in c.json("/nodes")["producers"]]
    except OSError:
        return []


def switches(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "now talking to controller" in line]


def topic_doc(name: str, publishers: list[str]) -> bytes:
    doc = {"name": name, "slo_p99_ms": 200.0, "burst": 50,
           "publishers": [{"id": p, "rate": 50} for p in publishers]}  # fmt: skip
    return json.dumps(doc).encode()


def test_the_broker_option_refuses_a_bad_controller_list(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "srtm", "broker", "--insecure-loopback",
         "--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0",
         "--data-dir", str(tmp_path), "--controller", f"{A},{B}/x?y=1"],
        capture_output=True, text=True, timeout=60, check=False,
        env={k: v for k, v in os.environ.items() if k != "SRTM_TOKEN"},
    )  # fmt: skip
    assert out.returncode != 0
    assert "--controller" in out.stderr and f"{B}/x?y=1" in out.stderr


@pytest.mark.slow
async def test_a_dead_first_controller_is_passed_over(
    tmp_path: Path, token: str, controllers: list[ServerProcess]
) -> None:
    c1 = controllers[0]
    dead = free_url()
    async with broker(tmp_path, token, f"{dead},{url_of(c1)}") as (b, log):
        await eventually(lambda: listed(c1) == [b.tcp[1]], "the broker registered via the 2nd URL")
        c1.post("/topics", topic_doc("fo", ["p1"]))
        got: list[int] = []

        def record(r: Received) -> None:
            assert r.header is not None
            got.append(r.header.seq)

        sub = Subscriber("fo", "all", controller=[dead, url_of(c1)], on_message=record,
                         refresh_s=0.1)  # fmt: skip
        pub = Publisher("fo", "p1", controller=f"{dead},{url_of(c1)}")
        await pub.start()
        await sub.start()
        try:
            assert pub.address == b.tcp_address
            for _ in range(20):
                await pub.publish()
            await pub.flush()
            await eventually(
                lambda: sorted(got), "all 20 received", until=lambda s: s == list(range(20))
            )
            assert pub.controllers is not None and pub.controllers.current == url_of(c1)
        finally:
            await pub.close()
            await sub.close()
        assert len(switches(log)) == 1  # from the dead one, once


@pytest.mark.slow
async def test_a_controller_stopped_mid_run_is_left_for_the_other(
    tmp_path: Path, token: str, controllers: list[ServerProcess]
) -> None:
    c1, c2 = controllers
    both = f"{url_of(c1)},{url_of(c2)}"
    async with broker(tmp_path, token, both) as (b, log):
        await eventually(lambda: listed(c1) == [b.tcp[1]], "the broker registered with c1")
        assert listed(c2) == []
        c1.post("/topics", topic_doc("mid", ["p1", "p2"]))
        got: list[int] = []
        sub = Subscriber("mid", "all", controller=both, refresh_s=0.1,
                         on_message=lambda r: got.append(r.message.attempts))  # fmt: skip
        p1 = Publisher("mid", "p1", controller=both)
        await p1.start()
        await sub.start()
        try:
            for _ in range(10):
                await p1.publish()
            await p1.flush()
            await eventually(lambda: len(got), "10 received", until=lambda n: n >= 10)
            c1.stop()
            # The broker's next report finds c1 gone, and c2 not knowing it: it registers.
            await eventually(lambda: listed(c2) == [b.tcp[1]], "the broker moved to c2")
            assert len(switches(log)) == 1
            c2.post("/topics", topic_doc("mid", ["p1", "p2"]))
            # The subscriber's refreshes go on against c2 (c1 refuses the connection).
            await eventually(
                lambda: sub.controllers is not None and sub.controllers.current == url_of(c2),
                "the subscriber asks c2",
            )
            for _ in range(10):
                await p1.publish()
            # A publisher that starts now gets /assign from c2.
            p2 = Publisher("mid", "p2", controller=both)
            await p2.start()
            try:
                assert p2.address == b.tcp_address
                assert p2.controllers is not None and p2.controllers.current == url_of(c2)
                for _ in range(10):
                    await p2.publish()
                await p2.flush()
            finally:
                await p2.close()
            await p1.flush()
            await eventually(lambda: len(got), "all 30 received", until=lambda n: n >= 30)
        finally:
            await p1.close()
            await sub.close()


@pytest.mark.slow
async def test_a_standby_s_307_leads_to_the_leader_which_is_remembered(
    tmp_path: Path, token: str, controllers: list[ServerProcess]
) -> None:
    leader = controllers[0]
    async with (
        fakes(no_leader, redirect_to(url_of(leader))) as (nobody, standby),
        broker(tmp_path, token, f"{nobody.url},{standby.url}") as (b, log),
    ):
        await eventually(lambda: listed(leader) == [b.tcp[1]], "registered through the 307")
        assert standby.hits >= 1 and nobody.hits >= 1
        seen = (nobody.hits, standby.hits)
        # A new topic makes the broker report at once: the report reaches the leader
        # (its /lookup names the broker) without passing the other two again.
        assert b.request("/pub?topic=later", "POST", b"x") == b"OK"

        def lookup() -> bool:
            try:
                return bool(leader.json("/lookup?topic=later")["producers"])
            except OSError:
                return False

        await eventually(lookup, "the report of the new topic at the leader")
        assert (nobody.hits, standby.hits) == seen
        assert [url_of(leader) in s for s in switches(log)] == [True]
        # Clients alike: /assign through the standby, the leader remembered.
        leader.post("/topics", topic_doc("st", ["p1"]))
        pub = Publisher("st", "p1", controller=[nobody.url, standby.url])
        await pub.start()
        try:
            assert pub.controllers is not None
            assert pub.controllers.current == url_of(leader)
            assert pub.address == b.tcp_address
            await (await pub.publish())
        finally:
            await pub.close()


# -- NSQ's own tool given two lookupd addresses --------------------------------------------
@pytest.mark.slow
async def test_nsq_tail_keeps_working_when_one_lookupd_dies(
    tmp_path: Path, token: str, controllers: list[ServerProcess]
) -> None:
    """Two nsq_tails given both controllers as lookupds: one reading a topic before c1
    dies and after; one whose topic appears only after c1 died, found through c2."""
    c1, c2 = controllers
    async with broker(tmp_path, token, f"{url_of(c1)},{url_of(c2)}") as (b, _):
        await eventually(lambda: listed(c1) == [b.tcp[1]], "the broker registered with c1")
        for i in range(5):
            b.request("/pub?topic=tail", "POST", f"m{i}".encode())
        await eventually(lambda: has_topic(c1, "tail"), "c1 knows the topic")
        early, late = nsq_tail(c1, c2, "tail"), nsq_tail(c1, c2, "late")
        try:
            got_early: list[str] = []
            got_late: list[str] = []
            pumps = [lines_of(early, got_early), lines_of(late, got_late)]
            await eventually(lambda: len(got_early), "the first 5", until=lambda n: n >= 5)
            c1.stop()  # a lookupd both tools know dies
            await eventually(lambda: listed(c2) == [b.tcp[1]], "the broker moved to c2")
            for i in range(5, 10):
                b.request("/pub?topic=tail", "POST", f"m{i}".encode())
                b.request("/pub?topic=late", "POST", f"m{i}".encode())
            codes = await asyncio.gather(
                asyncio.to_thread(early.wait, 60), asyncio.to_thread(late.wait, 60)
            )
            assert codes == [0, 0]
            for pump in pumps:  # nsq_tail may exit before its last lines are read
                await asyncio.to_thread(pump.join, 30)
            assert sorted(got_early) == [f"m{i}" for i in range(10)]
            assert sorted(got_late) == [f"m{i}" for i in range(5, 10)]
        finally:
            for tail in (early, late):
                if tail.poll() is None:
                    tail.kill()
                    tail.wait()


def has_topic(c: ServerProcess, topic: str) -> bool:
    try:
        return bool(c.json(f"/lookup?topic={topic}")["producers"])
    except OSError:
        return False


def nsq_tail(c1: ServerProcess, c2: ServerProcess, topic: str) -> subprocess.Popen[str]:
    """nsq_tail of 5 + 5 (or 5) messages, polling both lookupds every 200 ms."""
    n = "10" if topic == "tail" else "5"
    return subprocess.Popen(
        [str(nsq_bin() / "nsq_tail"), "--topic", topic, "--channel", "x", "-n", n,
         "--lookupd-http-address", c1.http_address,
         "--lookupd-http-address", c2.http_address,
         "--consumer-opt", "lookupd_poll_interval,200ms"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip


def lines_of(proc: subprocess.Popen[str], into: list[str]) -> threading.Thread:
    """Collect ``proc``'s stdout lines into ``into`` on a thread, which ends at its EOF.

    The process may exit before the thread has read what it wrote last: join the thread
    before reading ``into``."""

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            into.append(line.rstrip("\n"))

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread
