"""An asyncio client of etcd v3 through its JSON gateway (``/v3/kv/*``, ``/v3/lease/*``,
``/v3/watch``; keys and values base64, int64s as strings), with aiohttp: what the
controller's leadership and the brokers' liveness leases need, and nothing more.

Every request goes to the endpoint that answered last; one that refuses the connection or
does not answer in time is left for the next one. An HTTP error is etcd's answer and is not
retried elsewhere. A watch reconnects (to the next endpoint) and resumes after the last
revision it gave.

The request bodies and the answers are built and read by pure functions (``range_body``,
``txn_body``, ``kvs_of``, ``events_of``); only ``Etcd._post`` and ``Etcd.watch`` do I/O."""

from __future__ import annotations

import asyncio
import base64
import enum
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

log = logging.getLogger("srtm.etcd")

#: Seconds one request may take before the next endpoint is tried.
REQUEST_TIMEOUT_S = 2.0
#: A watch that breaks is opened again after this long (s), on the next endpoint.
WATCH_RETRY_S = 0.2


class EtcdError(RuntimeError):
    """etcd could not be used: no endpoint answered, or one refused the request."""


def b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode("ascii")


def unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key starting with ``prefix`` (etcd's ``range_end``)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


def endpoint_urls(text: str, flag: str = "--etcd-endpoints") -> list[str]:
    """``HOST:PORT[,HOST:PORT...]`` as the gateway's URLs; ValueError naming ``flag``
    and the bad part."""
    urls = []
    for part in (p.strip() for p in text.split(",")):
        host, sep, port = part.rpartition(":")
        well_formed = sep and host and port.isdigit() and 0 < int(port) <= 65535
        if not well_formed or any(c in host for c in "/@?# "):  # a URL is not HOST:PORT
            raise ValueError(f"{flag}: {part!r} is not HOST:PORT (give HOST:PORT[,HOST:PORT...])")
        urls.append(f"http://{host}:{int(port)}")
    return urls


def check_prefix(prefix: str, flag: str = "--etcd-prefix") -> None:
    """A key path below the root: ``/`` alone would mix SRTM's keys with every other key
    of the cluster."""
    if not prefix.startswith("/") or not prefix.strip("/") or not prefix.isprintable():
        raise ValueError(f"{flag}: {prefix!r} is not a key path like /srtm")
    if any(c.isspace() for c in prefix):
        raise ValueError(f"{flag}: {prefix!r} has white space")


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: str
    create_revision: int
    mod_revision: int
    #: The lease the key is attached to (0: none).
    lease: int = 0


class EventKind(enum.Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True)
class WatchEvent:
    kind: EventKind
    key: str
    #: The new value ("" for a delete).
    value: str
    #: The revision of the change.
    revision: int


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction."""

    key: str
    target: str
    expected: str | int

    @classmethod
    def created(cls, key: str, revision: int) -> Compare:
        """The key was created at ``revision`` (0: the key does not exist)."""
        return cls(key, "CREATE", revision)

    @classmethod
    def value(cls, key: str, value: str) -> Compare:
        return cls(key, "VALUE", value)

    def body(self) -> dict[str, Any]:
        field = {"CREATE": "create_revision", "VALUE": "value"}[self.target]
        expected = b64(str(self.expected)) if self.target == "VALUE" else str(self.expected)
        return {"key": b64(self.key), "target": self.target, "result": "EQUAL", field: expected}


@dataclass(frozen=True)
class Op:
    """One operation of a transaction: a put (``value`` not None) or a delete."""

    key: str
    value: str | None
    lease: int = 0

    @classmethod
    def put(cls, key: str, value: str, lease: int = 0) -> Op:
        return cls(key, value, lease)

    @classmethod
    def delete(cls, key: str) -> Op:
        return cls(key, None)

    def body(self) -> dict[str, Any]:
        if self.value is None:
            return {"request_delete_range": {"key": b64(self.key)}}
        put: dict[str, Any] = {"key": b64(self.key), "value": b64(self.value)}
        if self.lease:
            put["lease"] = str(self.lease)
        return {"request_put": put}


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int


def range_body(key: str, prefix: bool = False) -> dict[str, Any]:
    body = {"key": b64(key)}
    if prefix:
        body["range_end"] = b64(prefix_end(key.encode()))
    return body


def txn_body(
    compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]
) -> dict[str, Any]:
    return {
        "compare": [c.body() for c in compares],
        "success": [op.body() for op in success],
        "failure": [op.body() for op in failure],
    }


def revision_of(answer: dict[str, Any]) -> int:
    # The gateway writes int64s as strings and leaves out fields that are zero.
    try:
        return int(answer["header"].get("revision", 0))
    except (KeyError, AttributeError, TypeError, ValueError) as e:
        raise EtcdError(f"etcd answered without a header revision: {answer!r:.200}") from e


def kvs_of(answer: dict[str, Any]) -> list[KeyValue]:
    """A range's keys, in key order (etcd's)."""
    return [
        KeyValue(
            unb64(kv["key"]),
            unb64(kv.get("value", "")),
            int(kv.get("create_revision", 0)),
            int(kv.get("mod_revision", 0)),
            int(kv.get("lease", 0)),
        )
        for kv in answer.get("kvs", [])
    ]


def events_of(message: dict[str, Any]) -> list[WatchEvent]:
    """The events of one message of a watch stream (none in the one that confirms it)."""
    result = message.get("result", {})
    return [
        WatchEvent(
            EventKind(e.get("type", "PUT")),  # PUT is 0: the gateway leaves it out
            unb64(e["kv"]["key"]),
            unb64(e["kv"].get("value", "")),
            int(e["kv"].get("mod_revision", 0)),
        )
        for e in result.get("events", [])
    ]


class Etcd:
    """A client of one etcd cluster, over its members' gateway URLs (``http://host:port``)."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        if not endpoints:
            raise ValueError("etcd needs at least one endpoint (http://host:port)")
        for url in endpoints:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"etcd endpoint {url!r} is not http://host:port")
        self.endpoints = [url.rstrip("/") for url in endpoints]
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Etcd:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- keys --------------------------------------------------------------------------------
    async def get(self, key: str) -> KeyValue | None:
        found = kvs_of(await self._post("/v3/kv/range", range_body(key)))
        return found[0] if found else None

    async def range_prefix(self, prefix: str) -> list[KeyValue]:
        return kvs_of(await self._post("/v3/kv/range", range_body(prefix, prefix=True)))

    async def revision(self) -> int:
        """The cluster's revision now."""
        return revision_of(await self._post("/v3/kv/range", range_body("\0")))

    async def put(self, key: str, value: str, lease: int = 0) -> int:
        return (await self.txn([], [Op.put(key, value, lease)])).revision

    async def delete(self, key: str) -> int:
        return (await self.txn([], [Op.delete(key)])).revision

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        answer = await self._post("/v3/kv/txn", txn_body(compares, success, failure))
        return TxnResult(answer.get("succeeded") is True, revision_of(answer))

    # -- leases ------------------------------------------------------------------------------
    async def grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; its id."""
        answer = await self._post("/v3/lease/grant", {"TTL": str(int(ttl_s))})
        if answer.get("error"):
            raise EtcdError(f"etcd refused a lease: {answer['error']}")
        return int(answer["ID"])

    async def keepalive(self, lease_id: int) -> int:
        """Renew the lease; the seconds it now has (0: it is gone: expired or revoked).

        Asked of every endpoint at once, the first answer taken (a renewal applied twice
        is one renewal). While etcd elects a new leader its members hold a keepalive until
        one exists; asked one after another, each took its whole timeout, and a broker
        whose liveness had 3 s left lapsed when etcd's raft leader was killed
        (docs/results/control-plane-faults.md)."""
        answer = await self._post_all("/v3/lease/keepalive", {"ID": str(lease_id)})
        return int(answer.get("result", {}).get("TTL", 0))

    async def revoke(self, lease_id: int) -> None:
        """End the lease and delete its keys; a lease already gone is not an error."""
        try:
            await self._post("/v3/kv/lease/revoke", {"ID": str(lease_id)})
        except EtcdError as e:
            if "lease not found" not in str(e):
                raise

    # -- watch -------------------------------------------------------------------------------
    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Every change under ``prefix`` from ``start_revision`` on, forever: a broken
        stream is opened again (on the next endpoint) after the last revision given."""
        body = {"create_request": {**range_body(prefix, prefix=True)}}
        next_revision = start_revision
        while True:
            body["create_request"]["start_revision"] = str(next_revision)
            url = self.endpoints[0]
            try:
                async for message in self._stream(url, body):
                    if message.get("result", {}).get("canceled"):
                        raise EtcdError(f"etcd cancelled the watch: {message!r:.200}")
                    for event in events_of(message):
                        next_revision = event.revision + 1
                        yield event
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
                log.debug("watch on %s broke: %s", url, e)
            self._rotate(url)
            await asyncio.sleep(WATCH_RETRY_S)

    async def _stream(self, url: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        session = self._open()
        # No total timeout: a watch is a stream; a dead peer shows as no data for long.
        timeout = aiohttp.ClientTimeout(total=None, connect=self._timeout.total, sock_read=None)
        async with session.post(f"{url}/v3/watch", json=body, timeout=timeout) as resp:
            if resp.status != 200:
                raise EtcdError(f"etcd at {url} refused a watch: {resp.status}")
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)

    # -- I/O ---------------------------------------------------------------------------------
    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    def _rotate(self, failed: str) -> None:
        if self.endpoints[0] == failed and len(self.endpoints) > 1:
            self.endpoints.append(self.endpoints.pop(0))

    async def _post_one(self, url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to one endpoint: its answer (EtcdError: refused, or not a JSON object)."""
        async with self._open().post(url + path, json=body) as resp:
            text = await resp.text()
        if resp.status != 200:
            raise EtcdError(f"etcd at {url} refused {path}: {resp.status} {text[:200]}")
        try:
            answer = json.loads(text)
        except ValueError as e:
            raise EtcdError(f"etcd at {url} answered {path} with {e}") from e
        if not isinstance(answer, dict):
            raise EtcdError(f"etcd at {url} answered {path} with {answer!r:.200}")
        return answer

    async def _post_all(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to every endpoint at once (only for requests that may be applied more
        than once): the first answer; the others are cancelled."""
        tasks = {asyncio.ensure_future(self._post_one(u, path, body)): u for u in self.endpoints}
        pending, failures = set(tasks), []
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if (exc := task.exception()) is None:
                        return task.result()
                    failures.append(f"{tasks[task]}: {str(exc) or type(exc).__name__}")
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        raise EtcdError(f"no etcd endpoint answered {path}: " + "; ".join(sorted(failures)))

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to the first endpoint that answers, starting with the one that answered
        last. A request whose answer timed out may have been applied: the next endpoint
        applies it again (the callers' writes are idempotent or fenced)."""
        failures = []
        for url in list(self.endpoints):
            try:
                return await self._post_one(url, path, body)
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                failures.append(f"{url}: {str(e) or type(e).__name__}")
                self._rotate(url)
        raise EtcdError(f"no etcd endpoint answered {path}: " + "; ".join(failures))
