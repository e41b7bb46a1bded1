"""The Spark pipeline on small generated traces: every job's numbers against a numpy
reference computed from the simulated messages, schema errors, empty runs, overwrite,
the CLI, and executors in separate processes.

Every job runs once per dataset (module-scoped fixtures) to keep Spark actions few.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from srtm.analysis import profile_bucket
from srtm.pipeline import SchemaError, latency_summary
from srtm.pipeline import adaptor as adaptor_job
from srtm.pipeline import correlation as correlation_job
from srtm.pipeline import latency as latency_job
from srtm.pipeline import profile as profile_job
from srtm.pipeline.dataset import open_traces
from srtm.pipeline.jobs import JOBS, Options, run_job, run_jobs
from srtm.pipeline.synth import RunSpec, Sends, simulate, write
from srtm.ratelimit import NS_PER_S, grid
from srtm.workload import PublisherSpec, build
from support import eventually

QUANTILES = {"p50_ns": 0.5, "p95_ns": 0.95, "p99_ns": 0.99, "p999_ns": 0.999}


def sends_for(
    topics: dict[str, tuple[int, int, float]], brokers: list[str], duration_s: float, seed: int
) -> Sends:
    """``topics``: name → (publishers, group size, msg/s each); publishers go to brokers
    round robin; a group size of 1 means independent publishers."""
    parts: list[dict[str, Any]] = []
    for t, (name, (count, size, rate)) in enumerate(topics.items()):
        pubs = [
            PublisherSpec(f"{name}-p{i}", rate, group=f"{name}-g{i // size}" if size > 1 else None)
            for i in range(count)
        ]
        sched = build(pubs, duration_s, spread_s=0.002, seed=seed + t)
        who = np.repeat(sched.publisher, sched.batch)
        ids = np.array([p.id for p in pubs], dtype=object)
        groups = np.array([p.group for p in pubs], dtype=object)
        parts.append(
            {
                "topic": np.full(len(who), name, dtype=object),
                "broker": np.array(brokers, dtype=object)[who % len(brokers)],
                "publisher": ids[who],
                "group": groups[who],
                "t": sched.arrivals_ns(),
            }
        )
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return Sends(cols["topic"], cols["broker"], cols["publisher"], cols["group"], cols["t"])


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two runs with messages, one run with metadata only, quirks the pipeline must take:
    a topic delivered twice per message (two channels), a broker side sampled at 90 %,
    a hidden temp file, a run with no metadata file."""
    root = tmp_path_factory.mktemp("traces")
    r1 = simulate(
        RunSpec("r1", "srtm", slo_p99_ms=5.0, burst=6.0),
        sends_for({"ta": (40, 8, 40.0), "tb": (12, 1, 60.0)}, ["b0", "b1"], 8.0, 1),
        seed=1,
    )
    r2 = simulate(
        RunSpec("r2", "lb", slo_p99_ms=2.0, burst=3.0),
        sends_for({"ta": (30, 10, 40.0)}, ["b0", "b1", "b2"], 6.0, 7),
        seed=2,
    )
    write(root, r1, files=2)
    write(root, r2, files=3)
    # r1/tb: every message reaches a second channel, 0–3 ms later.
    rng = np.random.default_rng(5)
    extra = r1.frame[r1.frame["topic"] == "tb"].copy()
    extra["t_recv_ns"] += rng.integers(0, 3_000_000, len(extra))
    sub_cols = ["broker", "topic", "msg_id", "publisher", "group", "seq", "t_send_ns", "t_recv_ns"]
    table = pa.Table.from_pandas(extra[sub_cols], preserve_index=False)
    table = table.cast(
        pa.schema([(c, pa.string() if c in sub_cols[:5] else pa.int64()) for c in sub_cols])
    )
    pq.write_table(table.replace_schema_metadata(None), root / "subscriber/run=r1/part-dup.parquet")
    # r2: the broker traced 90 % of its messages.
    broker_dir = root / "broker/run=r2"
    kept = []
    for path in sorted(broker_dir.glob("*.parquet")):
        t = pq.read_table(path)
        mask = np.random.default_rng(9).random(t.num_rows) < 0.9
        t = t.filter(pa.array(mask))
        pq.write_table(t, path)
        kept.append(t.column("msg_id").to_numpy(zero_copy_only=False))
    (broker_dir / ".part-99999.parquet.tmp").write_bytes(b"half-written")
    # "idle": metadata, no rows; "nometa": rows, no metadata (copied from r2, smaller).
    (root / "runs/idle.json").write_text(
        json.dumps({"run": "idle", "policy": "conc", "scenario": "s", "slo_p99_ms": 1})
    )
    frames = {
        "r1": (r1.frame, pd.concat([r1.frame, extra]), r1.frame),
        "r2": (
            r2.frame,
            r2.frame,
            r2.frame[r2.frame["msg_id"].astype(str).isin(np.concatenate(kept))],
        ),
    }
    return {
        "root": root,
        "sims": {"r1": r1, "r2": r2},
        "frames": frames,
        "slo": {"r1": 5e6, "r2": 2e6},
    }


@pytest.fixture(scope="module")
def outputs(
    spark: Any,
    dataset: dict[str, Any],
    cluster_run: object,  # started first, to run beside these jobs
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("out")
    results = run_jobs(JOBS, spark, dataset["root"], out)
    tables = {job: pd.read_parquet(out / job) for job in JOBS if job != "report"}
    return {"out": out, "results": results, "tables": tables}


# -- latency --------------------------------------------------------------------------


def reference_latency(dataset: dict[str, Any]) -> pd.DataFrame:
    """The latency table recomputed with numpy from the simulated messages."""
    rows = []
    for run, (_, deliveries, traced) in dataset["frames"].items():
        d = deliveries.assign(e2e=deliveries["t_recv_ns"] - deliveries["t_send_ns"])
        b = traced.assign(
            tw=traced["t_release_ns"] - traced["t_arrive_ns"],
            proc=traced["t_dispatch_ns"] - traced["t_release_ns"],
        )
        d = d.astype({"topic": str, "broker": str, "msg_id": str})
        b = b.astype({"topic": str, "broker": str, "msg_id": str})
        for keys in (["topic", "broker"], ["topic"]):
            for key, g in d.groupby(keys):
                key = key if isinstance(key, tuple) else (key,)
                e2e = g["e2e"].to_numpy()
                row: dict[str, Any] = {"run": run, "topic": key[0]}
                row["broker"] = key[1] if len(key) > 1 else None
                row["count"] = len(e2e)
                for name, q in QUANTILES.items():
                    row[name] = int(np.quantile(e2e, q, method="inverted_cdf"))
                row["max_ns"] = int(e2e.max())
                row["slo_violations"] = int((e2e > dataset["slo"][run]).sum())
                tail = g[g["e2e"] >= row["p99_ns"]].merge(b[["broker", "msg_id", "tw", "proc"]])
                row["tail_count"] = len(tail)
                row["tail_token_share"] = tail["tw"].sum() / tail["e2e"].sum()
                row["tail_processing_share"] = tail["proc"].sum() / tail["e2e"].sum()
                mine = b[b["topic"] == key[0]]
                if len(key) > 1:
                    mine = mine[mine["broker"] == key[1]]
                row["messages"] = len(mine)
                row["delayed_share"] = float((mine["tw"] > 0).mean())
                row["token_wait_mean_ns"] = float(mine["tw"].mean())
                rows.append(row)
    return pd.DataFrame(rows)


def test_latency_matches_numpy_reference(outputs: dict[str, Any], dataset: dict[str, Any]) -> None:
    got = outputs["tables"]["latency"]
    want = reference_latency(dataset)
    assert len(got) == len(want)
    merged = got.merge(want, on=["run", "topic", "broker"], suffixes=("", "_ref"), how="outer")
    assert len(merged) == len(want), "rows differ"
    exact = ["count", *QUANTILES, "max_ns", "slo_violations", "tail_count", "messages"]
    for col in exact:
        assert (merged[col].astype("int64") == merged[f"{col}_ref"].astype("int64")).all(), col
    for col in ("tail_token_share", "tail_processing_share", "delayed_share", "token_wait_mean_ns"):
        assert np.allclose(merged[col].astype(float), merged[f"{col}_ref"], rtol=1e-9), col
    # The penalty is visible: tails wait for tokens in this workload.
    assert (merged["tail_token_share"] > 0.5).any()


def test_latency_rows_and_metadata(outputs: dict[str, Any]) -> None:
    lat = outputs["tables"]["latency"]
    assert list(lat.columns) == list(latency_job.COLUMNS)
    assert set(lat["run"]) == {"r1", "r2"}  # "idle" has no rows
    topics = lat[lat["broker"].isna()].set_index(["run", "topic"])
    assert topics.loc[("r1", "ta"), "brokers"] == 2 and topics.loc[("r2", "ta"), "brokers"] == 3
    assert set(lat["policy"]) == {"srtm", "lb"}
    assert (lat["slo_p99_ns"] == lat["run"].map({"r1": 5_000_000, "r2": 2_000_000})).all()
    assert (lat["slo_met"] == (lat["p99_ns"] <= lat["slo_p99_ns"])).all()
    # Two channels: r1/tb has twice as many deliveries as messages.
    tb = topics.loc[("r1", "tb")]
    assert tb["count"] == 2 * tb["messages"]


# -- adaptor-stats --------------------------------------------------------------------


def reference_windows(arrivals: np.ndarray, rate: float, window_s: int) -> pd.DataFrame:
    """A direct loop: Lindley's recursion for the meter, then per-second windows."""
    t_ns = grid(rate, 1).t
    x = -(10**30)
    backlog = []
    for t in arrivals.tolist():
        x = max(x + t_ns, t)
        backlog.append((x + t_ns - t) * rate / NS_PER_S)
    secs = arrivals // NS_PER_S
    rows = []
    for s in range(int(secs.min()), int(secs.max()) + 1):
        inside = (secs > s - window_s) & (secs <= s)
        rows.append(
            {
                "second": s,
                "count": int((secs == s).sum()),
                "window_rate": inside.sum() / window_s,
                "window_max_backlog": max(
                    [b for b, i in zip(backlog, inside, strict=True) if i] or [0.0]
                ),
            }
        )
    return pd.DataFrame(rows)


def test_adaptor_stats_match_a_direct_replay(
    outputs: dict[str, Any], dataset: dict[str, Any]
) -> None:
    stats = outputs["tables"]["adaptor-stats"]
    assert list(stats.columns) == list(adaptor_job.COLUMNS)
    sim = dataset["sims"]["r1"]
    frame = sim.frame
    for broker in ("b0", "b1"):
        arrivals = np.sort(
            frame[(frame["topic"] == "ta") & (frame["broker"] == broker)]["t_arrive_ns"].to_numpy()
        )
        rate = sim.buckets[("ta", broker)][0]
        want = reference_windows(arrivals, rate, 10)
        got = stats[(stats["run"] == "r1") & (stats["topic"] == "ta") & (stats["broker"] == broker)]
        got = got.sort_values("second").reset_index(drop=True)
        assert (got["meter_source"] == "metadata").all() and np.allclose(got["meter_rate"], rate)
        assert got["second"].tolist() == want["second"].tolist()
        assert got["count"].tolist() == want["count"].tolist()
        assert np.allclose(got["window_rate"], want["window_rate"])
        assert np.allclose(got["window_max_backlog"], want["window_max_backlog"])
    # Shares of a topic's brokers add up to 1 in every second.
    sums = stats.groupby(["run", "topic", "second"])[["rate_share", "burst_share"]].sum()
    assert np.allclose(sums.to_numpy(), 1.0)
    total = sum(r for (t, _), (r, _) in sim.buckets.items() if t == "ta")
    r1ta = stats[(stats["run"] == "r1") & (stats["topic"] == "ta")]
    assert np.allclose(r1ta["proposed_rate"], total * r1ta["rate_share"])


# -- profile-buckets ------------------------------------------------------------------


def test_profile_buckets_match_srtm_analysis(
    outputs: dict[str, Any], dataset: dict[str, Any]
) -> None:
    prof = outputs["tables"]["profile-buckets"].set_index(["run", "topic"])
    assert list(outputs["tables"]["profile-buckets"].columns) == list(profile_job.COLUMNS)
    assert len(prof) == 3
    for run, (_, _, traced) in dataset["frames"].items():
        for topic, g in traced.groupby("topic", observed=True):
            want = profile_bucket(np.sort(g["t_arrive_ns"].to_numpy()))
            row = prof.loc[(run, str(topic))]
            assert row["messages"] == len(g)
            assert math.isclose(row["r"], want.rate, rel_tol=1e-12)
            assert row["b"] == want.burst


# -- quantiles -----------------------------------------------------------------------


def test_nearest_rank_and_bucket_location_match_numpy() -> None:
    from srtm.pipeline.quantiles import QUANTILES as QS
    from srtm.pipeline.quantiles import bucket_of, locate, nearest_rank, rank

    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 100, 999, 1000, 1001, 4321):
        # Ties, negatives (skewed clocks) and a long tail.
        values = np.concatenate(
            [rng.integers(-5000, 5000, n // 3), rng.pareto(1.5, n - n // 3) * 1e5]
        )
        values = values.astype(np.int64)
        for name, q in QS:
            want = int(np.quantile(values, q, method="inverted_cdf"))
            assert nearest_rank(values, q) == want
            b, c = np.unique(bucket_of(values), return_counts=True)
            target = next(t for t in locate(b, c) if t.name == name)
            inside = np.sort(values[bucket_of(values) == target.bucket])
            assert inside[target.offset] == want, (n, name)
    assert rank(0.999, 1000) == 998 and rank(0.5, 1) == 0
    order = np.sort(rng.integers(-(10**12), 10**12, 5000))
    assert (np.diff(bucket_of(order)) >= 0).all()  # monotone


def test_spark_bucket_column_equals_numpy(spark: Any) -> None:
    from pyspark.sql import functions as F

    from srtm.pipeline.quantiles import bucket_column, bucket_of

    values = [-(10**12), -12345, -2, -1, 0, 1, 2, 3, 1023, 1024, 65_537, 10**9, 2**62]
    frame = spark.createDataFrame([(v,) for v in values], "v long")
    got = [r[0] for r in frame.select(bucket_column(F.col("v"))).collect()]
    assert got == bucket_of(np.array(values)).tolist()


# -- correlation ----------------------------------------------------------------------


def test_adjusted_rand_index_known_values() -> None:
    from srtm.pipeline.ari import adjusted_rand_index as ari

    assert ari([0, 0, 1, 1], [0, 0, 1, 1]) == 1.0
    assert ari([0, 0, 1, 1], [1, 1, 0, 0]) == 1.0  # label names do not matter
    assert math.isclose(ari([0, 0, 1, 2], [0, 0, 1, 1]), 0.5714285714285715)
    assert math.isclose(ari([0, 0, 1, 1], [0, 0, 1, 2]), 0.5714285714285715)
    assert ari([0, 0, 0, 0], [0, 1, 2, 3]) == 0.0
    assert math.isclose(ari([0, 0, 1, 1], [0, 1, 0, 1]), -0.5)
    assert ari(["a", "b", "c"], ["x", "y", "z"]) == 1.0
    with pytest.raises(ValueError):
        ari([0, 1], [0])


@pytest.mark.parametrize("spread_ms", [0.0, 2.0])
def test_clusters_find_groups_with_spread_up_to_2ms(spread_ms: float) -> None:
    """The clustering core on a workload with known groups, independent publishers among
    them, and groups at different rates."""
    from srtm.pipeline.ari import adjusted_rand_index

    pubs = [
        PublisherSpec(f"g{i // 6}-{i}", 20.0 + 10 * (i // 6), group=f"g{i // 6}") for i in range(36)
    ]
    pubs += [PublisherSpec(f"solo{i}", 40.0) for i in range(10)]
    sched = build(pubs, 20.0, spread_s=spread_ms / 1e3, seed=11)
    who = np.repeat(sched.publisher, sched.batch).astype(np.int64)
    labels, _ = correlation_job.clusters(who, sched.arrivals_ns(), correlation_job.Settings())
    truth = [p.group or p.id for p in pubs]
    assert adjusted_rand_index(truth, labels.tolist()) >= 0.9


def test_correlation_job_scores_its_proposal(outputs: dict[str, Any]) -> None:
    corr = outputs["tables"]["correlation"]
    assert list(corr.columns) == list(correlation_job.COLUMNS)
    per_topic = corr.drop_duplicates(["run", "topic"]).set_index(["run", "topic"])
    assert (per_topic["ari"].dropna() >= 0.9).all()
    assert per_topic.loc[("r1", "ta"), "groups_true"] == 5
    assert per_topic.loc[("r1", "tb"), "groups_found"] == 0  # independent publishers
    assert corr.loc[corr["topic"] == "tb", "correlation_key"].isna().all()
    keyed = corr[(corr["run"] == "r2")].groupby("true_group")["correlation_key"].nunique()
    assert (keyed == 1).all()  # each true group got one key


# -- report, summary, overwrite, CLI --------------------------------------------------


def test_report_page_and_figures(outputs: dict[str, Any]) -> None:
    report = outputs["out"] / "report"
    page = (report / "index.html").read_text()
    pngs = sorted(p.name for p in report.glob("*.png"))
    assert {"latency_p99.png", "tail_token_share.png", "adaptor_rates.png"} <= set(pngs)
    assert {"profile_burst.png", "correlation_ari.png"} <= set(pngs)
    for name in pngs:
        assert f"src='{name}'" in page
        assert (report / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = pd.read_parquet(report / "summary.parquet")
    assert summary["run"].tolist() == ["r1", "r2"]
    lat = outputs["tables"]["latency"]
    per_run = lat[lat["broker"].isna()].groupby("run")["count"].sum()
    assert summary["deliveries"].tolist() == per_run.tolist()
    assert summary["policy"].tolist() == ["srtm", "lb"]


def test_latency_summary_for_the_demo(outputs: dict[str, Any], dataset: dict[str, Any]) -> None:
    rows = latency_summary(dataset["root"], runs=["r2"])
    lat = outputs["tables"]["latency"]
    want = lat[(lat["run"] == "r2") & lat["broker"].isna()].iloc[0]
    assert len(rows) == 1
    row = rows[0]
    assert (row["run"], row["policy"], row["topic"]) == ("r2", "lb", "ta")
    assert row["p99_ns"] == want["p99_ns"] and row["count"] == want["count"]
    assert row["brokers"] == ["b0", "b1", "b2"]
    assert math.isclose(float(row["tail_token_share"]), want["tail_token_share"])  # type: ignore[arg-type]


def test_latency_counts_only_the_measured_window(
    spark: Any, dataset: dict[str, Any], tmp_path: Path
) -> None:
    """r2 again, with a window in its metadata: only messages sent in it count (and,
    on the broker side, those that arrived in it)."""
    import shutil

    src, root = dataset["root"], tmp_path / "traces"
    for side in ("subscriber", "broker"):
        shutil.copytree(src / side / "run=r2", root / side / "run=r2")
    _, deliveries, traced = dataset["frames"]["r2"]
    sent = np.sort(deliveries["t_send_ns"].to_numpy())
    start, end = int(sent[len(sent) // 4]), int(sent[3 * len(sent) // 4])
    meta = json.loads((src / "runs/r2.json").read_text())
    (root / "runs").mkdir()
    (root / "runs/r2.json").write_text(
        json.dumps(meta | {"window_start_ns": start, "window_end_ns": end})
    )
    table = latency_job.compute(spark, open_traces(root))
    row = latency_summary(root)[0]

    inside = deliveries[(deliveries["t_send_ns"] >= start) & (deliveries["t_send_ns"] < end)]
    e2e = (inside["t_recv_ns"] - inside["t_send_ns"]).to_numpy()
    assert 0 < row["count"] == len(inside) < len(deliveries)
    for name, q in QUANTILES.items():
        assert row[name] == int(np.quantile(e2e, q, method="inverted_cdf")), name
    assert row["slo_violations"] == int((e2e > dataset["slo"]["r2"]).sum())
    counts = inside.astype({"broker": str}).groupby("broker").size().to_dict()
    assert {b: v["count"] for b, v in row["per_broker"].items()} == counts  # type: ignore[union-attr]
    arrived = traced[(traced["t_arrive_ns"] >= start) & (traced["t_arrive_ns"] < end)]
    per_topic = table[table["broker"].isna()].iloc[0]
    assert per_topic["messages"] == len(arrived)


def test_rerun_overwrites_and_cli_runs_a_job(
    spark: Any, outputs: dict[str, Any], dataset: dict[str, Any]
) -> None:
    from srtm.cli import app

    out = outputs["out"]
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "pipeline",
            "profile-buckets",
            "--traces",
            str(dataset["root"]),
            "--out",
            str(out),
            "--run",
            "r2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "profiled buckets" in result.output and "profile-buckets" in result.output
    again = pd.read_parquet(out / "profile-buckets")
    assert again["run"].tolist() == ["r2"]  # replaced, not appended


def test_results_report_rows(outputs: dict[str, Any]) -> None:
    results = {r.job: r for r in outputs["results"]}
    assert list(results) == list(JOBS)
    assert results["latency"].rows == len(outputs["tables"]["latency"])
    assert results["latency"].input_rows > 0 and results["report"].rows == 2


# -- schema, empty runs ---------------------------------------------------------------


def test_schema_errors_name_the_columns(tmp_path: Path) -> None:
    side = tmp_path / "broker" / "run=x"
    side.mkdir(parents=True)
    bad = pa.table({"broker": ["b"], "topic": ["t"], "msg_id": ["m"], "publisher": ["p"],
                    "t_arrive_ns": pa.array([1], pa.int32()), "t_dispatch_ns": [3]})  # fmt: skip
    pq.write_table(bad, side / "part-0.parquet")
    with pytest.raises(SchemaError) as err:
        open_traces(tmp_path)
    text = str(err.value)
    assert "missing column 't_release_ns'" in text
    assert "'t_arrive_ns' is int32, expected int64" in text
    assert "part-0.parquet" in text


def test_cli_reports_schema_errors_before_starting_spark(tmp_path: Path) -> None:
    from srtm.cli import app

    side = tmp_path / "subscriber" / "run=x"
    side.mkdir(parents=True)
    pq.write_table(pa.table({"broker": ["b"], "t_send_ns": ["soon"]}), side / "p.parquet")
    result = CliRunner().invoke(
        app, ["pipeline", "latency", "--traces", str(tmp_path), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2
    text = " ".join(result.output.split())  # rich wraps lines
    assert "'t_send_ns' is string, expected int64" in text
    assert "missing column 'msg_id'" in text


def test_metadata_errors(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "a.json").write_text(json.dumps({"run": "a", "policy": 3}))
    with pytest.raises(SchemaError, match=r"key 'policy' is int.*missing key 'scenario'"):
        open_traces(tmp_path)
    with pytest.raises(SchemaError, match="no such trace directory"):
        open_traces(tmp_path / "nope")
    base = {"run": "a", "policy": "lb", "scenario": "s", "slo_p99_ms": 1}
    for extra, message in [
        ({"window_start_ns": 5}, "'window_start_ns' without its pair"),
        ({"window_start_ns": 5, "window_end_ns": 5}, "the window is empty"),
        ({"window_start_ns": 5, "window_end_ns": 9.5}, "must be integers"),
    ]:
        (tmp_path / "runs" / "a.json").write_text(json.dumps(base | extra))
        with pytest.raises(SchemaError, match=message):
            open_traces(tmp_path)
    (tmp_path / "runs" / "a.json").unlink()
    with pytest.raises(SchemaError, match=r"run\(s\) \['zz'\]"):
        open_traces(tmp_path, ["zz"])


def test_only_empty_runs_give_empty_outputs_with_the_schema(spark: Any, tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    (traces / "runs").mkdir(parents=True)
    (traces / "runs" / "idle.json").write_text(
        json.dumps({"run": "idle", "policy": "srtm", "scenario": "s", "slo_p99_ms": 1.0})
    )
    empty_sub = traces / "subscriber" / "run=idle"
    empty_sub.mkdir(parents=True)
    from srtm.pipeline.dataset import COLUMNS

    pq.write_table(
        pa.schema(list(COLUMNS["subscriber"].items())).empty_table(), empty_sub / "p.parquet"
    )
    out = tmp_path / "out"
    results = run_jobs(JOBS, spark, traces, out)
    assert [r.rows for r in results[:4]] == [0, 0, 0, 0]
    modules = [latency_job, adaptor_job, profile_job, correlation_job]
    for job, module in zip(JOBS, modules, strict=False):
        schema = pq.read_schema(next((out / job).glob("*.parquet")))
        assert schema.names == list(module.COLUMNS), job
    assert (out / "report" / "index.html").exists()


def test_unknown_job_is_refused(spark: Any, dataset: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown job"):
        run_job("nope", spark, open_traces(dataset["root"]), tmp_path, Options())


# -- separate executor processes ------------------------------------------------------

_CLUSTER_JOB = """
import json, sys
from pathlib import Path
from srtm.pipeline.session import SparkSettings, executor_ids, get_session, stop_session
from srtm.pipeline.session import task_processes
from srtm.pipeline.jobs import run_jobs
fast = SparkSettings(jvm_options="-XX:TieredStopAtLevel=1")
spark = get_session("local-cluster[2,1,1024]", fast)
run_jobs(["profile-buckets"], spark, Path(sys.argv[1]), Path(sys.argv[2]))
jvms = sorted({j for _, j in task_processes(spark)})
print(json.dumps({"ids": executor_ids(spark), "jvms": jvms}))
stop_session(spark)
"""


@pytest.fixture(scope="module")
def cluster_run(
    dataset: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A job on ``local-cluster[2,1,1024]`` in a child process, started early so that it
    overlaps with the in-process jobs (one SparkContext per process)."""
    out = tmp_path_factory.mktemp("cluster-out")
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLUSTER_JOB, str(dataset["root"]), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc, out
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_jobs_run_in_separate_executor_processes(
    cluster_run: tuple[subprocess.Popen[str], Path], outputs: dict[str, Any]
) -> None:
    """Two executor JVMs besides the driver; the pandas UDF job runs there and gives the
    same table as local mode."""
    proc, out = cluster_run
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-3000:]
    info = json.loads(stdout.strip().splitlines()[-1])
    assert info["ids"] == ["0", "1"]
    assert len(info["jvms"]) == 2 and os.getpid() not in info["jvms"]
    got = pd.read_parquet(out / "profile-buckets").sort_values(["run", "topic"])
    local = outputs["tables"]["profile-buckets"].sort_values(["run", "topic"])
    cols = ["run", "topic", "r", "b"]
    assert got[cols].to_numpy().tolist() == local[cols].to_numpy().tolist()


_START_AND_WAIT = """
import sys, threading, time
from srtm.pipeline.session import get_session
print("starting", flush=True)
spark = get_session()

def announce():  # once the job below runs on the JVM
    while not spark.sparkContext.statusTracker().getActiveJobsIds():
        time.sleep(0.01)
    print("started", flush=True)

threading.Thread(target=announce, daemon=True).start()
spark.range(0, 10**12).filter("id % 3 = 0").count()
"""


@pytest.mark.slow
@pytest.mark.parametrize("when", ["starting", "started"])
def test_ctrl_c_leaves_no_jvm(when: str) -> None:
    """Interrupted while its JVM starts or while a job runs, a process that uses the
    session exits on KeyboardInterrupt and no JVM outlives it."""
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-c", _START_AND_WAIT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        while (line := proc.stdout.readline()) and line.strip() != when:
            pass
        assert line.strip() == when, proc.stderr.read() if proc.stderr else ""
        # "starting": interrupt once the JVM exists, before it is up; "started": the job
        # already runs on it.
        jvms = eventually.blocking(lambda: _jvms_of(proc.pid), "the JVM started", timeout=30)
        if when == "starting":
            time.sleep(0.3)  # when to interrupt (within the JVM's seconds of start-up)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err

    # The JVM got the SIGINT too and may still be shutting down as its parent exits (on
    # a loaded machine, seconds): left behind is one still running after that.
    def left() -> list[int]:
        return [p for p in jvms if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]

    eventually.blocking(left, "no JVM left", until=lambda pids: not pids, timeout=30)


def _jvms_of(parent: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(parent), "-f", "SparkSubmit"], capture_output=True)
    return [int(x) for x in out.stdout.split()]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
