"""Busy polling (``srtm.broker.busypoll``): each connection's rule, the loop's polling, and
the option."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from srtm.broker import Broker, BrokerOptions
from srtm.broker.busypoll import BusyPoll, PollWindow, cgroup_cpu_quota, usable_cpus
from srtm.broker.tcp import Client
from srtm.protocol import MAGIC_V2, Pub, encode_command
from support import MakeBroker, answered, loopback_pair

US = 1_000


def test_a_run_of_close_reads_polls_for_the_window_after_each() -> None:
    """A connection's reads 20 µs apart (a synchronous publisher's): after the first few,
    which show that its reads come close, each read polls for the window."""
    window = PollWindow(30 * US)
    polled = [window.read(1_000_000 + k * 20 * US) for k in range(12)]
    assert not polled[0]
    assert polled[-4:] == [True] * 4
    assert polled.index(True) <= 8
    assert window.until_ns == 1_000_000 + 11 * 20 * US + 30 * US


def test_polling_follows_the_share_of_close_reads() -> None:
    """One far read among close ones does not end it; mostly far reads do."""
    window = PollWindow(30 * US)
    t = 0
    for _ in range(20):
        t += 20 * US
        window.read(t)
    t += 1_000 * US
    assert window.read(t)  # most reads still come close
    for _ in range(6):
        t += 100 * US
        window.read(t)
    t += 100 * US
    assert not window.read(t)


def test_reads_spread_apart_never_poll() -> None:
    """A sensor's reads 500 µs or 10 ms apart, where one read in four chances to come
    within the window: no CPU spent polling."""
    for spacing in (500 * US, 10_000 * US):
        window = PollWindow(30 * US)
        t = 0
        for k in range(400):
            t += spacing if k % 4 else 25 * US
            assert not window.read(t)
        assert window.until_ns == 0


def test_many_connections_close_together_only_in_sum_never_poll() -> None:
    """200 sensors at 100/s each: the broker reads one every 50 µs, every 5th only 20 µs
    after the one before; each sensor's own reads are 10 ms apart. The rule is each
    connection's, so nothing polls (a rule over all reads would, at a window of 100 µs)."""
    poll = BusyPoll(100 * US, cpus=2)
    windows = [poll.window() for _ in range(200)]
    t = 0
    for k in range(2_000):
        t += 20 * US if k % 5 == 0 else 50 * US
        poll.read(windows[k % 200], t)
    assert poll.until_ns == 0
    assert not any(w.until_ns for w in windows)


async def test_one_synchronous_connection_among_sensors_polls() -> None:
    """The same sensors, and one connection reading every 40 µs (a publisher waiting for
    each OK): its reads start polling, for the window after each of them."""
    poll = BusyPoll(100 * US, cpus=2)
    windows = [poll.window() for _ in range(200)]
    fast = poll.window()
    polled = []
    t = 0
    for k in range(400):
        t += 20 * US
        poll.read(windows[k % 200], t)
        t += 20 * US
        poll.read(fast, t)
        polled.append(poll.until_ns)
    assert polled[-1] == t + 100 * US
    assert not any(w.until_ns for w in windows)


def test_a_window_of_zero_never_polls() -> None:
    window = PollWindow(0)
    assert not window.read(5)
    assert not window.read(5)


def test_a_single_usable_cpu_never_polls() -> None:
    assert not BusyPoll(30 * US, cpus=1).enabled
    assert BusyPoll(30 * US, cpus=2).enabled


class CountingPoll(BusyPoll):
    turns = 0

    def _turn(self) -> None:
        self.turns += 1
        super()._turn()


async def test_the_loop_polls_for_the_window_then_sleeps_again() -> None:
    """While polling, the poll's callback runs again every loop turn (the loop's wait is
    held at zero); once the window has passed it stops by itself."""
    poll = CountingPoll(200_000 * US, cpus=2)
    window = poll.window()
    now = time.time_ns()
    for k in range(10, -1, -1):
        poll.read(window, now - k * 1_000 * US)
    end = poll.until_ns
    while poll.turns <= 20 and time.time_ns() < end:
        await asyncio.sleep(0.001)
    assert poll.turns > 20
    await asyncio.sleep(max(0, end - time.time_ns()) / 1e9 + 0.01)  # past the window
    turns = poll.turns
    await asyncio.sleep(0.01)
    assert poll.turns == turns


async def test_a_read_far_from_the_last_does_not_poll() -> None:
    poll = CountingPoll(20_000 * US, cpus=2)
    window = poll.window()
    now = time.time_ns()
    for k in range(10, -1, -1):
        poll.read(window, now - k * 50_000 * US)
    await asyncio.sleep(0.005)
    assert poll.turns == 0


async def _publish(broker: Broker, clients: int, pubs: int, gap_s: float) -> None:
    """``clients`` connections, driven here, each sending ``pubs`` PUBs and waiting for
    each OK, ``gap_s`` apart."""
    pairs = [loopback_pair() for _ in range(clients)]
    driven = []
    for _, server in pairs:
        client = Client(broker, server, True)
        broker.clients.add(client)
        asyncio.get_running_loop().remove_reader(server.fileno())  # read here, at once
        driven.append(client)
    for (peer, _), client in zip(pairs, driven, strict=True):
        peer.sendall(MAGIC_V2)
        client.intake.on_readable()
    for _ in range(pubs):
        for (peer, _), client in zip(pairs, driven, strict=True):
            peer.sendall(encode_command(Pub("t", b"reading")))
            client.intake.on_readable()
            assert answered(peer) == [b"OK"]
        if gap_s:
            await asyncio.sleep(gap_s)
    for (peer, server), client in zip(pairs, driven, strict=True):
        client.close()
        peer.close()
        server.close()


async def test_a_publisher_waiting_for_each_ok_starts_polling(make_broker: MakeBroker) -> None:
    """Through the broker's read path: a connection's PUBs, each sent once the OK before
    it came, are read close together (within a window of 10 s), so they start polling."""
    broker = await make_broker()
    broker.channel("t", "c")
    broker.busy_poll = poll = BusyPoll(10_000_000 * US, cpus=2)
    await _publish(broker, clients=1, pubs=10, gap_s=0)
    assert poll.until_ns > time.time_ns()
    poll.until_ns = 0  # the polling callback stops at its next turn


async def test_many_connections_reading_once_each_never_poll(make_broker: MakeBroker) -> None:
    """Forty connections read one after another, each once after its magic: close in sum
    (within the window), but no connection's own reads mostly are, so nothing polls;
    nor does one connection whose PUBs come further apart than the window."""
    broker = await make_broker()
    broker.channel("t", "c")
    broker.busy_poll = poll = BusyPoll(1_000_000 * US, cpus=2)
    await _publish(broker, clients=40, pubs=1, gap_s=0)
    assert poll.until_ns == 0
    broker.busy_poll = poll = BusyPoll(2 * 1_000 * US, cpus=2)
    await _publish(broker, clients=1, pubs=10, gap_s=0.005)
    assert poll.until_ns == 0


@pytest.mark.parametrize("us", [0, 30])
async def test_the_option_sets_the_window(tmp_path: Path, us: int) -> None:
    broker = Broker(BrokerOptions(data_dir=tmp_path, busy_poll_us=us))
    too_few = usable_cpus() < 2
    assert broker.busy_poll.window_ns == (0 if too_few else us * US)


def _cgroup(tmp_path: Path, line: str, files: dict[str, str]) -> float | None:
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "cgroup"
    proc.write_text(line + "\n")
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text)
    return cgroup_cpu_quota(proc, tmp_path / "fs")


def test_a_cgroup_v2_quota_is_read_in_cpus(tmp_path: Path) -> None:
    files = {"kubepods/pod1/cpu.max": "150000 100000\n"}
    assert _cgroup(tmp_path, "0::/kubepods/pod1", files) == 1.5
    assert _cgroup(tmp_path, "0::/", {"cpu.max": "max 100000\n"}) is None


def test_a_cgroup_v1_quota_is_read_in_cpus(tmp_path: Path) -> None:
    files = {"cpu,cpuacct/docker/x/cpu.cfs_quota_us": "50000\n",
             "cpu,cpuacct/docker/x/cpu.cfs_period_us": "100000\n"}  # fmt: skip
    lines = "4:memory:/docker/x\n3:cpu,cpuacct:/docker/x"
    assert _cgroup(tmp_path, lines, files) == 0.5
    none = {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}
    assert _cgroup(tmp_path / "v1none", "1:cpu:/", none) is None


def test_no_readable_cgroup_is_no_quota(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(tmp_path / "absent", tmp_path) is None
    assert _cgroup(tmp_path, "0::/gone", {}) is None


def test_a_quota_under_two_cpus_never_polls() -> None:
    assert not BusyPoll(30 * US, cpus=1.5).enabled
