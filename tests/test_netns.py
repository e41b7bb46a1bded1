"""The partition harness (tests/netns.py) partitions: a cut loses packets both ways (a
connect times out, it is not refused), touches no other link, stalls an open connection
rather than resetting it, and ``heal`` restores all of it. Also for the proxy fallback."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from netns import Host, Network, ProxyNetwork, _base36, netns_unavailable
from srtm.etcd_cluster import free_ports
from srtm.launch import new_token, start_broker, start_controller
from support import eventually

#: An echo server on (address, port), one thread per connection; "ready" once listening.
ECHO_SERVER = """
import socket, sys, threading
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
def echo(c):
    with c:
        while data := c.recv(4096):
            c.sendall(data)
while True:
    threading.Thread(target=echo, args=(srv.accept()[0],), daemon=True).start()
"""

#: A client of the echo server taking commands on stdin ("probe T": a new connection and
#: one byte echoed within T s; "open T", "echo T": the same on one kept connection;
#: "wait T": the reply still due on it) and printing each outcome.
ECHO_CLIENT = """
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
conn = None
def connect(t):
    try:
        return socket.create_connection((host, int(port)), timeout=t), "ok"
    except TimeoutError:
        return None, "connect-timeout"
    except ConnectionRefusedError:
        return None, "refused"
    except OSError as e:
        return None, f"error {e}"
def reply(s, t):
    s.settimeout(t)
    try:
        return "ok" if s.recv(1) == b"x" else "closed"
    except TimeoutError:
        return "reply-timeout"
    except OSError as e:
        return f"error {e}"
def echo(s, t):
    s.sendall(b"x")
    return reply(s, t)
for line in sys.stdin:
    cmd, t = line.split()
    t = float(t)
    if cmd == "probe":
        s, out = connect(t)
        if s is not None:
            with s:
                out = echo(s, t)
    elif cmd == "open":
        conn, out = connect(t)
        out = echo(conn, t) if conn is not None else out
    elif cmd == "echo":
        out = echo(conn, t)
    else:
        out = reply(conn, t)
    print(out, flush=True)
"""

CUT_TIMEOUT_S = 1.0


def echo_server(host: Host) -> int:
    (port,) = free_ports(1)
    proc = host.popen(
        [sys.executable, "-c", ECHO_SERVER, host.ip, str(port)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return port


@dataclass
class EchoClient:
    proc: subprocess.Popen[str]

    def __call__(self, command: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()


def echo_client(host: Host, address: str) -> EchoClient:
    argv = [sys.executable, "-c", ECHO_CLIENT, address]
    return EchoClient(host.popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))


def check_cut_and_heal(net: Network | ProxyNetwork, lost: set[str]) -> None:
    """``lost``: how a request across a cut may fail (never "refused")."""
    a, b, c = net.add_host("a"), net.add_host("b"), net.add_host("c")
    port_b, port_a = echo_server(b), echo_server(a)
    a_to_b = echo_client(a, net.address(a, b, port_b))
    b_to_a = echo_client(b, net.address(b, a, port_a))
    c_to_b = echo_client(c, net.address(c, b, port_b))
    assert a_to_b("probe 5") == b_to_a("probe 5") == "ok"
    assert a_to_b("open 5") == "ok"  # a connection open across the cut

    net.cut(a, b)
    assert a_to_b(f"probe {CUT_TIMEOUT_S}") in lost
    assert b_to_a(f"probe {CUT_TIMEOUT_S}") in lost  # both ways
    assert a_to_b(f"echo {CUT_TIMEOUT_S}") == "reply-timeout"  # stalled, not reset
    assert c_to_b("probe 5") == "ok"  # only that link is cut

    net.heal(a, b)
    assert a_to_b("wait 10") == "ok"  # the stalled byte arrives after all
    assert a_to_b("probe 5") == b_to_a("probe 5") == "ok"

    net.isolate(b)
    assert a_to_b(f"probe {CUT_TIMEOUT_S}") in lost
    assert c_to_b(f"probe {CUT_TIMEOUT_S}") in lost
    net.rejoin(b)
    assert a_to_b("probe 5") == c_to_b("probe 5") == "ok"


def test_a_namespace_cut_loses_packets_both_ways_until_healed(netns: Network) -> None:
    # A real partition: the SYN vanishes, so the connect itself times out.
    check_cut_and_heal(netns, {"connect-timeout"})


def test_a_cut_leaves_the_test_process_connected(netns: Network) -> None:
    a, b = netns.add_host("a"), netns.add_host("b")
    port = echo_server(b)
    netns.cut(a, b)
    netns.isolate(b)
    client = echo_client_here(f"{b.ip}:{port}")
    assert client("probe 5") == "ok"


def echo_client_here(address: str) -> EchoClient:
    argv = [sys.executable, "-c", ECHO_CLIENT, address]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return EchoClient(proc)


def test_a_proxy_cut_stalls_requests_both_ways_until_healed(proxynet: ProxyNetwork) -> None:
    # The proxy accepts a new connection but never connects it onwards: the reply is due.
    check_cut_and_heal(proxynet, {"reply-timeout"})


def test_teardown_leaves_no_namespace_link_or_process(netns: Network) -> None:
    host = netns.add_host("h")
    proc = host.popen(["sleep", "60"])
    namespace, veth, bridge = host.namespace, host.veth, netns.bridge
    netns.close()
    assert proc.poll() is not None
    assert (
        namespace
        not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    )
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert veth not in links and bridge not in links


def test_a_new_network_removes_what_a_killed_test_process_left() -> None:
    if why := netns_unavailable():
        pytest.skip(why)
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names a process that is no more
    run_id = f"{_base36(gone.pid)}-1"
    left = f"srtm-{run_id}-h1"
    subprocess.run(["ip", "netns", "add", left], check=True)
    subprocess.run(["ip", "link", "add", f"srb{run_id}", "type", "bridge"], check=True)
    with Network():
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True)
    assert left not in namespaces.stdout
    assert f"srb{run_id}:" not in links.stdout


def test_a_broker_and_a_controller_run_in_hosts_of_their_own(
    netns: Network, tmp_path: Path
) -> None:
    ctl_host, broker_host = netns.add_host("ctl"), netns.add_host("b1")
    token = new_token()
    ctl = start_controller(
        tmp_path / "c.db", token=token, host=ctl_host.ip, command_prefix=ctl_host.command_prefix
    )
    try:
        args = ["--broker-id", "1", "--controller", f"http://{ctl.http_address}"]
        broker = start_broker(
            tmp_path / "b1", args, token=token, host=broker_host.ip,
            command_prefix=broker_host.command_prefix,
        )  # fmt: skip
        try:
            assert broker.tcp[0] == broker_host.ip and ctl.http[0] == ctl_host.ip
            eventually.blocking(
                lambda: len(ctl.json("/nodes")["producers"]) == 1, "the broker registered"
            )
        finally:
            broker.stop()
    finally:
        ctl.stop()
