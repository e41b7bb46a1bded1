"""The elastic loop's reaction times (issue 18 item 6): overload to relief, spawn to traffic.

Run with ``.venv/bin/python benchmarks/elastic.py`` (``--help`` for options). Each run
starts, on 127.0.0.1 with ephemeral ports, a controller in this process (``--rebalance``,
the local provisioner) and one broker process (``--mcap 100``), creates a topic of four
publishers declared at 20 msg/s (r = 88 on one broker: SRTM concentrates) that send
22 msg/s on schedule (88 msg/s measured: LR 0.88 both ways). The loop is held until the
overload is measured, then started: that instant is the overload's start. Two
cases, alternating:

- ``spawn``: the broker is alone; the loop spawns a broker, moves a slice onto it. Timed:
  overload (the loop's start) to relief (the first ``GET /brokers`` sample with the
  overloaded broker's LR under 0.80), and the spawn decision (the controller's event) to the new
  broker carrying traffic (the first sample where it measured any).
- ``move``: two brokers; the topic lands whole on one (SRTM concentrates: r = 96.8 fits one
  mcap of 100); the loop moves a slice onto the other. Timed: overload to relief.

LR is the rebalancer's: ``max(allocated, measured) / mcap``. Anchors, in the same run: the
loop's period and averaging window and the brokers' report interval (settings, printed),
and the time to start a bare broker process (``srtm broker`` without a controller, to its
ready line), measured in each run. The table gives medians with min–max over ``--runs``.
Every process started here is stopped at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import typer
from rich.console import Console
from rich.table import Table

from srtm.client import Publisher
from srtm.control.options import ControllerOptions
from srtm.control.service import ControllerService
from srtm.launch import BrokerProcess, new_token, start_broker

#: Each publisher declares RATE and sends SEND (the measured load is then over 0.80 too).
RATE = 20.0
SEND = 22.0
MCAP = 100.0
REPORT_S = 0.2
INTERVAL_S = 0.5
WINDOW_S = 2.0
POLL_S = 0.05
OVER = 0.80
console = Console(stderr=True)


async def _publish(pub: Publisher, stop: asyncio.Event) -> None:
    start, k = time.monotonic(), 0
    while not stop.is_set():
        delay = start + k / SEND - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)  # the load's schedule
        with contextlib.suppress(Exception):
            await pub.publish()
        k += 1


def _bare_start(directory: Path) -> float:
    """Seconds from starting a bare ``srtm broker`` to its ready line."""
    t = time.monotonic()
    proc = start_broker(directory, ["--insecure-loopback"], token="")
    elapsed = time.monotonic() - t
    proc.stop()
    return elapsed


async def one_run(case: str, directory: Path) -> dict[str, Any]:
    """One run of ``case`` (``spawn`` or ``move``): its timings (s, None if not seen)."""
    token = new_token()
    opts = ControllerOptions(
        db=directory / "c.db", http_port=0, tick_s=0.2, token=token, rebalance=True,
        rebalance_interval_s=INTERVAL_S, rebalance_window_s=WINDOW_S, min_plan_interval_s=2.0,
        min_brokers=1, max_brokers=2, spawn_mcap=MCAP, broker_timeout_s=15.0,
    )  # fmt: skip
    service = ControllerService(opts)
    await service.start()
    assert service.http_address is not None and service.elastic is not None
    assert service._rebalancer is not None
    service._rebalancer.cancel()  # held until the traffic flows (restarted below)
    url = "http://{}:{}".format(*service.http_address)
    args = ["--controller", url, "--mcap", repr(MCAP), "--report-interval-s", repr(REPORT_S)]
    brokers: list[BrokerProcess] = []
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    pubs: list[Publisher] = []
    out: dict[str, Any] = {"case": case}
    try:
        for bid in ("1", "2") if case == "move" else ("1",):
            brokers.append(await asyncio.to_thread(
                start_broker, directory / f"b{bid}", ["--broker-id", bid, *args], token=token,
            ))  # fmt: skip
        ids = {"1", "2"} if case == "move" else {"1"}
        while not ids <= {b.id for b in service.ctrl.up()}:
            await asyncio.sleep(POLL_S)  # until the brokers registered
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            pub_docs = [{"id": f"p{i}", "rate": RATE, "group": f"g{i % 2}"} for i in range(4)]
            doc = {"name": "t", "slo_p99_ms": 100, "burst": 50, "publishers": pub_docs}
            async with http.post(url + "/topics", json=doc) as r:
                assert r.status in (200, 201), await r.text()
            for i in range(4):
                pub = Publisher("t", f"p{i}", controller=url, group=f"g{i % 2}", rate=RATE)
                await pub.start()
                pubs.append(pub)
                tasks.append(asyncio.create_task(_publish(pub, stop)))
            while max(b.load for b in service.ctrl.up()) <= OVER * MCAP:
                await asyncio.sleep(POLL_S)  # until the overload is measured too
            # The loop starts now: the overload begins for it (as a load rising would).
            service._rebalancer = asyncio.create_task(service._rebalance_loop())
            out |= await _watch(http, url, service)
    finally:
        stop.set()
        for task in tasks:
            with contextlib.suppress(Exception):
                await task
        for pub in pubs:
            await pub.close()
        await service.stop()
        for b in brokers:
            b.stop()
    return out


async def _watch(
    http: aiohttp.ClientSession, url: str, service: ControllerService, timeout: float = 60.0
) -> dict[str, Any]:
    """Poll ``GET /brokers`` until a broker was overloaded and relieved (and, after a
    spawn, the new broker carries traffic)."""
    el = service.elastic
    assert el is not None
    t_over, t_relief, t_carry = time.monotonic(), None, None
    hot: str | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        async with http.get(url + "/brokers") as r:
            doc = await r.json()
        now = time.monotonic()
        lr = {b["id"]: max(b["allocated"], b["measured"]) / b["mcap"] for b in doc["brokers"]}
        measured = {b["id"]: b["measured"] for b in doc["brokers"]}
        over = sorted(b for b, x in lr.items() if x > OVER)
        if hot is None and over:
            hot = over[0]
        elif hot is not None and t_relief is None and lr.get(hot, 1.0) < OVER:
            t_relief = now
        if t_carry is None and measured.get("1001", 0.0) > 0:
            t_carry = now
        spawned = _event_time(list(el.events), "spawn 1001")
        if t_relief is not None and (spawned is None or t_carry is not None):
            break
        await asyncio.sleep(POLL_S)  # the sampling period
    spawned = _event_time(list(el.events), "spawn 1001")
    return {
        "overload_to_relief_s": None if t_relief is None else t_relief - t_over,
        "spawn_to_traffic_s": None if spawned is None or t_carry is None else t_carry - spawned,
        "spawned": spawned is not None,
        "events": list(el.events),
    }


def _event_time(events: list[str], text: str) -> float | None:
    for line in events:
        stamp, _, rest = line.partition(" ")
        if rest == text:
            return float(stamp)
    return None


def _stat(xs: list[float]) -> str:
    if not xs:
        return "—"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f}), n={len(xs)}"


def main(
    runs: Annotated[int, typer.Option(help="Runs of each case.", min=1)] = 5,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write raw numbers.")] = None,
) -> None:
    """Time the elastic loop: overload to relief, spawn decision to traffic."""
    rows: list[dict[str, Any]] = []
    bare: list[float] = []
    with tempfile.TemporaryDirectory(prefix="srtm-elastic-") as tmp:
        for i in range(runs):
            bare.append(_bare_start(Path(tmp) / f"bare{i}"))
            for case in ("spawn", "move") if i % 2 == 0 else ("move", "spawn"):
                console.print(f"run {i + 1}/{runs}: {case}")
                rows.append(asyncio.run(one_run(case, Path(tmp) / f"{case}{i}")))
    table = Table(title=f"elastic loop, {runs} runs per case: median (min–max) seconds")
    for col in ("measure", "case", "median (min–max)"):
        table.add_column(col)

    def of(case: str, key: str) -> list[float]:
        return [r[key] for r in rows if r["case"] == case and r[key] is not None]

    table.add_row(
        "overload → relief (LR < 0.80)", "spawn", _stat(of("spawn", "overload_to_relief_s"))
    )
    table.add_row(
        "overload → relief (LR < 0.80)", "move", _stat(of("move", "overload_to_relief_s"))
    )
    table.add_row("spawn decision → new broker carries traffic", "spawn",
                  _stat(of("spawn", "spawn_to_traffic_s")))  # fmt: skip
    table.add_row("anchor: start a bare broker process", "", _stat(bare))
    table.add_row("anchor: loop period / window / report interval", "",
                  f"{INTERVAL_S:g} / {WINDOW_S:g} / {REPORT_S:g} (settings)")  # fmt: skip
    Console().print(table)
    if json_path is not None:
        settings = {"interval_s": INTERVAL_S, "window_s": WINDOW_S, "report_s": REPORT_S}
        doc = {"runs": rows, "bare_start_s": bare, "settings": settings}
        json_path.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    typer.run(main)
