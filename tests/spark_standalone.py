"""A Spark standalone cluster on 127.0.0.1 for tests: one master and one worker, started
with the installed pyspark's own ``bin/spark-class`` (pip's pyspark has no
``sbin/start-master.sh``), on ephemeral ports read back from their logs.

Each daemon runs in its own process group, so that stopping the worker's group also ends
the executors and Python workers it started. Nothing outside ``root`` is written, and
the master's REST submission server (fixed port 6066) is off.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_WEB_PORT = re.compile(r"Bound MasterWebUI to \S+ and started at http://\S+:(\d+)")
_PROPERTIES = """\
spark.master.rest.enabled false
spark.worker.cleanup.enabled false
"""


def spark_home() -> Path:
    """The installed pyspark's Spark: the same version as the driver, whatever SPARK_HOME
    says."""
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass
class Standalone:
    """A running master and worker."""

    root: Path
    master_url: str = ""
    web_url: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def status(self) -> dict[str, Any]:
        """The master's state as its web UI's ``/json/`` gives it (workers, applications)."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as reply:
            doc: dict[str, Any] = json.load(reply)
        return doc

    def log(self, name: str) -> str:
        path = self.root / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, timeout_s: float = 15.0) -> None:
        """End every daemon's process group (worker first: its executors go with it)."""
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout_s)
            # Executors may outlive a worker that got TERM; the group goes in any case.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            _await_gone(proc.pid, timeout_s)
        self.procs.clear()


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a member."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _await_gone(pgid: int, timeout_s: float) -> None:
    # Killed members that are not our children die (and are reaped) a moment later.
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _srtm_root() -> str:
    import srtm

    return str(Path(srtm.__file__).resolve().parents[1])


def _environment(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    conf = root / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_CONF_DIR=str(conf),  # empty: no site spark-defaults.conf leaks in
        SPARK_LOCAL_IP=LOOPBACK,  # RPC and web UIs bind to loopback only
        SPARK_LOG_DIR=str(root / "logs"),
        SPARK_WORKER_DIR=str(root / "work"),
        SPARK_DAEMON_MEMORY="256m",
        # C1 only: short-lived daemons start and warm faster.
        SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1",
        # Executors' Python workers: this interpreter, importing this srtm.
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(filter(None, [_srtm_root(), env.get("PYTHONPATH")])),
    )
    return env


def _daemon(root: Path, name: str, args: list[str]) -> subprocess.Popen[bytes]:
    (root / "logs").mkdir(parents=True, exist_ok=True)
    (root / "work").mkdir(parents=True, exist_ok=True)
    with (root / "logs" / f"{name}.log").open("wb") as log:
        return subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_environment(root),
            cwd=root,
            start_new_session=True,
        )


def _await(cluster: Standalone, what: str, check: Callable[[], Any], timeout_s: float) -> Any:
    """Poll ``check`` until it returns something true; a daemon that exits, or the
    deadline, fails with the logs."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        dead = [p.args for p in cluster.procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            logs = "\n".join(cluster.log(n)[-2000:] for n in ("master", "worker"))
            reason = f"exited: {dead}" if dead else f"not within {timeout_s} s"
            raise RuntimeError(f"standalone cluster: {what} {reason}\n{logs}")
        time.sleep(0.2)


def _workers_alive(cluster: Standalone) -> int:
    try:
        return int(cluster.status().get("aliveworkers", 0))
    except OSError:
        return 0


@contextlib.contextmanager
def standalone_cluster(
    root: Path, cores: int = 1, memory: str = "1g", timeout_s: float = 90.0
) -> Iterator[Standalone]:
    """A master and one worker of ``cores`` and ``memory``, registered with each other;
    both stopped on the way out, whatever happened."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "conf").mkdir(exist_ok=True)
    props = root / "conf" / "spark-defaults.conf"
    props.write_text(_PROPERTIES)
    cluster = Standalone(root)
    try:
        ports = ["--host", LOOPBACK, "--port", "0", "--webui-port", "0"]
        master = ["org.apache.spark.deploy.master.Master", *ports, "--properties-file", str(props)]
        cluster.procs.append(_daemon(root, "master", master))

        def master_up() -> tuple[str, str] | None:
            text = cluster.log("master")
            url, web = _MASTER_URL.search(text), _WEB_PORT.search(text)
            return (url[1], f"http://{LOOPBACK}:{web[1]}") if url and web else None

        cluster.master_url, cluster.web_url = _await(cluster, "master start", master_up, timeout_s)
        worker = ["org.apache.spark.deploy.worker.Worker", *ports]
        worker += ["--cores", str(cores), "--memory", memory, "--work-dir", str(root / "work")]
        worker += ["--properties-file", str(props), cluster.master_url]
        cluster.procs.append(_daemon(root, "worker", worker))
        _await(cluster, "worker registration", lambda: _workers_alive(cluster), timeout_s)
        yield cluster
    finally:
        cluster.stop()
