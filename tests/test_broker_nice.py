"""``--nice``: the broker's priority among the programs sharing its cores, set at start,
refused with a reason where the system does not allow it, and never spinning before a
release on the only CPU it shares with them."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from srtm.broker.options import BrokerOptions
from srtm.broker.release import READ_GUARD_NS, Releaser
from srtm.broker.stats import BrokerStats
from srtm.broker.timer import set_nice
from srtm.launch import start_broker

#: Run what follows without CAP_SYS_NICE (root keeps every other capability).
NO_CAP_SYS_NICE = ["setpriv", "--bounding-set", "-sys_nice", "--inh-caps", "-sys_nice"]

root_only = pytest.mark.skipif(
    os.geteuid() != 0, reason="dropping CAP_SYS_NICE for one child needs root (as in CI)"
)


def _releaser(options: BrokerOptions, cpus: float) -> Releaser:
    def ready(_: object) -> None:
        pass

    return Releaser(options, {}, BrokerStats(), ready, ready, cpus=cpus)


def test_the_broker_runs_at_the_nice_it_was_given(tmp_path: Path) -> None:
    args = ["--nice", "-3", "--insecure-loopback"]
    # its own session, as a service's: the session's group is its own (autogroup)
    broker = start_broker(tmp_path / "data", args, token="", timeout=60, new_session=True)
    try:
        # the event loop's thread (the process's first): what wakes for releases and reads
        assert os.getpriority(os.PRIO_PROCESS, broker.proc.pid) == -3
        autogroup = Path(f"/proc/{broker.proc.pid}/autogroup")
        if autogroup.exists():  # else the kernel shares CPUs between tasks, not sessions
            assert autogroup.read_text().split()[-2:] == ["nice", "-3"]
    finally:
        assert broker.stop() == 0


def test_the_session_s_nice_is_set_where_the_kernel_groups_by_session(tmp_path: Path) -> None:
    nice = os.getpriority(os.PRIO_PROCESS, 0)  # this thread's, unchanged
    autogroup = tmp_path / "autogroup"
    autogroup.write_text("")
    set_nice(nice, autogroup)
    assert autogroup.read_text() == f"{nice}\n"
    set_nice(nice, tmp_path / "none")  # no autogroup (a kernel without it): only the thread's


def test_a_session_s_nice_that_cannot_be_set_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    set_nice(nice, tmp_path)  # a directory: not writable as a file (as a read-only /proc)
    assert f"--nice {nice}: the session's nice value is not set" in caplog.text


def _refused(tmp_path: Path, nice: int) -> subprocess.CompletedProcess[str]:
    cmd = [*NO_CAP_SYS_NICE, sys.executable, "-m", "srtm", "broker", "--nice", str(nice),
           "--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0",
           "--insecure-loopback", "--data-dir", str(tmp_path / "data")]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "SRTM_TOKEN"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


@root_only
def test_a_nice_the_system_refuses_stops_the_start_and_says_what_it_needs(
    tmp_path: Path,
) -> None:
    assert resource.getrlimit(resource.RLIMIT_NICE)[0] < 24  # the default 0: nothing below 0
    done = _refused(tmp_path, -4)
    assert done.returncode != 0
    said = " ".join(done.stderr.split())  # the error may wrap
    assert "--nice -4: Permission denied" in said
    assert "CAP_SYS_NICE or an RLIMIT_NICE of at least 24" in said, said
    assert not (tmp_path / "data").exists()  # nothing started


@pytest.mark.parametrize(
    ("nice", "cpus", "spins"),
    [
        (0, 1.0, True),  # as before: at the same priority the spin only shares the CPU
        (-5, 2.0, True),  # another CPU is left to the others
        (-5, 1.0, False),  # above them on their only CPU: it would starve them
        (-5, 1.5, False),  # a cgroup quota under two CPUs counts as one
    ],
)
def test_a_raised_broker_does_not_spin_on_the_only_cpu_it_shares(
    nice: int, cpus: float, spins: bool
) -> None:
    rel = _releaser(BrokerOptions(nice=nice), cpus)
    assert rel.margin.spin_ns == (BrokerOptions().release_spin_ns if spins else 0)
    assert rel.read_guard_ns == (READ_GUARD_NS if spins else 0)  # reads never wait then
