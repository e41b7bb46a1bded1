"""control-plane-faults (issue 31 item 6): the pure parts (Σ shares / r from the brokers'
/stats, takeover time from the write probes, the SLO per window, the checks), the
cuttable links on real sockets, the command line's wiring, and a short run end to end on
real etcd members, controllers and brokers (slow)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from srtm.experiments.control_plane import report
from srtm.experiments.control_plane.link import CutHttpLink, CutLinks
from srtm.experiments.control_plane.measure import (
    FaultRecord,
    FaultRow,
    LeaderSample,
    Observed,
    Probe,
    TopicMessages,
    busiest,
    fault_row,
    leaders_at_once,
    live_rate,
    max_ratio,
    share_samples,
    takeover_s,
    version_at,
    window_rows,
)
from srtm.experiments.control_plane.scenario import CpScenario, FaultKind, quick


def _stats(*topics: dict[str, Any]) -> dict[str, Any]:
    return {"srtm": {"topics": list(topics)}}


def test_a_live_share_is_a_shaped_topics_rate_and_nothing_held() -> None:
    assert live_rate({"topic": "t", "bucket": {"rate": 40.0, "burst": 5}, "held": False}) == 40.0
    assert live_rate({"topic": "t", "bucket": {"rate": 40.0, "burst": 5}, "held": True}) == 0.0
    assert live_rate({"topic": "t", "bucket": None, "held": False}) == 0.0


def test_the_sum_of_live_shares_over_r_per_topic() -> None:
    stats = {
        "1": _stats({"topic": "a", "bucket": {"rate": 60.0}, "held": False},
                    {"topic": "b", "bucket": {"rate": 30.0}, "held": False}),
        "2": _stats({"topic": "a", "bucket": {"rate": 40.0}, "held": False}),
        "3": _stats({"topic": "a", "bucket": {"rate": 50.0}, "held": True},
                    {"topic": "other", "bucket": {"rate": 999.0}, "held": False}),
    }  # fmt: skip
    samples = {s.topic: s for s in share_samples(1.5, stats, {"a": 100.0, "b": 60.0})}
    assert set(samples) == {"a", "b"}  # topics not in the run are not counted
    assert samples["a"].ratio == pytest.approx(1.0)  # the held share is not live
    assert samples["a"].live == {"1": 60.0, "2": 40.0, "3": 0.0}
    assert samples["b"].ratio == pytest.approx(0.5)
    # Broker 3 not having given its share up: a hole, seen as Σ / r above 1.
    stats["3"] = _stats({"topic": "a", "bucket": {"rate": 50.0}, "held": False})
    over = share_samples(2.0, stats, {"a": 100.0})
    assert over[0].ratio == pytest.approx(1.5)
    both = [*samples.values(), *over]
    assert max_ratio(both) == pytest.approx(1.5)
    assert max_ratio(both, 0.0, 2.0) == pytest.approx(1.0)


def test_the_busiest_broker_has_the_largest_live_shares_in_the_last_poll() -> None:
    stats = {
        "1": _stats({"topic": "a", "bucket": {"rate": 60.0}, "held": False}),
        "2": _stats({"topic": "a", "bucket": {"rate": 40.0}, "held": False},
                    {"topic": "b", "bucket": {"rate": 30.0}, "held": False}),
    }  # fmt: skip
    first = share_samples(1.0, stats, {"a": 100.0, "b": 30.0})
    assert busiest(first) == "2"
    stats["2"] = _stats({"topic": "a", "bucket": {"rate": 40.0}, "held": True})
    assert busiest([*first, *share_samples(2.0, stats, {"a": 100.0, "b": 30.0})]) == "1"
    assert busiest([]) == "1"


def test_takeover_is_timed_to_the_first_write_a_leader_took_after_the_fault() -> None:
    probes = [
        Probe(9.0, 9.01, True, "1"),  # before the fault: not counted
        Probe(10.0, 10.5, False, "1"),  # the dead leader: no answer
        Probe(10.5, 10.52, False, "2"),  # a standby's 307 (no leader yet)
        Probe(12.0, 12.3, True, "3"),
        Probe(12.4, 12.45, True, "3"),
    ]
    assert takeover_s(10.0, probes) == pytest.approx(2.3)
    assert takeover_s(13.0, probes) is None
    assert takeover_s(10.0, probes[:3]) is None


def test_leaders_at_once_counts_one_poll_round() -> None:
    samples = [
        LeaderSample(1.0, "1", True, 5), LeaderSample(1.0, "2", False, 5),
        LeaderSample(1.2, "1", None, None), LeaderSample(1.2, "2", True, 9),
        LeaderSample(1.4, "1", True, 5), LeaderSample(1.4, "2", True, 9),
    ]  # fmt: skip
    assert leaders_at_once(samples, 0.0, 1.3) == 1
    assert leaders_at_once(samples, 0.0, 2.0) == 2


def _msgs(acked: list[float], sent: list[float], lat: list[float]) -> TopicMessages:
    a, s, lt = (np.array(x, dtype=np.float64) for x in (acked, sent, lat))
    return TopicMessages(acked_s=a, sent_s=s, latency_ms=lt, recv_s=s + lt / 1e3)


def test_a_window_meets_its_slo_with_everything_delivered_under_the_p99() -> None:
    m = {
        # window 0: fine; window 1: one acknowledged message never delivered; window 2: slow
        "a": _msgs([0.1, 0.5, 1.2, 1.5, 2.2], [0.1, 0.5, 1.2, 2.2], [5.0, 6.0, 5.0, 80.0]),
    }
    rows = window_rows(m, {"a": 50.0}, 1.0, 4)
    assert [(w.t_s, w.acked, w.delivered, w.met) for w in rows] == [
        (0.0, 2, 2, True), (1.0, 2, 1, False), (2.0, 1, 1, False), (3.0, 0, 0, True),
    ]  # fmt: skip
    assert rows[2].p99_ms == pytest.approx(80.0) and rows[3].p99_ms is None


def test_plan_versions_before_and_after() -> None:
    versions = [(1.0, "a", 3), (2.0, "b", 1), (3.0, "a", 4), (5.0, "a", 6)]
    assert version_at(versions, "a", 2.5, after=False) == 3
    assert version_at(versions, "a", 4.0, after=False) == 4
    assert version_at(versions, "a", 4.0, after=True) == 6
    assert version_at(versions, "a", 0.5, after=False) is None
    assert version_at(versions, "c", 4.0, after=False) is None


def _row(kind: FaultKind, takeover: float | None, met: int = 4, ratio: float = 1.0,
         delivery: float | None = None) -> FaultRow:  # fmt: skip
    return FaultRow(kind, "x", 0.0, 1.0, 2.0, takeover, met, 4, {"a": 1}, {"a": 2}, 10, 10,
                    ratio, 1, delivery)  # fmt: skip


def test_the_checks_follow_what_was_measured() -> None:
    good = [
        _row(FaultKind.kill_leader, 2.5), _row(FaultKind.stop_leader, 4.0),
        _row(FaultKind.kill_etcd, 0.01), _row(FaultKind.controllers_down, 1.8, delivery=0.99),
        _row(FaultKind.partition_broker, 0.01, met=1),  # a broker's fault: not checked
    ]  # fmt: skip
    assert all(c["ok"] for c in report.checks(good, 100, 100, 1.0)), report.checks(good, 1, 1, 1)
    bad = [
        _row(FaultKind.kill_leader, 3.2), _row(FaultKind.stop_leader, 4.0, met=3),
        _row(FaultKind.controllers_down, 1.8, delivery=0.5),
    ]  # fmt: skip
    failed = [c["check"] for c in report.checks(bad, 100, 99, 1.02) if not c["ok"]]
    assert len(failed) == 5, failed
    assert "3.20 s" in report.checks(bad, 100, 99, 1.02)[0]["measured"]
    assert not report.checks([_row(FaultKind.kill_leader, None)], 1, 1, 1.0)[0]["ok"]


def test_a_fault_row_spans_the_fault_and_its_settling() -> None:
    msgs = {"a": _msgs([0.5, 1.5, 2.5, 3.5], [0.5, 1.5, 2.5, 3.5], [1.0, 1.0, 90.0, 1.0])}
    rows = window_rows(msgs, {"a": 50.0}, 1.0, 4)
    rec = FaultRecord(FaultKind.controllers_down, "all", 1.0, heal_s=2.0, settled_s=3.0)
    rec.probes.append(Probe(2.0, 2.7, True, "2"))
    seen = Observed(
        shares=share_samples(1.5, {"1": _stats({"topic": "a", "bucket": {"rate": 9.0}})},
                             {"a": 10.0}),
        leaders=[LeaderSample(1.5, "1", None, None)],
        versions=[(0.5, "a", 3), (2.9, "a", 4)], messages=msgs, rows=rows, window_s=1.0,
    )  # fmt: skip
    row = fault_row(rec, seen)
    assert row.takeover_s == pytest.approx(0.7)  # from the restart: every controller was down
    assert (row.windows_met, row.windows) == (1, 2)
    assert row.plan_before == {"a": 3} and row.plan_after == {"a": 4}
    assert (row.published, row.delivered) == (2, 2)
    assert row.max_share_ratio == pytest.approx(0.9) and row.leaders_at_once == 0
    assert row.delivery_ratio == pytest.approx(1.0)


def test_the_schedule_holds_every_fault_and_quick_is_shorter() -> None:
    s = CpScenario()
    assert [f.kind for f in s.faults] == list(FaultKind)
    assert s.stop_s > s.leader_lease_s and s.partition_s > s.broker_lease_s
    assert dict((f.kind, f.hold_s) for f in s.faults)[FaultKind.controllers_down] == 60.0
    assert quick().send_s < s.send_s and quick(outage_s=5).outage_s == 5


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
        await writer.drain()
    writer.close()


def test_a_cut_link_stalls_silently_and_a_healed_one_delivers() -> None:
    async def main() -> None:
        server = await asyncio.start_server(_echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        links = CutLinks()
        try:
            link = links.add("b", "127.0.0.1", port)
            reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
            writer.write(b"one")
            assert await asyncio.wait_for(reader.readexactly(3), 5) == b"one"
            links.cut("b")
            writer.write(b"two")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.readexactly(3), 0.5)
            # A connection made while cut is accepted and carries nothing.
            r2, w2 = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", link.port), 5)
            w2.write(b"new")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(r2.readexactly(3), 0.3)
            links.heal("b")
            assert await asyncio.wait_for(reader.readexactly(3), 5) == b"two"
            assert await asyncio.wait_for(r2.readexactly(3), 5) == b"new"
            writer.close()
            w2.close()
        finally:
            links.close()
            server.close()

    asyncio.run(main())


def test_a_redirect_through_http_links_stays_behind_the_links() -> None:
    from aiohttp import ClientSession, web

    async def main() -> None:
        async def took(request: web.Request) -> web.Response:
            return web.json_response({"ok": True})

        leader = web.Application()
        leader.router.add_post("/brokers", took)
        lrun = web.AppRunner(leader)
        await lrun.setup()
        lsite = web.TCPSite(lrun, "127.0.0.1", 0)
        await lsite.start()
        lport = lsite._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

        async def standby(request: web.Request) -> web.Response:
            raise web.HTTPTemporaryRedirect(f"http://127.0.0.1:{lport}/brokers")

        app = web.Application()
        app.router.add_post("/brokers", standby)
        srun = web.AppRunner(app)
        await srun.setup()
        ssite = web.TCPSite(srun, "127.0.0.1", 0)
        await ssite.start()
        sport = ssite._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        links = CutLinks()
        try:
            via = links.add_http("b", f"127.0.0.1:{sport}")
            to_leader = links.add_http("b", f"127.0.0.1:{lport}")
            async with ClientSession() as http:
                url = f"http://{via.address}/brokers"
                async with http.post(url, json={}, allow_redirects=False) as r:
                    assert r.status == 307
                    assert r.headers["Location"] == f"http://{to_leader.address}/brokers"
                async with http.post(url, json={}) as r:
                    assert r.status == 200 and await r.json() == {"ok": True}
                links.cut("b")
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.5), http.post(url, json={}):
                        pass
                links.heal("b")
        finally:
            links.close()
            await srun.cleanup()
            await lrun.cleanup()

    asyncio.run(main())


def test_an_http_link_rewrites_a_redirect_to_the_leaders_link() -> None:
    link = CutHttpLink("127.0.0.1:1000", {"127.0.0.1:2000": "127.0.0.1:5002"})
    assert (
        link._rewritten("http://127.0.0.1:2000/brokers?x=1") == "http://127.0.0.1:5002/brokers?x=1"
    )
    assert link._rewritten("http://10.0.0.9:2000/brokers") == "http://10.0.0.9:2000/brokers"


def test_cli_runs_it_with_its_outage_and_refuses_what_it_does_not_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srtm.cli.experiment import app
    from srtm.experiments.control_plane import live

    seen: list[CpScenario] = []
    row = _row(FaultKind.kill_leader, 1.0)

    def fake(out: Path, s: CpScenario, **_: Any) -> dict[str, Any]:
        seen.append(s)
        from dataclasses import asdict

        faults = [asdict(row)]
        return {"faults": faults, "checks": report.checks([row], 5, 5, 1.0),
                "partition": report.PARTITION, "disturbed": None}  # fmt: skip

    monkeypatch.setattr(live, "run", fake)
    args = ["run", "control-plane-faults", "--out", str(tmp_path), "--outage-s", "7", "--json"]
    result = CliRunner().invoke(app, [*args, "--quick"])
    assert result.exit_code == 0, result.output
    assert seen[0].outage_s == 7.0 and seen[0].warmup_s == quick().warmup_s
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    assert doc["faults"][0]["fault"] == "kill-leader"
    refused = CliRunner().invoke(app, ["run", "control-plane-faults", "--policy", "lb"])
    assert refused.exit_code == 2 and "--policy" in refused.output


@pytest.mark.slow
def test_a_short_run_has_a_row_per_fault_and_computed_checks(tmp_path: Path) -> None:
    from srtm.experiments.control_plane import live

    s = quick(outage_s=6.0)
    data = live.run(tmp_path, s)
    doc = json.loads((tmp_path / "control-plane-faults.json").read_text())
    assert [r["fault"] for r in doc["faults"]] == [f.value for f in FaultKind]
    for r in doc["faults"]:
        assert r["windows"] > 0 and r["published"] > 0, r
        assert r["plan_before"] and r["plan_after"], r
    kill = doc["faults"][0]
    assert kill["takeover_s"] is not None and kill["takeover_s"] > 0
    assert doc["polls"] > 0 and doc["max_share_ratio"] > 0
    # The checks are what the rows say, not constants.
    rows = [FaultRow(**(r | {"fault": FaultKind(r["fault"])})) for r in doc["faults"]]
    again = report.checks(rows, doc["published"], doc["delivered"], doc["max_share_ratio"])
    assert again == doc["checks"] == data["checks"]
    assert doc["published"] > 0 and doc["delivered"] <= doc["published"]
    assert "| kill -9 of the leader" in report.markdown(doc)
