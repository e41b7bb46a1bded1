"""The one place a SparkSession is made: local and quiet by default, any master on request.

Local masters (``local[…]``, ``local-cluster[…]``) bind the driver to 127.0.0.1 so that
nothing listens beyond the host. Executors run this very interpreter
(``PYSPARK_PYTHON``), so the pandas UDFs import ``srtm`` from the same environment.
Nothing is fetched from Maven (no ``spark.jars.packages``).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
LOOPBACK = "127.0.0.1"

#: log4j2 configuration for driver and executors: warnings and errors only, and not
#: even those from a few loggers that warn about nothing actionable on one host.
_LOG4J2 = """\
status = error
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
logger.blas.name = dev.ludovic.netlib
logger.blas.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
logger.memory.name = org.apache.spark.sql.execution.python
logger.memory.level = error
"""


@dataclass(frozen=True)
class SparkSettings:
    """What the factory needs to know; the defaults suit one 2-core machine."""

    master: str = DEFAULT_MASTER
    app_name: str = "srtm-pipeline"
    #: Heap of the driver JVM, which in local mode also runs the tasks.
    driver_memory: str = "2g"
    executor_memory: str = "1g"
    #: Extra JVM flags for driver and executors.
    jvm_options: str = ""


def is_local(master: str) -> bool:
    return master.startswith("local")


def _log_config() -> Path:
    path = Path(tempfile.gettempdir()) / f"srtm-spark-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != _LOG4J2:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(_LOG4J2)
        tmp.replace(path)
    return path


def _environment(master: str) -> None:
    # Read by spark-submit and by every executor it starts: they must run this interpreter.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if is_local(master) or "SPARK_LOCAL_IP" not in os.environ:
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK


def get_session(master: str | None = None, settings: SparkSettings | None = None) -> SparkSession:
    """The active session if there is one on the same master, else a new one.

    A session on another master is stopped first, JVM and all (one SparkContext per
    process, and JVM flags such as the heap apply only to a new JVM).
    """
    from pyspark.sql import SparkSession

    cfg = settings or SparkSettings()
    wanted = master or cfg.master
    active = SparkSession.getActiveSession()
    if active is not None:
        if master is None or active.sparkContext.master == wanted:
            return active
        stop_session(active)
    _environment(wanted)
    log = f"-Dlog4j2.configurationFile=file:{_log_config()} {cfg.jvm_options}".strip()
    builder = (
        SparkSession.builder.master(wanted)
        .appName(cfg.app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", cfg.driver_memory)
        .config("spark.executor.memory", cfg.executor_memory)
        .config("spark.driver.extraJavaOptions", log)
        .config("spark.executor.extraJavaOptions", log)
        .config("spark.sql.shuffle.partitions", str(max(2, os.cpu_count() or 2)))
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
    )
    if os.environ["SPARK_LOCAL_IP"] == LOOPBACK:
        builder = builder.config("spark.driver.host", LOOPBACK).config(
            "spark.driver.bindAddress", LOOPBACK
        )
    before = _children()
    try:
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
    except BaseException:  # Ctrl-C while the JVM starts, or a failed start: no JVM left
        _reap_gateway(kill=True)
        _kill_new_jvms(before)
        raise
    if threading.current_thread() is threading.main_thread():
        # pyspark installs its own Ctrl-C handler, which calls into the JVM in the middle
        # of the command the main thread waits on and buries the interrupt under py4j
        # tracebacks. Python's own lets callers stop the session in a `finally`.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return spark


def stop_session(spark: SparkSession, timeout_s: float = 30.0) -> None:
    """Stop the session *and* its JVM, and reap it: a JVM left to exit when this process
    does can linger as a zombie where PID 1 does not reap orphans (containers)."""
    try:
        spark.stop()
    except Exception:  # a gateway already broken (interrupted mid-command): kill the JVM
        _reap_gateway(kill=True, timeout_s=timeout_s)
    else:
        _reap_gateway(kill=False, timeout_s=timeout_s)


def _children() -> set[int]:
    """Pids of this process's children (Linux /proc; empty elsewhere)."""
    me, pids = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == me:
                pids.add(int(stat.parent.name))
    return pids


def _kill_new_jvms(before: set[int]) -> None:
    """Kill and reap the Spark JVMs started since ``before``: interrupted before it knew
    its JVM, pyspark lost the handle, and the JVM outlives us."""
    for pid in _children() - before:
        with contextlib.suppress(OSError):
            if b"org.apache.spark.deploy.SparkSubmit" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


def _reap_gateway(kill: bool, timeout_s: float = 30.0) -> None:
    """Shut the py4j gateway, end its JVM (closing its stdin ends it; ``kill`` if the
    gateway may be broken) and wait for it."""
    import subprocess

    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    # What spark.stop() resets, in case it did not get there: the next session starts anew.
    SparkContext._gateway = None
    SparkContext._jvm = None
    SparkContext._active_spark_context = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    if gateway is not None:
        with contextlib.suppress(Exception):
            gateway.shutdown()
    if proc is None:
        return
    if kill:
        proc.kill()
    elif proc.stdin is not None:
        proc.stdin.close()  # the gateway JVM exits when its stdin closes
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def size_shuffle(spark: SparkSession, input_bytes: int, bytes_per_partition: int = 64 << 20) -> int:
    """Set ``spark.sql.shuffle.partitions`` for an input of ``input_bytes``: one partition
    per ``bytes_per_partition``, at least one per core, at most 200 (AQE merges the
    small ones). Returns the number set."""
    cores = spark.sparkContext.defaultParallelism
    n = min(200, max(cores, math.ceil(input_bytes / bytes_per_partition)))
    spark.conf.set("spark.sql.shuffle.partitions", str(n))
    return n


def executor_ids(spark: SparkSession) -> list[str]:
    """Ids of the executor processes the session has (none in ``local`` mode, where the
    driver JVM runs the tasks itself)."""
    master = spark.sparkContext.master or ""
    if master == "local" or master.startswith("local["):
        return []  # and asking would log a warning
    jsc = spark.sparkContext._jsc  # no public API lists executors
    assert jsc is not None
    ids = jsc.sc().getExecutorIds()  # a Scala Seq
    return sorted(str(ids.apply(i)) for i in range(ids.size()))


def task_processes(spark: SparkSession, tasks: int = 8) -> list[tuple[int, int]]:
    """(Python worker pid, pid of the JVM that started it) seen by ``tasks`` tiny tasks:
    distinct JVM pids mean distinct executor processes."""

    rdd = spark.sparkContext.parallelize(range(tasks), tasks)
    return sorted(set(rdd.mapPartitions(_pids).collect()))


def _pids(_: object) -> list[tuple[int, int]]:
    # Worker → pyspark daemon → JVM: the JVM is the daemon's parent.
    pid = os.getpid()
    daemon = os.getppid()
    return [(pid, _parent(daemon))]


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


@dataclass(frozen=True)
class SessionInfo:
    """Where a session runs its tasks (``srtm pipeline info``)."""

    version: str
    master: str | None
    #: Pid of the driver JVM ("?" when pyspark does not say).
    driver_jvm: str
    #: Executor ids (none in local mode, where the driver JVM runs the tasks).
    executors: list[str]
    #: (Python worker pid, pid of the JVM that started it), from a few tiny tasks.
    tasks: list[tuple[int, int]]


def session_info(settings: SparkSettings) -> SessionInfo:
    """Starts a session on ``settings``, asks where tasks run, and stops it."""
    from pyspark import SparkContext

    spark = get_session(settings.master, settings)
    ids = executor_ids(spark)
    driver_jvm = getattr(getattr(SparkContext._gateway, "proc", None), "pid", "?")
    pids = task_processes(spark)
    info = SessionInfo(spark.version, spark.sparkContext.master, str(driver_jvm), ids, pids)
    stop_session(spark)
    return info
