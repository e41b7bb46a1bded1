"""``benchmarks/control_plane.py --quick`` end to end (a real etcd, controllers and
brokers it starts itself): it exits 0, prints a table per part with every row, and its
JSON carries every figure. No timing is asserted: the figures are the machine's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO

pytestmark = pytest.mark.slow

READ_ROWS = ("anchor", "1 controller /lookup", "1 controller /assign",
             "3 controllers /lookup", "3 controllers /assign")  # fmt: skip
PROJECTION = ("report_cpu_ms", "assign_cpu_ms", "reports_cores", "assign_cores",
              "total_cores", "max_reports_per_s", "max_assign_per_s", "burst_s")  # fmt: skip


def test_quick_run_prints_and_writes_every_row(tmp_path: Path) -> None:
    out = tmp_path / "cp.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "control_plane.py"), "--quick",
         "--brokers", "50", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(out.read_text())

    assert set(doc["plan_change"]) == {"SQLite", "etcd"}
    for store in doc["plan_change"].values():
        assert len(store["pushed_ms"]) == 1  # one run
        assert len(store["pushed_ms_all"]) == doc["config"]["topics"]
        assert all(a <= p for a, p in zip(store["answered_ms"], store["pushed_ms"], strict=True))
    # Every read row is measured: three controllers on one prefix too (a leader and two
    # standbys), each of them serving its share.
    assert set(doc["reads"]) == set(READ_ROWS) and doc["missing"] == {}
    for row in doc["reads"].values():
        assert row["per_s"][0] > 0 and row["failed"] == 0
    for row in ("3 controllers /lookup", "3 controllers /assign"):
        (split,) = doc["reads"][row]["cpu_s_by_server"]
        assert len(split) == 3 and all(cpu > 0 for cpu in split), split
    assert doc["reports"]["per_s"][0] > 0 and doc["reports"]["failed"] == 0
    (steady,) = doc["steady"]
    assert steady["brokers"] == 50 and steady["due"] > 0
    assert set(PROJECTION) <= set(doc["projection"])
    assert isinstance(doc["disturbed"], bool) and len(doc["reasons"]) >= doc["disturbed"]
    assert doc["windows"] and doc["revision"] and doc["machine"]

    text = run.stdout
    for title in ("1. Plan change", "2. Reads per second", "3. Broker reports",
                  "4a. 50 simulated brokers", "4b. Projection"):  # fmt: skip
        assert title in text, title
    for label in ("SQLite", "etcd", "trivial aiohttp endpoint", *READ_ROWS[1:],
                  "1,000 brokers reporting", "1,000,000 publishers"):  # fmt: skip
        assert label in text, label
    assert "disturbed" in text
