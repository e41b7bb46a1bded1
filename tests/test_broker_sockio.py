"""A connection's read with its kernel stamp and its send, in C where
``srtm.broker._sockio`` was built at install: the same results and errors as the Python
reference, through the socket object, on real loopback sockets."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srtm.broker import sockio

Recv = Callable[[socket.socket, int], tuple[bytes, int, int]]
Send = Callable[[socket.socket, sockio.Data], int]

#: Python's always, C's where it was built at install.
RECVS: list[Recv] = [sockio.recv_stamped_py]
SENDS: list[Send] = [sockio.send_py]
if sockio._c is not None:
    RECVS.append(sockio._c.recv_stamped)
    SENDS.append(sockio._c.send)


def test_the_c_calls_were_built() -> None:
    """Optional at install (no compiler: the socket object's calls are used); said here
    when missing, and the broker then uses the reference."""
    if sockio._c is None:
        pytest.skip("srtm.broker._sockio not built: the socket object's calls are used")
    assert sockio.recv_stamped is sockio._c.recv_stamped
    assert sockio.send is sockio._c.send


@contextlib.contextmanager
def stamped_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(the broker's end, non-blocking and stamping; the client's end), on 127.0.0.1."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    server.setblocking(False)
    server.setsockopt(socket.SOL_SOCKET, sockio.SO_TIMESTAMPNS, 1)
    client.settimeout(5)
    with server, client:
        yield server, client


@pytest.fixture(scope="module", autouse=True)
def stamps_on() -> Iterator[None]:
    """Linux turns receive stamps on for everyone a moment after the first socket asks
    (and off after the last one closes), so a packet just after may carry none, and a
    read then says 0: one socket keeps them on here, once a read of it was stamped."""
    with stamped_pair() as (server, client):
        deadline = time.monotonic() + 5
        while True:
            client.sendall(b"x")
            wait_readable(server, 1)
            if sockio.recv_stamped_py(server, 1)[1]:
                break
            assert time.monotonic() < deadline, "the kernel never stamped a read"
            time.sleep(0.01)
        yield


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    with stamped_pair() as both:
        yield both


def wait_readable(sock: socket.socket, size: int) -> None:
    """Until ``size`` bytes can be read (the kernel has them all)."""
    deadline = time.monotonic() + 5
    while len(sock.recv(size, socket.MSG_PEEK | socket.MSG_DONTWAIT)) < size:
        assert time.monotonic() < deadline, "the bytes never arrived"
        time.sleep(0.001)


@pytest.mark.parametrize("recv", RECVS)
def test_a_read_carries_the_kernels_stamp(
    recv: Recv, pair: tuple[socket.socket, socket.socket]
) -> None:
    server, client = pair
    before = time.time_ns()
    client.sendall(b"PUB t\n")
    wait_readable(server, 6)
    data, stamp, now = recv(server, 1024)
    assert data == b"PUB t\n"
    assert before <= stamp <= now <= time.time_ns()


@pytest.mark.parametrize("recv", RECVS)
def test_without_stamps_the_stamp_is_zero(
    recv: Recv, pair: tuple[socket.socket, socket.socket]
) -> None:
    server, client = pair
    server.setsockopt(socket.SOL_SOCKET, sockio.SO_TIMESTAMPNS, 0)
    client.sendall(b"NOP\n")
    wait_readable(server, 4)
    before = time.time_ns()
    data, stamp, now = recv(server, 1024)
    assert (data, stamp) == (b"NOP\n", 0)
    assert before <= now <= time.time_ns()


@pytest.mark.parametrize("recv", RECVS)
def test_a_read_takes_at_most_its_size_and_the_rest_stays(
    recv: Recv, pair: tuple[socket.socket, socket.socket]
) -> None:
    server, client = pair
    client.sendall(b"0123456789")
    wait_readable(server, 10)
    assert recv(server, 4)[0] == b"0123"
    assert recv(server, 0)[0] == b""
    assert recv(server, 100)[0] == b"456789"


@pytest.mark.parametrize("recv", RECVS)
def test_nothing_to_read_raises_at_once_even_on_a_blocking_socket(
    recv: Recv, pair: tuple[socket.socket, socket.socket]
) -> None:
    server, _ = pair
    server.setblocking(True)
    with pytest.raises(BlockingIOError):
        recv(server, 1024)


@pytest.mark.parametrize("recv", RECVS)
def test_the_end_of_the_stream_reads_empty(
    recv: Recv, pair: tuple[socket.socket, socket.socket]
) -> None:
    server, client = pair
    client.close()
    deadline = time.monotonic() + 5
    while True:
        try:
            data, _, _ = recv(server, 1024)
            break
        except BlockingIOError:
            assert time.monotonic() < deadline
            time.sleep(0.001)
    assert data == b""


@pytest.mark.parametrize("recv", RECVS)
def test_a_closed_socket_raises_oserror(
    recv: Recv, pair: tuple[socket.socket, socket.socket]
) -> None:
    server, _ = pair
    server.close()
    with pytest.raises(OSError) as err:
        recv(server, 1024)
    assert type(err.value) is OSError  # EBADF: what the broker closes the connection on


@pytest.mark.parametrize("recv", RECVS)
def test_a_negative_size_is_refused(recv: Recv, pair: tuple[socket.socket, socket.socket]) -> None:
    with pytest.raises(ValueError, match="negative"):
        recv(pair[0], -1)


@pytest.mark.parametrize("send", SENDS)
@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_a_send_sends_and_says_how_much(
    send: Send, kind: Callable[[bytes], sockio.Data], pair: tuple[socket.socket, socket.socket]
) -> None:
    server, client = pair
    assert send(server, kind(b"\x00\x00\x00\x06\x00\x00\x00\x00OK")) == 10
    assert client.recv(64) == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"


@pytest.mark.parametrize("send", SENDS)
def test_a_full_socket_sends_part_then_raises_at_once(
    send: Send, pair: tuple[socket.socket, socket.socket]
) -> None:
    server, client = pair
    server.setblocking(True)  # no wait all the same
    chunk = b"x" * 65536
    total = 0
    with pytest.raises(BlockingIOError):
        for _ in range(10_000):  # far more than any socket buffer
            sent = send(server, chunk)
            assert 0 < sent <= len(chunk)
            total += sent
    assert total > 0
    got = 0
    client.settimeout(5)
    while got < total:
        got += len(client.recv(1 << 20))
    assert got == total


@pytest.mark.parametrize("send", SENDS)
def test_a_send_to_a_closed_peer_raises_oserror(
    send: Send, pair: tuple[socket.socket, socket.socket]
) -> None:
    """A reset or a broken pipe: an error to close on, not SIGPIPE."""
    server, client = pair
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    client.close()  # linger 0: a reset
    deadline = time.monotonic() + 5
    with pytest.raises(OSError):
        while time.monotonic() < deadline:
            send(server, b"x" * 1024)
            time.sleep(0.001)


@pytest.mark.parametrize("send", SENDS)
def test_a_closed_socket_cannot_send(send: Send, pair: tuple[socket.socket, socket.socket]) -> None:
    server, _ = pair
    server.close()
    with pytest.raises(OSError) as err:
        send(server, b"OK")
    assert type(err.value) is OSError


@settings(max_examples=30, deadline=None)
@given(payload=st.binary(min_size=1, max_size=5000), size=st.integers(1, 2000))
def test_c_and_python_read_the_same_bytes(payload: bytes, size: int) -> None:
    """The same stream read in the same sizes by each: the same pieces, every one
    stamped."""
    pieces = []
    for recv in RECVS:
        with stamped_pair() as (server, client):
            client.sendall(payload)
            wait_readable(server, len(payload))
            got = []
            while sum(map(len, got)) < len(payload):
                data, stamp, _ = recv(server, size)
                assert stamp > 0
                got.append(data)
            pieces.append(got)
    assert all(p == pieces[0] for p in pieces)
    assert b"".join(pieces[0]) == payload
