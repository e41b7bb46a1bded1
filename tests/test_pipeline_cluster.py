"""``srtm pipeline`` on a real Spark standalone cluster: a master and a worker started from
the installed pyspark's ``bin/spark-class`` on 127.0.0.1 (tests/spark_standalone.py), the
job submitted by the command line (``--master spark://…``) in a child process, since this
process holds the suite's one local SparkSession.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from spark_standalone import group_alive, standalone_cluster
from srtm.pipeline.jobs import run_jobs
from srtm.pipeline.synth import RunSpec, Sends, simulate, write

pytestmark = pytest.mark.slow

JOB = "profile-buckets"  # a pandas UDF: the executors' Python imports srtm


def small_traces(root: Path) -> Path:
    """One run, two topics on two brokers, 6000 messages over 5 s."""
    rng = np.random.default_rng(3)
    n = 6000
    sends = Sends(
        topic=rng.choice(np.array(["ta", "tb"], dtype=object), n),
        broker=rng.choice(np.array(["b0", "b1"], dtype=object), n),
        publisher=np.array([f"p{i}" for i in rng.integers(0, 12, n)], dtype=object),
        group=np.full(n, None, dtype=object),
        t_send_ns=np.sort(rng.integers(0, 5_000_000_000, n)).astype(np.int64),
    )
    write(root, simulate(RunSpec("r1", "srtm", slo_p99_ms=2.0), sends, seed=1), files=2)
    return root


def test_cli_job_on_a_standalone_cluster_equals_local_mode(spark: Any, tmp_path: Path) -> None:
    traces = small_traces(tmp_path / "traces")
    out = tmp_path / "out"
    env = dict(os.environ)
    env.pop("SPARK_LOCAL_IP", None)  # the session factory binds the driver to loopback
    with standalone_cluster(tmp_path / "cluster") as cluster:
        argv = [sys.executable, "-m", "srtm", "pipeline", JOB, "--traces", str(traces)]
        argv += ["--out", str(out), "--master", cluster.master_url, "--driver-memory", "512m"]
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        try:
            # Meanwhile, the same job in local mode on the suite's session.
            run_jobs([JOB], spark, traces, tmp_path / "local")
            stdout, stderr = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, stderr[-3000:] + cluster.log("worker")[-3000:]
        apps = cluster.status()["completedapps"]
        daemons = [p.pid for p in cluster.procs]
    # The job ran as a standalone application on the worker's executor.
    assert [(a["name"], a["state"]) for a in apps] == [("srtm-pipeline", "FINISHED")]
    flat = " ".join(stdout.split())  # rich wraps the title
    assert f"application {apps[0]['id']}" in flat and re.match(r"app-\d+-\d+$", apps[0]["id"])
    assert "1 executor process(es) ['0']" in flat
    keys = ["run", "topic"]
    got = pd.read_parquet(out / JOB).sort_values(keys).reset_index(drop=True)
    local = pd.read_parquet(tmp_path / "local" / JOB).sort_values(keys).reset_index(drop=True)
    assert len(got) == 2
    pd.testing.assert_frame_equal(got, local)
    # Master, worker, executor and its Python workers: all gone with their groups.
    assert not any(group_alive(pid) for pid in daemons)
