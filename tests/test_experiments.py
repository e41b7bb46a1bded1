"""The workload emulator against a real broker, scenarios, the in-process analysis, and a
5-second mini-demo end to end on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from srtm.broker import Broker, BrokerOptions
from srtm.experiments import analysis, scenarios
from srtm.pipeline.quantiles import rank
from srtm.protocol import header
from srtm.workload import PublisherSpec, build
from srtm.workload.emulator import Emulator, routes_of
from support import eventually


@pytest.fixture
async def two_brokers(tmp_path: Path) -> AsyncIterator[list[Broker]]:
    brokers = []
    for i in (1, 2):
        opts = BrokerOptions(
            tcp_port=0, http_port=0, broker_id=i, data_dir=tmp_path / f"b{i}",
            trace_dir=tmp_path / "traces", run="emu",
        )  # fmt: skip
        b = Broker(opts)
        await b.start()
        brokers.append(b)
    yield brokers
    for b in brokers:
        await b.stop()


def address(b: Broker) -> str:
    assert b.tcp_address is not None
    return "{}:{}".format(*b.tcp_address)


# -- the emulator -------------------------------------------------------------------------
async def test_emulator_sends_the_schedule_with_headers_and_follows_routes(
    two_brokers: list[Broker], tmp_path: Path
) -> None:
    """Forty publishers (groups, batches) on one connection per broker: every message is
    acknowledged, attributed to its publisher by the broker, numbered 0..n-1 per publisher,
    and a re-route moves later messages to the other broker."""
    b1, b2 = two_brokers
    specs = [
        PublisherSpec(f"p{i}", 50.0, "periodic", 1 + i // 10 % 3, f"g{i // 10}") for i in range(40)
    ]
    sched = build(specs, 1.0, spread_s=0.002, seed=3)
    emu = Emulator(sched, "emu", {p.id: address(b1) for p in specs}, message_size=90)
    task = asyncio.ensure_future(emu.run())
    await eventually(
        lambda: emu.report.sent, "a quarter sent", until=lambda n: n >= sched.messages // 4
    )
    emu.route({p.id: address(b2) for p in specs[:20]} | {p.id: address(b1) for p in specs[20:]})
    rep = await task
    await emu.close()
    assert rep.sent == rep.acknowledged == sched.messages and rep.failed == 0
    assert rep.per_publisher == {
        p.id: int(sched.batch[sched.publisher == i].sum()) for i, p in enumerate(specs)
    }
    late = rep.lateness_summary()
    assert (rep.lateness_ns >= 0).all() and late["max_us"] >= late["p99_us"] >= late["p50_us"]
    assert b1.topics["emu"].message_count + b2.topics["emu"].message_count == sched.messages
    assert 0 < b2.topics["emu"].message_count < sched.messages / 2
    # The broker attributes each message to its header's publisher (a channel drains it).
    for b in two_brokers:
        ch = b.channel("emu", "c")
        bodies = [m.body for m in ch.queue.memory()]
        assert all(header.decode(x) is not None for x in bodies)
        assert {m.publisher for m in ch.queue.memory()} <= {p.id for p in specs}


async def test_emulator_stops_at_a_time_and_counts_unrouted(two_brokers: list[Broker]) -> None:
    b1, _ = two_brokers
    specs = [PublisherSpec(f"p{i}", 100.0, "periodic") for i in range(4)]
    sched = build(specs, 2.0, seed=1)
    emu = Emulator(sched, "stop", {"p0": address(b1), "p1": address(b1)})
    start = time.time_ns()
    emu.stop_at(start + 500_000_000)
    rep = await emu.run(start)
    await emu.close()
    assert rep.acknowledged == rep.sent == b1.topics["stop"].message_count
    assert 80 <= rep.sent <= 120  # two publishers, 100/s each, for 0.5 s
    assert 80 <= rep.unrouted <= 120
    with pytest.raises(ValueError, match="not in the schedule"):
        emu.route({"nobody": address(b1)})
    with pytest.raises(ValueError, match="message_size"):
        Emulator(sched, "t", {}, message_size=10)


async def test_emulator_connects_again_after_a_failed_connect() -> None:
    """A broker down when the emulator first sends (a killed one, before the plan moves
    its publishers): that send fails, and a later send to the same address, now up,
    connects and is acknowledged (a failed connect attempt used to be kept for good)."""
    import socket
    import struct

    from srtm.protocol import FrameType
    from srtm.protocol.frames import frame

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    where = f"127.0.0.1:{sock.getsockname()[1]}"
    specs = [PublisherSpec("p", 10.0, "periodic")]
    emu = Emulator(build(specs, 1.0, seed=1), "t", {"p": where})
    body = bytes(header.SIZE)

    async def fake_broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)  # magic
        while await reader.readline():  # IDENTIFY or MPUB t, then [size][body]
            (size,) = struct.unpack(">I", await reader.readexactly(4))
            await reader.readexactly(size)
            writer.write(frame(FrameType.RESPONSE, b"OK"))
        writer.close()

    server = None
    try:
        emu._publish(where, [body])
        await asyncio.wait_for(asyncio.gather(*emu._pending, return_exceptions=True), 10)
        assert emu.report.failed == 1 and emu.report.acknowledged == 0
        sock.listen()
        server = await asyncio.start_server(fake_broker, sock=sock)
        emu._publish(where, [body, body])
        await asyncio.wait_for(asyncio.gather(*emu._pending, return_exceptions=True), 10)
        assert emu.report.acknowledged == 2 and emu.report.failed == 1
    finally:
        await emu.close()
        if server is not None:
            server.close()
            await server.wait_closed()
        sock.close()


async def test_the_emulator_follows_a_plan_version_once_it_is_in_place() -> None:
    """``follow_plan`` moves publishers to a new version only once the controller says
    its shares are in place (a broker before its share would hold what they send)."""
    from aiohttp import web

    from srtm.workload.emulator import follow_plan

    def plan(version: int, to: str, in_place: bool) -> dict[str, Any]:
        return {"version": version, "in_place": in_place,
                "brokers": [{"tcp_address": to, "publishers": ["p"]}]}  # fmt: skip

    docs = [plan(1, "127.0.0.1:1", True), plan(2, "127.0.0.1:2", False)]
    served = 0

    async def get_plan(request: web.Request) -> web.Response:
        nonlocal served
        served += 1
        return web.json_response(docs[0])

    app = web.Application()
    app.router.add_get("/plan", get_plan)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    emu = Emulator(build([PublisherSpec("p", 10.0, "periodic")], 1.0, seed=1), "t", {})
    follower = asyncio.create_task(follow_plan(emu, f"http://127.0.0.1:{port}", "t", 0.01))
    try:
        await eventually(lambda: emu._route, "version 1 followed",
                         until=lambda r: r == ["127.0.0.1:1"])  # fmt: skip
        docs.pop(0)  # version 2, not in place
        seen = served
        await eventually(lambda: served, "version 2 read twice", until=lambda n: n >= seen + 2)
        assert emu._route == ["127.0.0.1:1"]
        docs[0]["in_place"] = True
        await eventually(lambda: emu._route, "version 2 followed",
                         until=lambda r: r == ["127.0.0.1:2"])  # fmt: skip
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await emu.close()
        await runner.cleanup()


async def test_emulator_skips_what_it_could_only_send_late(two_brokers: list[Broker]) -> None:
    """Started 200 ms behind its schedule with max_late_s=0.01, the emulator skips (and
    counts) the overdue events instead of sending them as one burst."""
    b1, _ = two_brokers
    specs = [PublisherSpec("p", 100.0, "periodic")]
    sched = build(specs, 0.5, seed=2)
    emu = Emulator(sched, "late", {"p": address(b1)}, max_late_s=0.01)
    rep = await emu.run(time.time_ns() - 200_000_000)
    await emu.close()
    # The events due in the first 190 ms are skipped; any later one only if the machine
    # stalled the emulator (so no upper bound): what was sent was sent in time.
    assert rep.skipped_late >= 17
    lateness = rep.lateness_ns[rep.lateness_ns >= 0]
    assert len(lateness) == rep.sent and lateness.max() <= 10_000_000
    assert rep.sent + rep.skipped_late == sched.messages == 50
    assert rep.per_publisher["p"] == rep.sent == b1.topics["late"].message_count


def test_routes_come_from_a_plan() -> None:
    plan = {"brokers": [{"tcp_address": "a:1", "publishers": ["x", "y"]},
                        {"tcp_address": "b:2", "publishers": ["z"]}]}  # fmt: skip
    assert routes_of(plan) == {"x": "a:1", "y": "a:1", "z": "b:2"}


# -- scenarios ----------------------------------------------------------------------------
def test_the_shipped_scenarios_load() -> None:
    assert "correlated-sensors" in scenarios.available()
    sc = scenarios.load("correlated-sensors")
    specs = sc.specs()
    assert len(specs) == 300 and sc.rate == 3_000
    groups = {p.group for p in specs}
    assert len(groups) == 10
    assert sc.mcap <= sc.capacity and sc.fit is not None
    poisson = scenarios.load("poisson-sensors")
    assert {p.process for p in poisson.specs()} == {"poisson"}
    assert {p.group for p in poisson.specs()} == {None} and poisson.rate == 3_000
    assert set(scenarios.available()) == {
        "correlated-sensors",
        "correlated-sensors-1ms",
        "poisson-sensors",
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"brokers": 0}, "brokers must be > 0"),
        ({"mcap": 5000.0}, "cannot exceed capacity"),
        ({"topic": "bad topic"}, "not a valid NSQ name"),
        ({"colour": "red"}, "unknown keys"),
        ({"publishers": []}, "publishers must be"),
        ({"preload": [{"broker": 9, "rate": 10.0}]}, "preload broker 9"),
        ({"profile_trace": "yesterday"}, "profile_trace must be one of other-draw, run"),
    ],
)
def test_bad_scenarios_are_named(change: dict[str, object], message: str) -> None:
    import tomllib
    from importlib import resources

    text = (resources.files(scenarios) / "correlated-sensors.toml").read_text()
    doc = tomllib.loads(text) | change
    with pytest.raises(ValueError, match=message):
        scenarios.parse(doc)
    with pytest.raises(ValueError, match="no scenario"):
        scenarios.load("no-such-scenario")


def test_a_periodic_topic_profiled_on_its_run_fits_the_run() -> None:
    """Periodic sensors keep their phases: profiled on another draw (other phases), Table
    I's topic of groups of 5 gets a bucket too shallow for what the run sends; profiled
    on the run (``profile_trace = "run"``, as Table I live does), 99 % of the run's
    messages wait no token, as on a deployment that profiles its own sensors."""
    import dataclasses

    from srtm.analysis import token_delays
    from srtm.experiments.figures.table1_live import FitMode, scenario_for
    from srtm.experiments.scenarios.live import profile
    from srtm.experiments.scenarios.scenario import ProfileTrace

    own = scenario_for(5, FitMode.measured, None)
    assert own.profile_trace is ProfileTrace.run
    drawn = dataclasses.replace(own, profile_trace=ProfileTrace.other_draw)
    run = build(own.specs(), 30.0, spread_s=own.spread_ms / 1e3, seed=own.seed).arrivals_ns()

    def waiting(sc: scenarios.Scenario) -> float:
        rate, burst = profile(sc)
        return float(np.mean(token_delays(run, rate, burst) > 0))

    assert waiting(own) <= 0.01 < waiting(drawn)


# -- analysis -----------------------------------------------------------------------------
def test_analysis_joins_sides_and_accounts_for_every_message() -> None:
    n = 1_000
    rng = np.random.default_rng(0)
    send = np.arange(n, dtype=np.int64) * 1_000_000
    arrive = send + 100_000
    token = rng.integers(0, 5_000_000, n)
    release = arrive + token
    dispatch = release + 200_000
    recv = dispatch + 50_000
    ids = [f"{i:016x}" for i in range(n)]
    brokers = ["1" if i % 2 else "2" for i in range(n)]
    broker_rows = pd.DataFrame({"broker": brokers, "msg_id": ids, "t_arrive_ns": arrive,
                                "t_release_ns": release, "t_dispatch_ns": dispatch})  # fmt: skip
    pubs = [f"p{i % 10}" for i in range(n)]
    seqs = [i // 10 for i in range(n)]
    sub_rows = pd.DataFrame({"broker": brokers, "msg_id": ids, "publisher": pubs, "seq": seqs,
                             "t_send_ns": send, "t_recv_ns": recv})  # fmt: skip
    window = analysis.MeasuredWindow(int(send[100]), int(send[900]))
    s = analysis.summarize(broker_rows, sub_rows, window, slo_ms=3.0)
    e2e = (recv - send)[100:900]
    assert s["messages"] == s["joined"] == 800
    assert s["e2e_ms"]["p99"] == pytest.approx(np.percentile(e2e, 99) / 1e6)
    assert s["token_wait_ms"]["p50"] == pytest.approx(np.percentile(token[100:900], 50) / 1e6)
    assert s["slo_violations"] == pytest.approx(float((e2e > 3e6).mean()))
    # Each hop on its own: publisher to broker, in the broker, broker to subscriber.
    assert s["to_broker_ms"]["p50"] == pytest.approx(0.1)
    assert s["processing_ms"]["p99"] == pytest.approx(0.2)
    assert s["to_subscriber_ms"]["p99"] == pytest.approx(0.05)
    assert s["transit_ms"]["p50"] == pytest.approx(0.15)
    assert s["brokers_used"] == 2 and sum(b["messages"] for b in s["per_broker"].values()) == 800
    tail = e2e >= np.percentile(e2e, 99)
    assert s["token_share_tail"] == pytest.approx(token[100:900][tail].sum() / e2e[tail].sum())
    published = {f"p{i}": 100 for i in range(10)}
    assert analysis.accounting(sub_rows, published) == {
        "published": 1_000, "delivered": 1_000, "lost": 0, "unexpected": 0, "duplicates": 0,
    }  # fmt: skip
    missing = pd.concat([sub_rows.iloc[5:], sub_rows.iloc[[10]]])  # 5 lost, 1 twice
    acc = analysis.accounting(missing, published)
    assert (acc["lost"], acc["duplicates"], acc["delivered"]) == (5, 1, 995)


def test_a_groups_bursts_are_its_sends_close_together() -> None:
    """Two groups of 3 firing every 100 ms (sends 10 µs apart, each received 1 ms after it
    was sent) and one ungrouped publisher: 2 × 10 bursts in the window, each sent over
    20 µs and all received 1.02 ms after its first send."""
    rows = []
    for g, offset in (("a", 0), ("b", 50_000_000)):
        for k in range(10):
            for m in range(3):
                send = offset + k * 100_000_000 + m * 10_000
                rows.append((f"{g}{m}", g, k, send, send + 1_000_000))
    rows += [("solo", None, k, k * 1_000_000, k * 1_000_000 + 5) for k in range(50)]
    sub = pd.DataFrame(rows, columns=["publisher", "group", "seq", "t_send_ns", "t_recv_ns"])
    out = analysis.group_bursts(sub, analysis.MeasuredWindow(0, 1_000_000_000))
    assert out["bursts"] == 20 and out["size_p50"] == 3
    assert out["send_spread_ms"]["p99"] == pytest.approx(0.02)
    assert out["done_ms"]["p50"] == pytest.approx(1.02)
    late = analysis.group_bursts(sub, analysis.MeasuredWindow(960_000_000, 2_000_000_000))
    assert late == {"bursts": 0}  # nothing grouped sent in that window


# -- the demo -----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)  # four runs and Spark: minutes on a busy machine (300 s was hit)
def test_mini_demo_end_to_end(tmp_path: Path) -> None:
    """`srtm demo` for 5 s per run: LB and SRTM with the publishers in block and in
    shuffled order, every run complete with every message delivered, one JSON comparison
    per order and the report with its plots written, and nothing left running."""
    out = tmp_path / "demo"
    env = os.environ | {"COLUMNS": "160"}
    proc = subprocess.run(
        [sys.executable, "-m", "srtm", "demo", "--duration", "5", "--warmup", "2",
         "--out", str(out), "--json", "--analysis", "spark"],
        capture_output=True, text=True, timeout=540, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    docs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [d["publisher_order"] for d in docs] == ["block", "shuffled"]
    doc, shuffled = docs
    # Block order keeps LB's groups whole on its brokers; shuffled gives each a slice of
    # most; SRTM gives every broker a slice of every group in both.
    groups = {(d["publisher_order"], p): r["groups_per_broker"]
              for d in docs for p, r in d["policies"].items()}  # fmt: skip
    assert max(groups["block", "lb"].values()) <= 3
    assert min(groups["shuffled", "lb"].values()) >= 7
    assert set(groups["block", "srtm"].values()) == set(groups["shuffled", "srtm"].values()) == {10}
    for d in docs:
        assert (d["srtm_gain"] is None) == d["disturbed"]
    assert set(shuffled["policies"]) == {"lb", "srtm"}
    for policy, row in shuffled["policies"].items():
        assert row["published"] == row["delivered"] > 0, policy
    assert (out / "correlated-sensors-lb-shuffled.json").exists()
    assert "publishers in shuffled order" in proc.stdout
    assert set(doc["policies"]) == {"lb", "srtm"}
    for policy, row in doc["policies"].items():
        assert 0 < row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"], policy
        assert row["published"] == row["delivered"] > 0, policy
        assert 1 <= row["brokers_used"] <= 6
    assert doc["policies"]["lb"]["brokers_used"] == 6  # LB uses every broker
    # The Spark pipeline computed the figures, over the same window as the in-process
    # analysis: its nearest-rank quantile is within one order statistic of the
    # interpolated one, among the same messages (a 2 % bound failed on a sparse tail).
    assert doc["analysis"] == "spark"
    for policy, row in doc["policies"].items():
        summary = json.loads((out / f"correlated-sensors-{policy}.json").read_text())
        assert summary["analysis"]["engine"] == "spark"
        local = summary["in_process"]
        assert row["brokers_used"] == local["brokers_used"]
        assert set(summary["per_broker"]) == set(local["per_broker"])
        lat = np.sort(_measured_e2e_ns(out / "traces", summary["run"]))
        for q, at in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            k = rank(at, lat.size)
            low, high = lat[max(k - 1, 0)] / 1e6, lat[min(k + 1, lat.size - 1)] / 1e6
            assert low <= row[f"{q}_ms"] <= high, (q, low, row[f"{q}_ms"], high)
            assert low <= local["e2e_ms"][q] <= high, (q, low, local["e2e_ms"][q], high)
        assert summary["token_share_tail"] == pytest.approx(local["token_share_tail"], abs=0.05)
    # Each run checked itself over its window; a disturbed one draws no conclusion.
    for policy, row in doc["policies"].items():
        checked = json.loads((out / f"correlated-sensors-{policy}.json").read_text())["validity"]
        assert row["validity"] == checked["status"] in ("valid", "disturbed"), policy
        assert checked["figures"]["due"] > 0 and checked["figures"]["cpus"] >= 1
        assert (checked["status"] == "disturbed") == bool(row["disturbed_by"])
    assert doc["disturbed"] == any(r["validity"] == "disturbed" for r in doc["policies"].values())
    assert (doc["conclusion"] is None) == doc["disturbed"]
    # The output holds both orders' conclusions: "No conclusion" if either was disturbed.
    assert ("No conclusion" in proc.stdout) == any(d["disturbed"] for d in docs)
    for name in ("report.html", "latency_cdf.png", "broker_p99.png"):
        assert (out / name).stat().st_size > 0, name
    assert "published" in proc.stdout and "delivered" in proc.stdout
    rows = pq.read_table(out / "traces" / "subscriber" / "run=correlated-sensors-srtm")
    assert rows.num_rows == doc["policies"]["srtm"]["delivered"]
    assert (out / "traces" / "runs" / "correlated-sensors-lb.json").exists()
    left = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True)
    assert left.stdout == "", f"left running: {left.stdout}"
    _validate_the_demo_runs(out, doc, tmp_path / "validation")


def _measured_e2e_ns(traces: Path, run: str) -> np.ndarray[Any, Any]:
    """End-to-end latencies (ns) of the messages a run measured, as both analyses take
    them: sent within its window, each (broker, message id) once."""
    meta = json.loads((traces / "runs" / f"{run}.json").read_text())
    window = analysis.MeasuredWindow(meta["window_start_ns"], meta["window_end_ns"])
    _, sub = analysis.load(traces, run)
    m = sub[(sub["t_send_ns"] >= window.start_ns) & (sub["t_send_ns"] < window.end_ns)]
    m = m.drop_duplicates(["broker", "msg_id"])
    lat: np.ndarray[Any, Any] = (m["t_recv_ns"] - m["t_send_ns"]).to_numpy(np.int64)
    return lat


def _group_of(pattern: str) -> str:
    return subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout


@pytest.mark.slow
def test_an_interrupted_demo_leaves_nothing_running(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the demo's process group, as a terminal sends it) while the
    brokers run: the demo exits with 130 and every server it started is gone."""
    import signal

    out = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "srtm", "demo", "--duration", "20", "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:

        def brokers() -> str:
            assert proc.poll() is None, "the demo exited before its brokers started"
            return _group_of(f"[s]rtm broker.*{out}")

        eventually.blocking(
            brokers, "the demo's six brokers", until=lambda ps: "broker-6" in ps, timeout=60
        )
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert _group_of(f"[-]-out {out}|[s]rtm.*{out}") == ""


def _validate_the_demo_runs(demo: Path, doc: dict[str, Any], out: Path) -> None:
    """`srtm experiment validate` predicts each of the demo's runs with the simulator."""
    from typer.testing import CliRunner

    from srtm.cli import app

    args = ["experiment", "validate", str(demo), "--model", "paper", "--out", str(out), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout.strip().splitlines()[-1])
    runs = {e["policy"]: e for e in data["runs"]}
    assert set(runs) == {"lb", "srtm"}
    for policy, entry in runs.items():
        assert entry["measured_p99_ms"] == doc["policies"][policy]["p99_ms"]
        assert entry["replay_p99_ms"] > 0 and entry["live_brokers"] >= 1
    assert (out / "validation.png").stat().st_size > 0
    nothing = CliRunner().invoke(app, ["experiment", "validate", str(out), "--model", "paper"])
    assert nothing.exit_code == 2 and "no finished run" in " ".join(nothing.output.split())


def _summary(run: str) -> dict[str, object]:
    return {"run": run, "policy": "lb", "e2e_ms": {"p99": 1.0}, "analysis": dict(analysis.ENGINE)}


def test_analysis_falls_back_in_process_only_when_asked_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """auto keeps the in-process figures when Spark cannot run; spark fails instead."""
    import typer

    from srtm.experiments import experiment, spark_analysis

    def no_java(*_: object) -> None:
        raise RuntimeError("Java gateway process exited before sending its port number")

    monkeypatch.setattr(spark_analysis, "analyse", no_java)
    summaries = [_summary("r")]
    scenarios.analyse(summaries, tmp_path, experiment.Analysis.auto, None)  # type: ignore[arg-type]
    assert summaries == [_summary("r")]
    assert "Spark is not available here" in " ".join(capsys.readouterr().err.split())
    with pytest.raises(typer.Exit) as stop:
        scenarios.analyse(summaries, tmp_path, experiment.Analysis.spark, None)  # type: ignore[arg-type]
    assert stop.value.exit_code == 1
    assert "Java gateway" in " ".join(capsys.readouterr().err.split())


@pytest.mark.slow
async def test_preload_returns_once_the_controller_sees_the_brokers_load(tmp_path: Path) -> None:
    import tomllib
    from importlib import resources

    import aiohttp

    from srtm.experiments.scenarios import live
    from srtm.launch import start_cluster

    text = (resources.files(scenarios) / "correlated-sensors.toml").read_text()
    doc = tomllib.loads(text) | {"brokers": 2, "preload": [{"broker": 2, "rate": 300.0}]}
    sc = scenarios.parse(doc)
    cluster = await asyncio.to_thread(start_cluster, tmp_path, 2)
    try:
        async with aiohttp.ClientSession() as http:
            task = await live._start_preload(sc, cluster, http)
            assert task is not None
            try:
                async with http.get(f"{cluster.url}/brokers") as r:
                    measured = {b["id"]: b["measured"] for b in (await r.json())["brokers"]}
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        # Broker 2 carries the preload as the controller sees it; broker 1 carries nothing.
        assert measured["2"] >= live.PRELOAD_SEEN * 300.0
        assert measured["1"] == 0.0
    finally:
        await asyncio.to_thread(cluster.stop)


def test_after_ctrl_c_an_error_of_a_stopping_server_is_the_interrupt() -> None:
    """Ctrl-C reaches the run's servers too; when the run's own cleanup then fails (a
    broker that died of the same Ctrl-C), the demo still ends as interrupted (130), not
    with that error's traceback (exit 1)."""
    import signal

    from srtm.experiments import experiment

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), experiment.ctrl_c_wins():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the interrupt is raised here
        except KeyboardInterrupt:
            raise RuntimeError("broker 3 exited with code 130") from None
    with pytest.raises(RuntimeError, match="no Ctrl-C"), experiment.ctrl_c_wins():
        raise RuntimeError("no Ctrl-C: an error stays itself")
    assert signal.getsignal(signal.SIGINT) is before
