"""nsqd's AUTH protocol against an external auth server (``--auth-http-address``).

``AUTH <secret>`` makes the broker ask ``GET /auth?remote_ip=&tls=&secret=&common_name=``;
the answer (a TTL, an identity and authorizations: a topic regex, channel regexes and
``publish``/``subscribe`` permissions) governs PUB, MPUB, DPUB and SUB until it expires,
when the next such command asks again. The query never blocks the loop: the connection's
later commands wait, in order, and its socket is not read, until the answer comes.

The pure part (parsing the answer, deciding a command) is here with injected clocks; the
per-connection ``Gate`` also applies ``--tls-required`` before any command runs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import re
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from srtm.protocol import Auth, Dpub, Identify, Mpub, ProtocolError, Pub, Sub, errors
from srtm.protocol.session import Keys, SessionState, command_name, is_valid_class

if TYPE_CHECKING:
    import aiohttp

    from srtm.broker.tls import TlsSession

log = logging.getLogger("srtm.broker")

E_AUTH_FIRST = "E_AUTH_FIRST"
E_AUTH_DISABLED = "E_AUTH_DISABLED"
PERMISSIONS = frozenset({"publish", "subscribe"})
#: nsqd's HTTP client defaults (--http-client-connect-timeout, --http-client-request-timeout).
CONNECT_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 5.0
#: An answer longer than this is refused rather than held in memory.
MAX_ANSWER_BYTES = 1 << 20


class AuthError(Exception):
    """The auth server refused, was unreachable or answered something unusable."""


@dataclass(frozen=True, slots=True)
class Authorization:
    topic: re.Pattern[str]
    channels: tuple[re.Pattern[str], ...]
    permissions: frozenset[str]

    def allows(self, topic: str, channel: str) -> bool:
        """nsqd's rule: PUB (no channel) needs ``publish``, SUB ``subscribe``; the regexes
        search (unanchored, as Go's MatchString) and even PUB's "" must match a channel."""
        needed = "subscribe" if channel else "publish"
        if needed not in self.permissions or not self.topic.search(topic):
            return False
        return any(c.search(channel) for c in self.channels)


@dataclass(frozen=True, slots=True)
class AuthState:
    identity: str
    identity_url: str
    expires_ns: int
    authorizations: tuple[Authorization, ...]
    #: SRTM's fields of the answer: the consumer class of this identity (``srtm_class``;
    #: None: ``default``) and whether it is a relay link of another broker (``srtm_relay``).
    klass: str | None = None
    relay: bool = False

    def expired(self, now_ns: int) -> bool:
        return now_ns >= self.expires_ns

    def allows(self, topic: str, channel: str) -> bool:
        return any(a.allows(topic, channel) for a in self.authorizations)

    def reply(self) -> bytes:
        """AUTH's response body, as nsqd sends it."""
        doc: dict[str, Any] = {
            "identity": self.identity,
            "identity_url": self.identity_url,
            "permission_count": len(self.authorizations),
        }
        if self.relay:  # SRTM's: this identity may be a relay link (the relay checks it)
            doc["srtm_relay"] = True
        return json.dumps(doc).encode()


def _regex(pattern: object, what: str) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise AuthError(f"{what} must be a string, not {pattern!r}")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise AuthError(f"unable to compile {what} {pattern!r}: {exc}") from None


def _authorization(doc: object) -> Authorization:
    if not isinstance(doc, dict):
        raise AuthError(f"an authorization must be an object, not {doc!r}")
    perms = doc.get("permissions") or []
    channels = doc.get("channels") or []
    if not isinstance(perms, list) or not isinstance(channels, list):
        raise AuthError("permissions and channels must be lists")
    for p in perms:
        if p not in PERMISSIONS:
            raise AuthError(f"unknown permission {p!r}")
    return Authorization(
        _regex(doc.get("topic", ""), "topic"),
        tuple(_regex(c, "channel") for c in channels),
        frozenset(perms),
    )


def parse_reply(body: bytes, now_ns: int) -> AuthState:
    """The auth server's JSON answer; raises AuthError as nsqd refuses it (bad JSON, a TTL
    not > 0, an unknown permission, a regex that does not compile)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise AuthError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise AuthError("the answer must be a JSON object")
    ttl = doc.get("ttl")
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0:
        raise AuthError(f"invalid TTL {ttl!r} (must be > 0)")
    auths = doc.get("authorizations") or []
    if not isinstance(auths, list):
        raise AuthError("authorizations must be a list")
    klass = doc.get("srtm_class")
    if klass is not None and not is_valid_class(klass):
        raise AuthError(f"srtm_class {str(klass)[:40]!r} is not a class name")
    relay = doc.get("srtm_relay", False)
    if not isinstance(relay, bool):
        raise AuthError(f"srtm_relay must be true or false, not {relay!r}")
    return AuthState(
        identity=str(doc.get("identity", "")),
        identity_url=str(doc.get("identity_url", "")),
        expires_ns=now_ns + min(ttl, 10**9) * 1_000_000_000,
        authorizations=tuple(_authorization(a) for a in auths),
        klass=klass,
        relay=relay,
    )


#: What the cluster's own connections (AUTH with the token or relay secret) may do: all.
EVERYTHING = Authorization(re.compile(""), (re.compile(""),), PERMISSIONS)


def operator_state(now_ns: int) -> AuthState:
    """The cluster's own connection: checked here, not by the auth server, and for good."""
    return AuthState("srtm-cluster", "", now_ns + 10**18, (EVERYTHING,), relay=True)


def auth_url(address: str, remote_ip: str, tls: bool, secret: str, common_name: str) -> str:
    """nsqd's query: ``address`` is HOST:PORT (plain HTTP) or a http(s):// base URL."""
    base = address if address.startswith(("http://", "https://")) else f"http://{address}"
    query = urllib.parse.urlencode(
        {
            "common_name": common_name,
            "remote_ip": remote_ip,
            "secret": secret,
            "tls": "true" if tls else "false",
        }
    )
    return f"{base.rstrip('/')}/auth?{query}"


def target(cmd: object) -> tuple[str, str, str] | None:
    """(command, topic, channel) for the commands AUTH governs; None for the others."""
    match cmd:
        case Pub(topic, _):
            return "PUB", topic, ""
        case Mpub(topic, _):
            return "MPUB", topic, ""
        case Dpub(topic, _, _):
            return "DPUB", topic, ""
        case Sub(topic, channel):
            return "SUB", topic, channel
    return None


class Authenticator:
    """The broker's client of the auth servers: one HTTP session, addresses tried in turn."""

    def __init__(self, addresses: tuple[str, ...]) -> None:
        self.addresses = addresses
        self._session: aiohttp.ClientSession | None = None

    async def query(
        self, remote_ip: str, tls: bool, secret: str, common_name: str, now_ns: int
    ) -> AuthState:
        import aiohttp

        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
            self._session = aiohttp.ClientSession(timeout=timeout)
        failures = []
        for address in self.addresses:
            url = auth_url(address, remote_ip, tls, secret, common_name)
            try:
                async with self._session.get(url) as resp:
                    if resp.status != 200:
                        raise AuthError(f"{address} answered {resp.status}")
                    body = bytearray()
                    async for chunk in resp.content.iter_chunked(64 * 1024):
                        body += chunk
                        if len(body) > MAX_ANSWER_BYTES:
                            raise AuthError(f"{address} answered over {MAX_ANSWER_BYTES} bytes")
                return parse_reply(bytes(body), now_ns)
            except (AuthError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                failures.append(f"{address}: {exc}")
        raise AuthError("; ".join(failures) or "no auth server")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class Gated(Protocol):
    """What the gate needs of its connection (``srtm.broker.tcp.Client``), declared here so
    that this module does not import the socket code that uses it."""

    tls: TlsSession | None
    remote: str

    @property
    def state(self) -> SessionState: ...
    @property
    def closed(self) -> bool: ...
    @property
    def finishing(self) -> bool: ...
    def send_error(self, err: ProtocolError) -> None: ...
    def respond(self, body: bytes) -> None: ...
    def granted(self, operator: bool, relay: bool, klass: str | None) -> None: ...
    def hold_reads(self) -> None: ...
    def release_reads(self) -> None: ...
    def run(self, event: object, arrival: int) -> None: ...


class Gate:
    """What one connection may run, decided before each command: ``--tls-required``
    (nothing but IDENTIFY before the upgrade) and AUTH. Commands that arrive while the
    auth server is being asked are held, in order, and replayed once it answers."""

    def __init__(
        self,
        client: Gated,
        tls_required: bool,
        auth: Authenticator | None,
        keys: Keys | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.client = client
        self.clock_ns = clock_ns
        self.tls_required = tls_required
        self.auth = auth
        #: The token and relay secret: checked here, never sent to the auth server.
        self.keys = Keys() if keys is None else keys
        self.secret: str | None = None
        self.state: AuthState | None = None
        self.held: collections.deque[tuple[object, int]] = collections.deque()
        self._query: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> bool:
        return self._query is not None

    def consumes(self, event: object, arrival: int) -> bool:
        """True when the gate took ``event``: held for an answer, or refused (error sent)."""
        if self._query is not None:
            self.held.append((event, arrival))
            return True
        if isinstance(event, ProtocolError):
            return False
        try:
            return self._check(event, arrival)
        except ProtocolError as err:
            self.client.send_error(err)
            return True

    def _check(self, event: object, arrival: int) -> bool:
        client = self.client
        tls = client.tls
        if not isinstance(event, Identify):
            name = command_name(type(event))  # type: ignore[arg-type]
            if tls is not None and not tls.established:
                # Plain text that followed IDENTIFY before the handshake: nsqd would have
                # read it as a broken handshake.
                raise ProtocolError(errors.E_INVALID, f"cannot {name} before the TLS handshake")
            if self.tls_required and tls is None:
                raise ProtocolError(
                    errors.E_INVALID, f"cannot {name} in current state (TLS required)"
                )
        if self.auth is None:
            return False
        if isinstance(event, Auth):
            self._auth(event.secret)
            return True
        what = target(event)
        if what is None:
            return False
        cmd, topic, channel = what
        if self.state is None or not self.state.authorizations:
            raise ProtocolError(E_AUTH_FIRST, f"AUTH required before {cmd}")
        if self.state.expired(self.clock_ns()):
            self.held.appendleft((event, arrival))
            self._ask(first=False)
            return True
        if not self.state.allows(topic, channel):
            raise ProtocolError(
                errors.E_UNAUTHORIZED, f'AUTH failed for {cmd} on "{topic}" "{channel}"'
            )
        return False

    def _auth(self, body: bytes) -> None:
        if self.client.state is not SessionState.INIT:
            raise ProtocolError(errors.E_INVALID, "cannot AUTH in current state")
        if self.state is not None and self.state.authorizations:
            raise ProtocolError(errors.E_INVALID, "AUTH already set")
        self.secret = body.decode(errors="replace")
        if self.keys.is_operator(self.secret):
            self.state = operator_state(self.clock_ns())
            self.client.granted(True, False, None)
            self.client.respond(self.state.reply())
            return
        self._ask(first=True)

    def _ask(self, first: bool) -> None:
        """Ask the auth server; the connection reads nothing until it answers."""
        client = self.client
        assert self.auth is not None and self.secret is not None
        client.hold_reads()
        tls = client.tls
        established = tls is not None and tls.established
        coro = self.auth.query(
            client.remote.rpartition(":")[0],
            established,
            self.secret,
            tls.common_name if tls is not None else "",
            self.clock_ns(),
        )
        self._query = asyncio.ensure_future(self._answered(coro, first))

    async def _answered(self, coro: Any, first: bool) -> None:
        try:
            state: AuthState | None = await coro
        except AuthError as exc:
            log.warning("AUTH for %s failed: %s", self.client.remote, exc)
            state = None
        self._query = None
        client = self.client
        if client.closed:
            return
        if state is None:
            self.held.clear()
            client.send_error(ProtocolError(errors.E_AUTH_FAILED, "AUTH failed"))
            return
        self.state = state
        if first:
            if not state.authorizations:
                self.held.clear()
                client.send_error(
                    ProtocolError(errors.E_UNAUTHORIZED, "AUTH no authorizations found")
                )
                return
            client.granted(False, state.relay, state.klass)
            client.respond(state.reply())
        self._replay()

    def _replay(self) -> None:
        client = self.client
        while self.held and self._query is None and not client.finishing:
            event, arrival = self.held.popleft()
            if not self.consumes(event, arrival):
                client.run(event, arrival)
        if self._query is None:
            client.release_reads()

    def close(self) -> None:
        self.held.clear()
        if self._query is not None:
            self._query.cancel()
            self._query = None

    def detach(self) -> None:
        """Closed, and the connection gone: let go of it (they would be cyclic garbage)."""
        del self.client


async def close_quietly(auth: Authenticator | None) -> None:
    if auth is not None:
        with contextlib.suppress(Exception):
            await auth.close()
