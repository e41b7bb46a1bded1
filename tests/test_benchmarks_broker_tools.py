"""``benchmarks/broker.py``'s line on the load tools' CPU at once (³): per message
published, and how many messages the reader took per message published."""

from __future__ import annotations

from types import ModuleType


def test_each_broker_s_tools_cpu_and_reads_per_message(broker_bench: ModuleType) -> None:
    rows = broker_bench.make_rows()
    for run, (nsqd_cpu, srtm_cpu) in enumerate([(2.0, 4.0), (3.0, 5.0), (2.5, 6.0)]):
        for who, cpu, read in (("nsqd", nsqd_cpu, 600_000), ("srtm", srtm_cpu, 1_000_000)):
            rows["both_pub"].raw.append(
                {"broker": who, "run": run, "msgs": 1_000_000, "tools_cpu_s": cpu}
            )
            rows["both_sub"].raw.append({"broker": who, "run": run, "msgs": read})
    text = broker_bench.tools_at_once_text(rows)
    assert "nsqd 2.50 µs (2.0–3.0), 0.60 read per published" in text
    assert "srtm 5.00 µs (4.0–6.0), 1.00 read per published" in text


def test_no_line_without_the_at_once_runs(broker_bench: ModuleType) -> None:
    rows = broker_bench.make_rows()
    rows["both_pub"].raw.append({"broker": "srtm", "run": 0, "msgs": 10, "rate": 2.0})
    assert broker_bench.tools_at_once_text(rows) is None
