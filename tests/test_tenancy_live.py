"""The live multi-tenant scenario at minimal size: topics created, one deleted while its
messages are still queued, sensors joining one by one, on capacity-limited brokers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from srtm.experiments.tenancy import live as tenancy_live
from srtm.experiments.tenancy import report as tenancy_report
from srtm.experiments.tenancy.scenario import TenancyScenario, Tenant


@pytest.mark.slow
def test_a_small_multi_tenant_run_accounts_for_every_message(tmp_path: Path) -> None:
    sc = TenancyScenario(
        "multi-tenant",
        2,
        600.0,
        (
            Tenant("a", 80.0, 20, 10.0, "poisson", 1, 0, 0.0),
            # Five seconds of life: its sensors send once its plan is in place, which
            # took over the three it had, once, with the suite's other worker busy.
            Tenant("b", 80.0, 20, 10.0, "periodic", 1, 5, 1.0, delete_s=6.0),
            Tenant("c", 80.0, 3, 10.0, "poisson", 1, 0, 2.0, join_every_s=1.0),
        ),
        capacity=2_000.0,
    )
    s = tenancy_live.run(tmp_path, "srtm", sc=sc)
    assert s["refused"] == []
    by_name = {t["topic"]: t for t in s["topics"]}
    for t in s["topics"]:
        acc = t["accounting"]
        assert acc["published"] > 0 and acc["published"] == acc["delivered"], t["topic"]
        assert acc["lost"] == 0 and acc["unexpected"] == 0, t["topic"]
        assert math.isfinite(t["p99_ms"]) and t["brokers"] >= 1
    assert by_name["b"]["deleted"] and by_name["c"]["joining"]
    samples = [b for x in s["ledger"] for b in x["brokers"]]
    assert len(s["ledger"]) >= 5 and all(b["allocated"] <= b["mcap"] + 1e-6 for b in samples)
    assert max(b["allocated"] for b in samples) > 0
    by_check = {c["check"]: c["ok"] for c in s["checks"]}
    assert by_check["published = delivered, per topic"]
    assert by_check["no broker's allocated exceeds its mcap at any sample"]
    png = tenancy_report.plot(s, tmp_path)
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "p99" in tenancy_report.write_html(s, png, tmp_path).read_text()
