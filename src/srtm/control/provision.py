"""Provisioning: how the controller starts and stops brokers when ``--rebalance`` spawns
or despawns one. Two kinds: local child processes (``srtm broker`` through
``srtm.launch``, the default) and a command hook (``--provision-cmd CMD``: ``CMD start
ID`` / ``CMD stop ID``, for any cloud's API). A started broker registers itself with
the controller under ``ID``; the controller waits for that, not for ``start``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
from pathlib import Path
from typing import Protocol

from srtm.launch import BrokerProcess, start_broker

__all__ = ["CommandProvisioner", "LocalProvisioner", "ProvisionError", "Provisioner"]

log = logging.getLogger("srtm.controller.provision")


class ProvisionError(RuntimeError):
    """A broker could not be started or stopped."""


class Provisioner(Protocol):
    async def start(self, broker_id: str) -> None:
        """Start a broker that registers with this controller as ``broker_id``."""

    async def stop(self, broker_id: str) -> None:
        """Stop broker ``broker_id`` (it drained first: it carries nothing)."""

    def can_stop(self, broker_id: str) -> bool:
        """Whether ``stop`` can stop ``broker_id`` (a local provisioner: only its own)."""

    async def close(self) -> None:
        """The controller stops: stop what must not outlive it."""


class LocalProvisioner:
    """Brokers as child processes: ``srtm broker --broker-id ID --controller URL --mcap
    MCAP`` on 127.0.0.1 (ephemeral ports), data under ``directory/ID``; all stopped by
    ``close``. ``token`` is the cluster token (None: brokers run ``--insecure-loopback``,
    as the controller does)."""

    def __init__(
        self,
        controller_url: str,
        directory: Path,
        *,
        token: str | None,
        mcap: float,
        timeout_s: float = 60.0,
    ) -> None:
        self.controller_url, self.directory, self.token = controller_url, directory, token
        self.mcap, self.timeout_s = mcap, timeout_s
        self.children: dict[str, BrokerProcess] = {}
        #: Starts under way (``close`` waits for them: a child started as the controller
        #: stops is stopped too).
        self._pending: set[asyncio.Future[BrokerProcess]] = set()

    async def start(self, broker_id: str) -> None:
        if broker_id in self.children and self.children[broker_id].alive():
            return
        args = ["--broker-id", broker_id, "--controller", self.controller_url,
                "--mcap", repr(self.mcap)]  # fmt: skip
        if self.token is None:
            args.append("--insecure-loopback")
        data = self.directory / broker_id

        def run() -> BrokerProcess:  # blocks until the ready line: in a thread, off the loop
            proc = start_broker(data, args, token=self.token or "", timeout=self.timeout_s)
            self.children[broker_id] = proc
            return proc

        started = asyncio.get_running_loop().run_in_executor(None, run)
        self._pending.add(started)
        started.add_done_callback(self._pending.discard)
        try:
            proc = await asyncio.shield(started)  # cancelled: close() still sees the child
        except (OSError, RuntimeError) as exc:
            raise ProvisionError(f"srtm broker {broker_id}: {exc}") from exc
        log.info("started broker %s (pid %d, tcp %s)", broker_id, proc.proc.pid, proc.tcp_address)

    async def stop(self, broker_id: str) -> None:
        proc = self.children.pop(broker_id, None)
        if proc is None:
            raise ProvisionError(f"broker {broker_id} was not started here")
        try:
            code = await asyncio.to_thread(proc.stop, self.timeout_s)
        except Exception as exc:  # killed after the timeout (TimeoutExpired)
            raise ProvisionError(f"broker {broker_id} did not stop: {exc}") from exc
        log.info("stopped broker %s (exit code %d)", broker_id, code)

    def can_stop(self, broker_id: str) -> bool:
        return broker_id in self.children

    async def close(self) -> None:
        await asyncio.gather(*self._pending, return_exceptions=True)
        for bid in list(self.children):
            with contextlib.suppress(ProvisionError):
                await self.stop(bid)


class CommandProvisioner:
    """``CMD start ID`` / ``CMD stop ID`` (``CMD`` split as a shell would, run without
    one), never blocking the loop: output logged, killed after ``timeout_s``; a non-zero
    exit or a timeout is a ``ProvisionError`` (the caller logs and counts it)."""

    def __init__(self, command: str, *, timeout_s: float = 60.0) -> None:
        self.argv = shlex.split(command)
        if not self.argv:
            raise ValueError("--provision-cmd is empty")
        self.timeout_s = timeout_s
        self.runs = 0

    async def start(self, broker_id: str) -> None:
        await self._run("start", broker_id)

    async def stop(self, broker_id: str) -> None:
        await self._run("stop", broker_id)

    def can_stop(self, broker_id: str) -> bool:
        return True  # the hook knows the cluster: any broker can be given back

    async def close(self) -> None:
        return None  # brokers it started belong to the operator's cloud

    async def _run(self, verb: str, broker_id: str) -> None:
        self.runs += 1
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv, verb, broker_id,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
        except OSError as exc:
            raise ProvisionError(f"{self.argv[0]} {verb} {broker_id}: {exc}") from exc
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise ProvisionError(
                f"{self.argv[0]} {verb} {broker_id}: no exit in {self.timeout_s:g} s"
            ) from None
        text = out.decode(errors="replace").strip()
        if text:
            log.info("%s %s %s: %s", self.argv[0], verb, broker_id, text[-2000:])
        if proc.returncode != 0:
            raise ProvisionError(f"{self.argv[0]} {verb} {broker_id}: exit code {proc.returncode}")
