"""``srtm.etcd_cluster`` starts real etcd clusters, restarts and stops their members and
leaves nothing running; with each member in its own network namespace, an etcd minority
cut off by tests/netns.py cannot write while the majority can, and catches up after the
heal. Requests go through etcd's JSON gateway with urllib (keys and values base64)."""

from __future__ import annotations

import base64
import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from netns import Network
from srtm.etcd_cluster import EtcdCluster, EtcdClusterError

#: How long one request to a member may take (a partitioned one never answers).
REQUEST_S = 2.0
#: How long an election or a catch-up may take (election timeout 1 s, heartbeat 100 ms).
SETTLE_S = 20.0


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def call(
    url: str, path: str, body: dict[str, object], timeout: float = REQUEST_S
) -> dict[str, object]:
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        doc: dict[str, object] = json.loads(resp.read())
        return doc


def put(url: str, key: str, value: str, timeout: float = REQUEST_S) -> None:
    call(url, "/v3/kv/put", {"key": b64(key), "value": b64(value)}, timeout)


def get(url: str, key: str, *, serializable: bool = False) -> str | None:
    """The key's value read through ``url`` (linearizable unless ``serializable``:
    then the member's own, possibly stale, copy)."""
    doc = call(url, "/v3/kv/range", {"key": b64(key), "serializable": serializable})
    kvs = doc.get("kvs") or []
    assert isinstance(kvs, list)
    return base64.b64decode(kvs[0]["value"]).decode() if kvs else None


def eventually(check: Callable[[], bool], what: str, timeout: float = SETTLE_S) -> None:
    """Retry ``check`` (requests failing count as not yet) until it holds."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, ValueError) as e:
            last = e
        time.sleep(0.1)
    pytest.fail(f"not within {timeout} s: {what} (last error: {last})")


def test_a_three_member_cluster_survives_a_kill_and_a_restart(tmp_path: Path) -> None:
    cluster = EtcdCluster(tmp_path, 3).start_all()
    try:
        urls = cluster.client_urls
        assert cluster.endpoints == ",".join(u.removeprefix("http://") for u in urls)
        put(urls[0], "k", "1")
        assert get(urls[2], "k") == "1"  # linearizable: through the leader's log
        cluster.kill(0)
        assert not cluster.nodes[0].running()
        eventually(lambda: put(urls[1], "k", "2") is None, "the majority writes")
        cluster.start(0)  # its data dir: it rejoins and catches up
        assert get(urls[0], "k") == "2"
        cluster.stop(1)
        stopped = cluster.nodes[1].process
        assert stopped is not None and stopped.returncode == -signal.SIGTERM  # not killed
    finally:
        cluster.stop_all()
    assert all(n.process is not None and n.process.poll() is not None for n in cluster.nodes)


def test_a_missing_etcd_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EtcdClusterError, match="cannot start etcd member m0"):
        EtcdCluster(tmp_path, 1, binary=str(tmp_path / "no-etcd")).start_all()


def test_a_member_that_cannot_start_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    cluster = EtcdCluster(tmp_path, 2, hosts=["127.0.0.1", "192.0.2.1"])  # not ours: bind fails
    with pytest.raises(EtcdClusterError, match=r"m1 .* did not become healthy") as e:
        cluster.start_all()
    assert "192.0.2.1" in str(e.value)  # the log's end names the address it could not take
    assert not any(n.running() for n in cluster.nodes)


def test_sizes_must_agree(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hosts has 1 entries for 3 members"):
        EtcdCluster(tmp_path, 3, hosts=["127.0.0.1"])


@pytest.mark.slow
def test_an_etcd_minority_cannot_write_and_catches_up_after_the_heal(
    netns: Network, tmp_path: Path
) -> None:
    hosts = [netns.add_host(f"e{i}") for i in range(3)]
    cluster = EtcdCluster(
        tmp_path, 3, hosts=[h.ip for h in hosts], command_prefixes=[h.command_prefix for h in hosts]
    ).start_all()
    try:
        urls = cluster.client_urls
        for i, url in enumerate(urls):  # a put through any member
            put(url, f"k{i}", "before")
            assert get(urls[(i + 1) % 3], f"k{i}") == "before"

        netns.isolate(hosts[2])  # the minority: one of three
        with pytest.raises((urllib.error.URLError, TimeoutError)):
            put(urls[2], "minority", "lost", timeout=3.0)  # no quorum behind it
        eventually(lambda: put(urls[0], "k", "during") is None, "the majority writes")
        assert get(urls[1], "k") == "during"
        assert get(urls[2], "k", serializable=True) is None  # it has not seen it
        assert not cluster.healthy(2)

        netns.rejoin(hosts[2])
        eventually(lambda: get(urls[2], "k", serializable=True) == "during", "the catch-up")
        eventually(lambda: cluster.healthy(2), "the minority healthy again")
        put(urls[2], "k", "after")
        assert get(urls[0], "k") == "after"
    finally:
        cluster.stop_all()
