"""``benchmarks/broker.py``'s CPU reading (⁸): a process's CPU-time clock, which counts the
threads that already ended, where the live threads' schedstat would not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

# A thread runs 0.2 s of its own CPU time and ends; the process then waits on stdin.
_CHILD = """
import sys, threading, time
def spin():
    while time.thread_time() < 0.2:
        pass
t = threading.Thread(target=spin)
t.start()
t.join()
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="Linux only")
def test_cpu_counts_a_thread_that_ended(broker_bench: ModuleType) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        live = sum(
            int((task / "schedstat").read_text().split()[0])
            for task in Path(f"/proc/{proc.pid}/task").iterdir()
        )
        cpu = broker_bench.process_cpu_ns(proc.pid)
        assert cpu >= 200_000_000 > live  # the spinning thread is gone from the tasks
        assert broker_bench.cpu_s([proc.pid]) == pytest.approx(cpu / 1e9, abs=0.05)
    finally:
        proc.communicate("")
    with pytest.raises(OSError):
        broker_bench.process_cpu_ns(proc.pid)
    assert broker_bench.cpu_s([proc.pid]) == 0.0
