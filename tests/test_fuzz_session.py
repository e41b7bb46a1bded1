"""The broker's TCP session under hostile clients (hypothesis), over real sockets on
127.0.0.1: random and mutated NSQ streams, split into many writes. After each example the
broker is alive (a fresh client's PUB/SUB round trip), logged no error, and every message
it acknowledged with OK is delivered to a subscriber: nothing is lost on the side.

What the broker saw is known without asking it: the same bytes fed to the same sans-I/O
parser give the same events (tests/test_fuzz_protocol.py checks that however they are
split), and the broker answers strictly in order, so each answer is matched to its command.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections import Counter, deque
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_fuzz import bodies, commands, cut_lists, mutated_streams, split, stream
from nsq_raw import RawClient
from srtm.broker import Broker, BrokerOptions
from srtm.protocol import (
    HEARTBEAT,
    MAGIC_V2,
    NON_FATAL,
    Auth,
    Cls,
    Command,
    Dpub,
    Fin,
    Frame,
    FrameReader,
    FrameType,
    Identify,
    Mpub,
    Nop,
    Parser,
    ProtocolError,
    Pub,
    Rdy,
    Req,
    Sub,
    Touch,
    is_ephemeral,
)
from support import eventually

T = TypeVar("T")

#: A few names, so examples meet each other's topics and channels (state accumulates).
TOPICS = st.sampled_from(["fz.a", "fz.b", "fz-c"])
CHANNELS = st.sampled_from(["c1", "c2"])
#: Mostly short delays (checked for delivery), sometimes an hour (held, not checked).
DEFERS = st.integers(0, 100) | st.just(3_600_000)
_PUBLISHES = st.one_of(
    st.builds(Pub, TOPICS, bodies),
    st.builds(Mpub, TOPICS, st.lists(bodies, min_size=1, max_size=6)),
    st.builds(Dpub, TOPICS, DEFERS, bodies),
)
#: Most sequences end at their first fatal error: publishes weigh more, so more of them
#: get acknowledged (and checked) before that.
SESSION_COMMANDS = st.sampled_from([_PUBLISHES] * 3 + [commands(TOPICS, CHANNELS, DEFERS)]).flatmap(
    lambda strategy: strategy
)
#: A deferred message later than this is not waited for.
CHECKED_DEFER_MS = 200
#: How long a check waits for what should come (generous: the machine may be busy).
PATIENCE_S = 5.0
#: Sessions that ended in a reset or not, messages checked (printed at the end, with -s).
tally: Counter[str] = Counter()


class BrokerThread:
    """An in-process broker on its own event loop in a thread; examples run coroutines on
    that loop. Every error the loop or the broker logs is kept in ``errors``."""

    def __init__(self, data_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._loop_error)
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._log = _ErrorLog(self.errors)
        # Small in-memory queues: messages overflow to disk and back too.
        self.options = BrokerOptions(tcp_port=0, http_port=0, data_dir=data_dir, mem_queue_size=4)
        self.broker = Broker(self.options)

    def start(self) -> None:
        logging.getLogger("srtm").addHandler(self._log)
        self._thread.start()
        self.run(self.broker.start())

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        try:
            self.run(self.broker.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
            self.loop.close()
            logging.getLogger("srtm").removeHandler(self._log)

    @property
    def address(self) -> tuple[str, int]:
        assert self.broker.tcp_address is not None
        return self.broker.tcp_address

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        self.errors.append(f"event loop: {context.get('message')}: {exc!r}")
        loop.default_exception_handler(context)


class _ErrorLog(logging.Handler):
    def __init__(self, errors: list[str]) -> None:
        super().__init__(logging.ERROR)
        self.errors = errors

    def emit(self, record: logging.LogRecord) -> None:
        self.errors.append(f"log {record.name}: {record.getMessage()} {record.exc_text or ''}")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerThread]:
    b = BrokerThread(tmp_path_factory.mktemp("fuzz-broker"))
    b.start()
    try:
        yield b
    finally:
        b.stop()
        print(f"fuzzed sessions: {dict(tally)}")


# -- matching answers to commands --------------------------------------------------------
#: Commands that always get one answer (a response or an error).
ANSWERED = (Identify, Auth, Sub, Pub, Mpub, Dpub, Cls)
#: Commands answered only when they fail, and the codes they can fail with.
SILENT: dict[type, frozenset[str]] = {
    Rdy: frozenset({"E_INVALID"}),
    Fin: frozenset({"E_INVALID", "E_FIN_FAILED"}),
    Req: frozenset({"E_INVALID", "E_REQ_FAILED"}),
    Touch: frozenset({"E_INVALID", "E_TOUCH_FAILED"}),
    Nop: frozenset(),
}


@dataclass(frozen=True, slots=True)
class Acked:
    topic: str
    body: bytes
    defer_ms: int = 0


@dataclass
class Outcome:
    acked: list[Acked] = field(default_factory=list)
    #: Every command that gets an answer has it, or a fatal error ended the session.
    complete: bool = True


def code_of(answer: Frame) -> str:
    return answer.data.split(b" ", 1)[0].decode(errors="replace")


def walk(events: list[Command | ProtocolError], frames: list[Frame]) -> Outcome:
    """Match the broker's answers to the events, in order; what got an OK is acknowledged.
    A non-fatal error code names its command, and nothing follows a fatal one, so an error
    of a silent command is never mistaken for another command's answer."""
    answers = deque(
        f for f in frames if f.kind in (FrameType.RESPONSE, FrameType.ERROR) and f.data != HEARTBEAT
    )
    out = Outcome()
    for ev in events:
        if isinstance(ev, ProtocolError):  # the parser's own: sent back as it is
            if not answers:
                return Outcome(out.acked, complete=False)
            a = answers.popleft()
            assert a.kind is FrameType.ERROR and code_of(a) == ev.code, (ev, a)
            if ev.fatal:
                return out
        elif isinstance(ev, ANSWERED):
            if not answers:
                return Outcome(out.acked, complete=False)
            a = answers.popleft()
            if a.kind is FrameType.ERROR:
                assert code_of(a) not in NON_FATAL, (ev, a)
                return out  # fatal: the broker ran nothing after it
            if isinstance(ev, Pub):
                assert a.data == b"OK", (ev, a)
                out.acked.append(Acked(ev.topic, ev.body))
            elif isinstance(ev, Mpub):
                assert a.data == b"OK", (ev, a)
                out.acked += [Acked(ev.topic, body) for body in ev.bodies]
            elif isinstance(ev, Dpub):
                assert a.data == b"OK", (ev, a)
                out.acked.append(Acked(ev.topic, ev.body, ev.defer_ms))
        elif answers and answers[0].kind is FrameType.ERROR:
            code = code_of(answers[0])
            if code not in SILENT[type(ev)]:
                continue  # succeeded; the error is a later command's
            answers.popleft()
            if code not in NON_FATAL:
                return out
    return out


# -- one example ---------------------------------------------------------------------------
async def hostile_session(broker: BrokerThread, pieces: list[bytes]) -> Outcome:
    """Send ``pieces`` in as many writes, read every answer, close; what was acknowledged."""
    events = Parser(broker.options.limits).feed(b"".join(pieces))
    reader, writer = await asyncio.open_connection(*broker.address)
    frames: list[Frame] = []
    decoder = FrameReader()
    try:
        with contextlib.suppress(ConnectionError):
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0)  # the broker reads each piece on its own
        reset = False
        while not walk(events, frames).complete:
            try:
                async with asyncio.timeout(PATIENCE_S):
                    data = await reader.read(1 << 16)
            except TimeoutError:
                raise AssertionError(f"no answer in {PATIENCE_S} s: {events} / {frames}") from None
            except ConnectionResetError:
                # After a fatal error the broker reads and discards for a second before it
                # closes (output.Output._linger); a session still sending after that gets a
                # reset, which drops what we had not read yet. Only after a fatal error
                # (the walk ends there), and what was lost counts as unacknowledged.
                reset = True
                break
            if not data:
                break
            frames += decoder.feed(data)
        outcome = walk(events, frames)
        # The broker closes only after a fatal error, which ends the walk: a clean close
        # without every answer means answers were dropped.
        assert outcome.complete or reset, f"closed without answering: {events} / {frames}"
        tally["reset" if reset else "closed or finished"] += 1
        return outcome
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


async def drained(broker: BrokerThread, acked: list[Acked]) -> None:
    """Every acknowledged message (but hour-long deferred ones) reaches a subscriber of
    its topic: every channel of the topic is drained until they all came."""
    want: dict[str, Counter[bytes]] = {}
    for a in acked:
        if a.defer_ms <= CHECKED_DEFER_MS and not is_ephemeral(a.topic):
            want.setdefault(a.topic, Counter())[a.body] += 1
    got: dict[str, Counter[bytes]] = {t: Counter() for t in want}
    clients: list[RawClient] = []

    async def drain(topic: str, channel: str) -> None:
        c = await RawClient.connect(*broker.address)
        clients.append(c)
        await c.send(Sub(topic, channel), Rdy(2500))
        assert await c.response() == b"OK"
        while True:
            msg = await c.message(timeout=PATIENCE_S * 10)
            got[topic][msg.body] += 1
            await c.send(Fin(msg.id))

    tally["acknowledged messages checked"] += sum(c.total() for c in want.values())
    tasks = []
    for topic in want:
        existing = broker.broker.topics.get(topic)
        assert existing is not None, f"topic {topic} with acknowledged messages is gone"
        names = [n for n in existing.channels if not is_ephemeral(n)] or ["fz-verify"]
        tasks += [asyncio.create_task(drain(topic, n)) for n in names]

    def missing() -> dict[str, Counter[bytes]]:
        for t in tasks:
            if t.done():
                t.result()  # a drain that failed: its error
        return {t: left for t in want if (left := +(want[t] - got[t]))}

    try:
        await eventually(
            missing,
            "every acknowledged message delivered",
            until=lambda left: not left,
            timeout=PATIENCE_S,
        )
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in clients:
            await c.close()


_alive = itertools.count()


async def still_alive(broker: BrokerThread) -> None:
    """A fresh client's PUB, a fresh subscriber gets it."""
    token = b"alive-%d" % next(_alive)
    sub = await RawClient.connect(*broker.address)
    pub = await RawClient.connect(*broker.address)
    try:
        await sub.send(Sub("fz-alive", "alive"), Rdy(10))
        assert await sub.response() == b"OK"
        await pub.send(Pub("fz-alive", token))
        assert await pub.response() == b"OK"
        while (msg := await sub.message(timeout=PATIENCE_S)).body != token:
            await sub.send(Fin(msg.id))
        await sub.send(Fin(msg.id))
    finally:
        await sub.close()
        await pub.close()


def check_example(broker: BrokerThread, data: bytes, cuts: list[int]) -> None:
    async def example() -> None:
        outcome = await hostile_session(broker, split(data, cuts))
        await drained(broker, outcome.acked)
        await still_alive(broker)

    broker.errors.clear()  # one example's errors, not an earlier one's
    broker.run(example())
    assert not broker.errors, broker.errors


# -- the fuzz tests ----------------------------------------------------------------------
#: About 20 ms an example: three times the profile's examples.
more = settings(max_examples=3 * settings.default.max_examples)


@pytest.mark.slow
@more
@given(st.lists(SESSION_COMMANDS, max_size=15), cut_lists)
def test_random_command_sequences(
    broker: BrokerThread, cmds: list[Command], cuts: list[int]
) -> None:
    check_example(broker, stream(cmds), cuts)


@pytest.mark.slow
@more
@given(mutated_streams(SESSION_COMMANDS, max_commands=12), cut_lists)
def test_mutated_command_streams(broker: BrokerThread, data: bytes, cuts: list[int]) -> None:
    check_example(broker, data, cuts)


@more
@given(st.binary(max_size=300), cut_lists)
def test_garbage_after_the_magic(broker: BrokerThread, data: bytes, cuts: list[int]) -> None:
    check_example(broker, MAGIC_V2 + data, cuts)


def test_deeply_nested_identify_gets_an_error_frame(broker: BrokerThread) -> None:
    """Finding 10 over a socket: an E_BAD_BODY frame and a close, no traceback logged."""
    body = b'{"client_id": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

    async def session() -> None:
        c = await RawClient.connect(*broker.address)
        try:
            await c.send(b"IDENTIFY\n" + len(body).to_bytes(4, "big") + body)
            assert (await c.error()).startswith("E_BAD_BODY")
            assert await c.closed()
        finally:
            await c.close()
        await still_alive(broker)

    broker.run(session())
    assert not broker.errors, broker.errors
