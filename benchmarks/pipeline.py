"""The Spark pipeline on a generated 10-million-message trace, job 1 against DuckDB.

Run with ``.venv/bin/python benchmarks/pipeline.py`` (``--help`` for options). It writes a
synthetic trace dataset (``srtm.pipeline.synth``: 2 runs, 8 topics, 100 publishers per
topic in correlated groups of 10; each message has a broker row and a subscriber row, so
``--messages 10_000_000`` reads 20 million rows), starts one local Spark session, warms
its JIT on a small trace, then times every job once. Job 1 (``latency``) is also computed
by a single-process DuckDB query giving the same table, ``--repeat`` times interleaved
with Spark's, and the two tables are checked to agree exactly (DuckDB's ``quantile_disc``
is the same nearest-rank definition). Peak memory is the largest resident set, sampled
every 0.2 s, of this process and all its descendants (driver JVM, Python UDF workers) for
the Spark jobs, and of this process alone (where DuckDB runs) for DuckDB.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

from srtm.pipeline.dataset import Traces, open_traces
from srtm.pipeline.jobs import JOBS, READS, run_job
from srtm.pipeline.latency import compute as spark_latency
from srtm.pipeline.session import SparkSettings, get_session, stop_session
from srtm.pipeline.synth import RunSpec, Sends, simulate, write
from srtm.workload import PublisherSpec, build

TOPICS = 8
PUBLISHERS = 100
GROUP = 10
DURATION_S = 60.0
RUNS = (("lb", "lb", 4), ("srtm", "srtm", 2))
TARGET_RATIO = 5.0


# -- data -----------------------------------------------------------------------------


def generate(root: Path, messages: int, files: int = 8) -> None:
    """``messages`` messages over two runs (policies lb on 4 brokers, srtm on 2)."""
    rate = messages / len(RUNS) / DURATION_S / TOPICS / PUBLISHERS
    for run, policy, brokers in RUNS:
        cols: dict[str, list[Any]] = {k: [] for k in ("topic", "broker", "pub", "group", "t")}
        for ti in range(TOPICS):
            pubs = [
                PublisherSpec(f"t{ti}p{i}", rate, group=f"t{ti}g{i // GROUP}")
                for i in range(PUBLISHERS)
            ]
            sched = build(pubs, DURATION_S, spread_s=0.001, seed=ti)
            who = np.repeat(sched.publisher, sched.batch)
            ids = np.array([p.id for p in pubs], dtype=object)
            groups = np.array([p.group for p in pubs], dtype=object)
            names = np.array([f"b{j}" for j in range(brokers)], dtype=object)
            cols["topic"].append(np.full(len(who), f"topic{ti}", dtype=object))
            cols["broker"].append(names[who % brokers])
            cols["pub"].append(ids[who])
            cols["group"].append(groups[who])
            cols["t"].append(sched.arrivals_ns())
        c = {k: np.concatenate(v) for k, v in cols.items()}
        sends = Sends(c["topic"], c["broker"], c["pub"], c["group"], c["t"])
        write(root, simulate(RunSpec(run, policy, burst=20.0), sends, seed=1), files=files)


# -- memory ---------------------------------------------------------------------------


def _tree_rss_kb(root: int) -> int:
    """Resident set of ``root`` and all its descendants, kB (Linux /proc)."""
    parents: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        pid = int(entry)
        parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(pid)
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss[pid] = int(line.split()[1])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(parents.get(pid, []))
    return total


def _own_rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@contextmanager
def peak_rss(tree: bool = True) -> Iterator[Callable[[], float]]:
    """Samples the RSS of this process (and its descendants if ``tree``) while the block
    runs; yields a getter (MB)."""
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            rss = _tree_rss_kb(os.getpid()) if tree else _own_rss_kb()
            peak[0] = max(peak[0], rss)
            stop.wait(0.2)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield lambda: peak[0] / 1024
    finally:
        stop.set()
        thread.join()


# -- DuckDB ---------------------------------------------------------------------------

DUCK_QUERY = """
WITH s AS (
  SELECT run, topic, broker, msg_id, t_recv_ns - t_send_ns AS e2e
  FROM read_parquet('{sub}/*/*.parquet', hive_partitioning = true)
  WHERE topic IS NOT NULL AND broker IS NOT NULL),
b AS (
  SELECT run, topic, broker, msg_id, t_release_ns - t_arrive_ns AS tw,
         t_dispatch_ns - t_release_ns AS proc
  FROM read_parquet('{bro}/*/*.parquet', hive_partitioning = true)),
meta AS (SELECT * FROM (VALUES {meta}) m(run, slo_ns)),
q AS (
  SELECT run, topic, broker, grouping(broker) AS lvl, count(*) AS count,
         quantile_disc(e2e, [0.5, 0.95, 0.99, 0.999]) AS qs, max(e2e) AS max_ns,
         sum(CASE WHEN e2e > slo_ns THEN 1 ELSE 0 END) AS slo_violations
  FROM s JOIN meta USING (run)
  GROUP BY GROUPING SETS ((run, topic, broker), (run, topic))),
bs AS (
  SELECT run, topic, broker, grouping(broker) AS lvl, count(*) AS messages,
         sum(CASE WHEN tw > 0 THEN 1 ELSE 0 END) AS delayed
  FROM b GROUP BY GROUPING SETS ((run, topic, broker), (run, topic))),
tail AS (
  SELECT s.run, s.topic, s.broker, s.msg_id, s.e2e,
         s.e2e >= qb.qs[3] AS in_b, s.e2e >= qt.qs[3] AS in_t
  FROM s
  JOIN q qb ON qb.lvl = 0 AND qb.run = s.run AND qb.topic = s.topic AND qb.broker = s.broker
  JOIN q qt ON qt.lvl = 1 AND qt.run = s.run AND qt.topic = s.topic
  WHERE s.e2e >= least(qb.qs[3], qt.qs[3])),
tj AS (SELECT tail.*, b.tw FROM tail JOIN b USING (run, broker, msg_id)),
tb AS (
  SELECT run, topic, broker, 0 AS lvl, sum(in_b::INT) AS tail_count,
         sum(CASE WHEN in_b THEN tw END) / sum(CASE WHEN in_b THEN e2e END) AS tail_token_share
  FROM tj GROUP BY run, topic, broker
  UNION ALL
  SELECT run, topic, NULL, 1, sum(in_t::INT),
         sum(CASE WHEN in_t THEN tw END) / sum(CASE WHEN in_t THEN e2e END)
  FROM tj GROUP BY run, topic)
SELECT q.run, q.topic, q.broker, q.count, q.qs[1] AS p50_ns, q.qs[2] AS p95_ns,
       q.qs[3] AS p99_ns, q.qs[4] AS p999_ns, q.max_ns, q.slo_violations, bs.messages,
       bs.delayed, tb.tail_count, tb.tail_token_share
FROM q
LEFT JOIN bs ON bs.lvl = q.lvl AND bs.run = q.run AND bs.topic = q.topic
     AND bs.broker IS NOT DISTINCT FROM q.broker
LEFT JOIN tb ON tb.lvl = q.lvl AND tb.run = q.run AND tb.topic = q.topic
     AND tb.broker IS NOT DISTINCT FROM q.broker
"""


#: A lower bound for DuckDB: the join and the quantiles only, none of the rest of the table.
DUCK_BARE = """
WITH s AS (
  SELECT run, topic, broker, msg_id, t_recv_ns - t_send_ns AS e2e
  FROM read_parquet('{sub}/*/*.parquet', hive_partitioning = true)),
b AS (
  SELECT run, broker, msg_id, t_release_ns - t_arrive_ns AS tw
  FROM read_parquet('{bro}/*/*.parquet', hive_partitioning = true))
SELECT run, topic, broker, count(*), quantile_disc(e2e, [0.5, 0.95, 0.99, 0.999]), max(tw)
FROM s JOIN b USING (run, broker, msg_id)
GROUP BY GROUPING SETS ((run, topic, broker), (run, topic))
"""


def duck_bare(traces: Traces) -> float:
    """Seconds DuckDB takes for ``DUCK_BARE``."""
    import duckdb

    sql = DUCK_BARE.format(sub=traces.root / "subscriber", bro=traces.root / "broker")
    with duckdb.connect() as con:
        start = time.perf_counter()
        con.execute(sql).fetchall()
        return time.perf_counter() - start


def duck_latency(traces: Traces) -> pd.DataFrame:
    import duckdb

    meta = ", ".join(f"('{r.run}', {r.slo_ns})" for r in traces.runs)
    sql = DUCK_QUERY.format(sub=traces.root / "subscriber", bro=traces.root / "broker", meta=meta)
    with duckdb.connect() as con:
        return con.execute(sql).df()


def agree(spark: pd.DataFrame, duck: pd.DataFrame) -> str:
    """Whether the two latency tables hold the same numbers (exact where integer)."""
    keys = ["run", "topic", "broker"]
    s = spark.astype({"broker": object}).fillna({"broker": "*"})
    d = duck.astype({"broker": object}).fillna({"broker": "*"})
    m = s.merge(d, on=keys, suffixes=("", "_duck"))
    if len(m) != len(s) or len(m) != len(d):
        return f"no: {len(s)} Spark rows, {len(d)} DuckDB rows, {len(m)} in common"
    exact = ["count", "p50_ns", "p95_ns", "p99_ns", "p999_ns", "max_ns", "slo_violations"]
    exact += ["messages", "tail_count"]
    for col in exact:
        if not (m[col].astype("int64") == m[f"{col}_duck"].astype("int64")).all():
            return f"no: column {col} differs"
    share = m["tail_token_share"].astype(float)
    if not np.allclose(share, m["tail_token_share_duck"].astype(float), rtol=1e-9):
        return "no: tail_token_share differs"
    return f"yes ({len(m)} rows, {len(exact)} integer columns exact)"


# -- the run --------------------------------------------------------------------------


@dataclass
class JobTiming:
    job: str
    seconds: float
    rows_in: int
    rows_out: int
    peak_mb: float

    @property
    def rows_per_s(self) -> float:
        return self.rows_in / self.seconds if self.seconds > 0 else 0.0


def warm_up(spark: Any, work: Path) -> float:
    """All jobs once on a small trace: JIT and codegen caches warm, as in a long session."""
    start = time.perf_counter()
    small = work / "warm-traces"
    generate(small, 200_000, files=2)
    traces = open_traces(small)
    for job in JOBS:
        run_job(job, spark, traces, work / "warm-out")
    return time.perf_counter() - start


def main(
    messages: Annotated[
        int, typer.Option(help="Messages in the trace (each: a broker and a subscriber row).")
    ] = 10_000_000,
    repeat: Annotated[
        int, typer.Option(help="Timed runs of job 1 in Spark and in DuckDB (interleaved).")
    ] = 3,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[*]",
    driver_memory: Annotated[str, typer.Option(help="Spark driver heap.")] = "4g",
    workdir: Annotated[
        Path | None, typer.Option(help="Keep traces and outputs here (default: a temp dir).")
    ] = None,
    as_json: Annotated[
        Path | None, typer.Option("--json", help="Also write the figures to this JSON file.")
    ] = None,
) -> None:
    """Time every pipeline job on a generated trace; job 1 against DuckDB."""
    console = Console(width=None if Console().is_terminal else 120)
    work = workdir or Path(tempfile.mkdtemp(prefix="srtm-pipeline-bench-"))
    traces_dir, out = work / "traces", work / "out"
    try:
        start = time.perf_counter()
        if not (traces_dir / "runs").is_dir():
            generate(traces_dir, messages)
        gen_s = time.perf_counter() - start
        traces = open_traces(traces_dir)
        start = time.perf_counter()
        spark = get_session(master, SparkSettings(master=master, driver_memory=driver_memory))
        session_s = time.perf_counter() - start
        warm_s = warm_up(spark, work)
        console.print(
            f"trace: {traces.rows('broker'):,} broker + {traces.rows('subscriber'):,} "
            f"subscriber rows ({(traces.bytes('broker') + traces.bytes('subscriber')) / 2**20:,.0f}"
            f" MiB Parquet), generated in {gen_s:.1f} s; Spark {spark.version} on {master} "
            f"started in {session_s:.1f} s; warm-up {warm_s:.1f} s; {os.cpu_count()} CPUs"
        )
        timings = []
        for job in JOBS:
            with peak_rss() as peak:
                result = run_job(job, spark, traces, out)
            rows_in = sum(traces.rows(side) for side in READS[job])
            timings.append(JobTiming(job, result.seconds, rows_in, result.rows, peak()))
        spark_s, duck_s, bare_s = [], [], []
        spark_table = duck_table = pd.DataFrame()
        duck_peak = 0.0
        for _ in range(repeat):
            t0 = time.perf_counter()
            spark_table = spark_latency(spark, traces)
            spark_s.append(time.perf_counter() - t0)
            with peak_rss(tree=False) as peak:  # DuckDB runs in this process; not the JVM
                t0 = time.perf_counter()
                duck_table = duck_latency(traces)
                duck_s.append(time.perf_counter() - t0)
            duck_peak = max(duck_peak, peak())
            bare_s.append(duck_bare(traces))
        verdict = agree(spark_table, duck_table)
        corr = pd.read_parquet(out / "correlation").drop_duplicates(["run", "topic"])
        console.print(
            f"correlation: adjusted Rand index {corr['ari'].min():.3f}–{corr['ari'].max():.3f} "
            f"over {len(corr)} (run, topic) pairs (groups of {GROUP}, spread 1 ms)"
        )
        stop_session(spark)
    finally:
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    show(console, timings, spark_s, duck_s, bare_s, duck_peak, verdict)
    if as_json is not None:
        doc = {
            "messages": messages,
            "jobs": [asdict(t) | {"rows_per_s": t.rows_per_s} for t in timings],
            "latency_spark_s": spark_s,
            "latency_duckdb_s": duck_s,
            "duckdb_join_and_quantiles_only_s": bare_s,
            "duckdb_peak_mb": duck_peak,
            "agree": verdict,
            "session_s": session_s,
            "generate_s": gen_s,
        }
        as_json.write_text(json.dumps(doc, indent=2))


def show(
    console: Console,
    timings: list[JobTiming],
    spark_s: list[float],
    duck_s: list[float],
    bare_s: list[float],
    duck_peak: float,
    verdict: str,
) -> None:
    table = Table(title="srtm pipeline jobs (one timed run each, after a warm-up)")
    for name in ("job", "seconds", "rows in", "rows/s", "rows out", "peak RSS MB"):
        table.add_column(name, justify="left" if name == "job" else "right")
    for t in timings:
        table.add_row(
            t.job,
            f"{t.seconds:.1f}",
            f"{t.rows_in:,}",
            f"{t.rows_per_s:,.0f}",
            f"{t.rows_out:,}",
            f"{t.peak_mb:,.0f}",
        )
    console.print(table)
    ratio = Table(
        title=f"job 1 (latency table) — Spark vs single-process DuckDB, {len(spark_s)} runs each",
        caption=f"same table from Spark and DuckDB: {verdict}. 'join + quantiles only' "
        "computes less than the table (a lower bound for DuckDB).",
    )
    for name in ("engine", "median s", "min s", "max s", "peak RSS MB", "ratio (median)"):
        ratio.add_column(name, justify="left" if name == "engine" else "right")
    d_med, s_med = statistics.median(duck_s), statistics.median(spark_s)
    ratio.add_row(
        "DuckDB",
        f"{d_med:.2f}",
        f"{min(duck_s):.2f}",
        f"{max(duck_s):.2f}",
        f"{duck_peak:,.0f}",
        "1.0×",
    )
    b_med = statistics.median(bare_s)
    ratio.add_row(
        "DuckDB, join + quantiles only",
        f"{b_med:.2f}",
        f"{min(bare_s):.2f}",
        f"{max(bare_s):.2f}",
        "",
        f"Spark is {s_med / b_med:.1f}× this",
    )
    lat_peak = next(t.peak_mb for t in timings if t.job == "latency")
    ratio.add_row(
        "Spark",
        f"{s_med:.2f}",
        f"{min(spark_s):.2f}",
        f"{max(spark_s):.2f}",
        f"{lat_peak:,.0f}",
        f"{s_med / d_med:.1f}× (target ≤ {TARGET_RATIO:.0f}×)",
    )
    console.print(ratio)


if __name__ == "__main__":
    typer.run(main)
