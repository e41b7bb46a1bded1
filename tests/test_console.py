"""The SRTM console: its state document (a pure builder: the ledger, SLO against the
brokers' p99, the DRL penalty) and the page itself, opened in headless Chromium (Debian's
``chromium`` and ``chromium-driver``; ``make test`` installs them) against a live
controller, broker, publisher and subscriber. The screenshot is kept as
``out/artifacts/console.png``."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from srtm.analysis.md1 import split_model
from srtm.client import Publisher, Received, Subscriber
from srtm.control import Controller
from srtm.control.console import ConsoleState, Latency, console_state, drl_penalty, latencies
from srtm.launch import start_cluster
from srtm.placement import PublisherLoad, TopicSpec
from srtm.ratelimit import BucketParams
from support import ControllerClient, eventually

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "out" / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


# -- the DRL penalty ---------------------------------------------------------------------------


def test_one_bucket_pays_no_drl_penalty() -> None:
    drl = drl_penalty(1000.0, 20.0, [(BucketParams(1000.0, 20.0), 800.0)])
    assert drl["penalty_ms"] == pytest.approx(0.0, abs=1e-12)
    assert drl["whole_ms"] > 0 and drl["note"] == ""


def test_an_equal_split_pays_the_models_penalty() -> None:
    """Two halves of (1000, 20), each fed 400 msg/s: each is ``split_model``'s k = 2 bucket,
    so the split's mean delay is Eq. 1 of that bucket."""
    half = BucketParams(500.0, 10.0)
    drl = drl_penalty(1000.0, 20.0, [(half, 400.0), (half, 400.0)])
    k2, k1 = split_model(0.8, 1000.0, 20.0, 2), split_model(0.8, 1000.0, 20.0, 1)
    assert drl["split_ms"] == pytest.approx(k2.eq1_mean_s * 1e3, rel=1e-9)
    assert drl["whole_ms"] == pytest.approx(k1.eq1_mean_s * 1e3, rel=1e-9)
    assert drl["penalty_ms"] > 0


def test_no_traffic_or_a_saturated_bucket_has_no_penalty_figure() -> None:
    assert drl_penalty(100.0, 5.0, [(BucketParams(100.0, 5.0), 0.0)])["note"] == "no traffic"
    saturated = drl_penalty(100.0, 6.0, [(BucketParams(50.0, 3.0), 60.0),
                                         (BucketParams(50.0, 3.0), 10.0)])  # fmt: skip
    assert saturated["penalty_ms"] is None and saturated["note"].startswith("saturated")


def test_a_deep_burst_is_evaluated_at_the_cap_and_says_so() -> None:
    drl = drl_penalty(1e5, 5000.0, [(BucketParams(5e4, 2500.0), 4e4)] * 2)
    assert drl["penalty_ms"] is not None and "evaluated at 200" in drl["note"]


# -- the state document ------------------------------------------------------------------------


def _controller() -> Controller:
    c = Controller()
    for i, b in enumerate(("b0", "b1")):
        c.register(b, f"127.0.0.1:{4150 + i}", f"127.0.0.1:{5150 + i}", 400.0, 0.0)
    pubs = tuple(PublisherLoad(f"p{i}", 100.0, f"g{i % 2}") for i in range(4))
    # 440 msg/s of bucket on brokers of 400: two brokers.
    c.create_topic(TopicSpec("t", pubs, 40.0, 5.0, 440.0), "maxmin", 0.0)
    c.create_topic(TopicSpec("quiet", pubs[:1], 10.0, 1.0, 110.0), "lb", 0.0)
    return c


def test_the_state_document_carries_ledger_slo_p99_plan_and_penalty() -> None:
    c = _controller()
    topic = c.topics["t"]
    for b in topic.buckets:
        c.report(b, 150.0, {"t": (150.0, 0.0)}, 1.0)
    readings = {b: {"t": Latency(2.0 + i, 100)} for i, b in enumerate(sorted(topic.buckets))}
    doc = console_state(c, readings, {"version": "x"}, 2.0)
    state = ConsoleState.model_validate(doc)  # the declared shape, nothing more
    assert {b.id for b in state.brokers} == {"b0", "b1"}
    ledger = {e.id: e for e in c.ledger()}
    for b in state.brokers:
        assert (b.allocated, b.measured, b.rcap) == (
            ledger[b.id].allocated, ledger[b.id].measured, ledger[b.id].rcap)  # fmt: skip
    t, quiet = (next(x for x in state.topics if x.name == n) for n in ("t", "quiet"))
    # The largest delivery p99 of the topic's brokers, against its SLO.
    assert t.delivery_p99_ms == 2.0 + len(topic.buckets) - 1
    assert t.deliveries == 100 * len(topic.buckets)
    assert t.slo_met is (t.delivery_p99_ms <= 5.0)
    assert [s.id for s in t.brokers] == list(topic.assignment)
    assert all(s.bucket is not None and s.rate == 150.0 for s in t.brokers)
    assert t.drl.penalty_ms is not None
    assert quiet.delivery_p99_ms is None and quiet.slo_met is None
    assert quiet.drl.note == "no traffic"


def test_a_missed_slo_is_marked() -> None:
    c = _controller()
    (b, *_) = c.topics["t"].buckets
    doc = console_state(c, {b: {"t": Latency(9.0, 10)}}, {}, 0.0)
    (t,) = (x for x in doc["topics"] if x["name"] == "t")
    assert (t["delivery_p99_ms"], t["slo_met"]) == (9.0, False)


def test_waits_for_a_subscriber_are_backlog_not_a_missed_slo() -> None:
    c = _controller()
    b0, b1 = sorted(c.topics["t"].buckets)
    readings = {b0: {"t": Latency(1.0, 50, 1649.0, 1, 0.0)},
                b1: {"t": Latency(None, 0, None, 0, 30_000.0)}}  # fmt: skip
    (t,) = (x for x in console_state(c, readings, {}, 0.0)["topics"] if x["name"] == "t")
    assert (t["delivery_p99_ms"], t["deliveries"], t["slo_met"]) == (1.0, 50, True)
    assert (t["wait_p99_ms"], t["waits"], t["backlog_age_ms"]) == (1649.0, 1, 30_000.0)


def _summary(count: int, p99: int) -> dict[str, int]:
    return {"count": count, "mean": p99 // 2, "p50": p99 // 2, "p95": p99, "p99": p99,
            "p999": p99}  # fmt: skip


def test_latencies_read_each_topics_delivery_window_of_a_stats_document() -> None:
    stats = {"topics": [
        # nsqd's figure counts waits for a subscriber since start: not read
        {"topic_name": "a", "e2e_processing_latency": {"count": 3, "percentiles": [
            {"quantile": 0.99, "value": 1_649_000_000}]}}],
        "srtm": {"topics": [
            {"topic": "a", "delivery_ns": _summary(3, 2_500_000),
             "subscriber_wait_ns": _summary(1, 1_649_000_000), "backlog_age_ns": 0},
            {"topic": "b", "delivery_ns": _summary(0, 0), "subscriber_wait_ns": _summary(0, 0),
             "backlog_age_ns": 12_000_000},
            {"topic": "old", "latency_ns": _summary(3, 5)},  # an older broker's: no reading
        ]}}  # fmt: skip
    assert latencies(stats) == {
        "a": Latency(2.5, 3, 1649.0, 1, 0.0), "b": Latency(None, 0, None, 0, 12.0)}  # fmt: skip


async def test_the_page_and_its_files_are_served(controller_api: ControllerClient) -> None:
    http, base = controller_api.http, controller_api.base
    for path, kind in [("/ui", "text/html"), ("/ui/console.js", "text/javascript"),
                       ("/ui/console.css", "text/css")]:  # fmt: skip
        async with http.get(base + path) as resp:
            assert (resp.status, resp.content_type) == (200, kind), path
            assert len(await resp.read()) > 500
    async with http.get(base + "/ui/../api.py") as resp:
        assert resp.status == 404
    status, doc = await controller_api.call("GET", "/ui/nope.js")
    assert status == 404 and "nope.js" in doc["message"]
    status, doc = await controller_api.call("GET", "/ui/state")
    assert status == 200 and ConsoleState.model_validate(doc).topics == []


# -- the page in a real browser ----------------------------------------------------------------


def _driver(tmp: Path) -> Any:
    """Chromium under chromedriver, its profile and its temporary files (the singleton
    socket's directory, which it leaves in TMPDIR when it is made to quit) in ``tmp``: a
    short path (a Unix socket's path has at most 107 bytes; pytest's ``tmp_path`` under
    xdist is longer than that leaves room for)."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing: the console's browser test needs Debian's "
            "chromium and chromium-driver (`make browser` installs them; `make test` does)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1500,900", f"--user-data-dir={tmp / 'profile'}"):  # fmt: skip
        options.add_argument(arg)
    # The system chromedriver, named: Selenium downloads nothing.
    service = Service(executable_path=str(CHROMEDRIVER), env={**os.environ, "TMPDIR": str(tmp)})
    return webdriver.Chrome(service=service, options=options)


def _browse(url: str, shot: Path) -> dict[str, str]:
    """Open the console, wait until both tables show the broker and the topic with a
    measured p99, save a screenshot; what the topic's row says."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # removed even where Chromium does not start
    with tempfile.TemporaryDirectory(prefix="srtm-chromium-", ignore_cleanup_errors=True) as tmp:
        driver = _driver(Path(tmp))
        try:
            driver.get(url + "/ui")
            wait = WebDriverWait(driver, 30, poll_frequency=0.1)
            broker = wait.until(
                lambda d: d.find_elements(By.CSS_SELECTOR, '#brokers tr[data-broker="1"]')
            )[0]
            assert broker.find_element(By.CSS_SELECTOR, ".mcap").text == "150"
            wait.until(lambda d: broker.find_element(By.CSS_SELECTOR, ".allocated").text != "0.0")

            def p99(d: Any) -> Any:
                rows = d.find_elements(By.CSS_SELECTOR, '#topics tr[data-topic="sensors"]')
                return rows and rows[0].find_element(By.CSS_SELECTOR, ".p99").text[:1].isdigit()

            wait.until(p99)
            row = driver.find_element(By.CSS_SELECTOR, '#topics tr[data-topic="sensors"]')
            cells = {k: row.find_element(By.CSS_SELECTOR, f".{k}").text
                     for k in ("slo", "p99", "verdict", "plan", "drl")}  # fmt: skip
            driver.save_screenshot(str(shot))
            return cells
        finally:
            driver.quit()


@pytest.mark.slow
async def test_the_console_shows_the_ledger_and_the_topic_in_chromium(tmp_path: Path) -> None:
    # A bucket of 220 msg/s on brokers of 150: the plan takes both.
    c = start_cluster(tmp_path, 2, broker_args=["--mcap", "150"])
    try:
        doc = {"name": "sensors", "slo_p99_ms": 50.0, "burst": 20,
               "publishers": [{"id": "p0", "rate": 100}, {"id": "p1", "rate": 100}]}  # fmt: skip
        c.controller.post("/topics", json.dumps(doc).encode())
        got: list[Received] = []
        sub = Subscriber("sensors", "all", controller=c.url, on_message=got.append, refresh_s=0.2)
        await sub.start()
        pubs = [Publisher("sensors", p, controller=c.url) for p in ("p0", "p1")]
        try:
            for pub in pubs:
                await pub.start()
            for _ in range(100):  # paced at about 100 msg/s each, within their rate
                for pub in pubs:
                    await pub.publish()
                await asyncio.sleep(0.01)
            for pub in pubs:
                await pub.flush()
            await eventually(lambda: len(got) >= 200, "every message consumed", timeout=30)
        finally:
            for pub in pubs:
                await pub.close()
            await sub.close()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = tmp_path / "console.png"
        cells = await asyncio.to_thread(_browse, c.url, shot)
        shutil.copyfile(shot, ARTIFACTS / "console.png")
    finally:
        c.stop()
    assert cells["slo"] == "50.0 ms"
    assert cells["verdict"] in ("✔ met", "✘ missed")
    assert [line.split(" · ")[:2] for line in cells["plan"].splitlines()] == [
        ["1", "1 pub"], ["2", "1 pub"]]  # fmt: skip
    assert cells["drl"].split()[0].replace(".", "").isdigit()
    assert shot.stat().st_size > 10_000
