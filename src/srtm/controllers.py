"""Several controllers, one leader: which controller a broker or a client talks to.

Brokers (``srtm broker --controller URL[,URL...]``) and clients (``Publisher``,
``Subscriber``, the emulator's plan follower) are given every controller's base URL. One
request walks them: the one believed to be the leader first (at start the first URL), then
the others in the order given. A controller that refuses the connection, times out or
answers 503 is passed over for the next; a 307 (a standby naming the leader) is followed to
the ``scheme://host:port`` of its ``Location``, at most ``MAX_HOPS`` times and never back to
a controller this request already tried. The controller that answers becomes the one tried
first next time, so a broker keeps writing to the leader a standby named, and a client
reads from any controller that answers.

``ControllerSet`` and ``Walk`` are the pure rule; ``Controllers.request`` is the one place
it meets aiohttp (redirects are followed here, never by aiohttp, so the leader is
remembered).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp

#: Redirects one request follows at most (a standby names the leader: one is enough, a
#: leader that changed meanwhile may take a second).
MAX_HOPS = 3
#: How long one controller may take to accept a connection before the next is tried (s).
CONNECT_TIMEOUT_S = 1.0
#: What the redirect statuses are: a standby answers a write 307 (308 is taken alike).
REDIRECTS = (307, 308)


class ControllerUnreachable(ConnectionError):
    """No controller answered a request (each refused, timed out, or redirected in a loop),
    or one answered what is not JSON where JSON was due."""


def controller_urls(value: str | Sequence[str], name: str = "controller") -> tuple[str, ...]:
    """Controller base URLs from ``URL[,URL...]`` (or a list of URLs): each ``http://`` or
    ``https://`` with a host, no query or fragment, its trailing ``/`` dropped; a repeat is
    kept once. ValueError names ``name`` (the flag or argument) and the bad part."""
    parts = value.split(",") if isinstance(value, str) else list(value)
    if not parts or parts == [""]:
        raise ValueError(f"{name}: no controller URL given (URL[,URL...])")
    urls: list[str] = []
    for raw in parts:
        part = raw.strip() if isinstance(raw, str) else raw
        if not isinstance(part, str) or not part:
            raise ValueError(f"{name}: empty URL in {value!r} (URL[,URL...])")
        split = urlsplit(part)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise ValueError(f"{name}: {part!r} is not an http:// or https:// URL with a host")
        try:
            split.port  # noqa: B018 - parsing the port is the check
        except ValueError:
            raise ValueError(f"{name}: {part!r} has a bad port") from None
        if split.query or split.fragment:
            raise ValueError(f"{name}: {part!r} has a query or fragment (give the base URL)")
        url = part.rstrip("/")
        if url not in urls:
            urls.append(url)
    return tuple(urls)


def origin(location: str, base: str) -> str | None:
    """The ``scheme://host:port`` a redirect's ``Location`` names (resolved against the
    ``base`` URL it came from); None if it names no http(s) host."""
    split = urlsplit(urljoin(base + "/", location))
    if split.scheme not in ("http", "https") or not split.hostname:
        return None
    return f"{split.scheme}://{split.netloc}"


@dataclass
class ControllerSet:
    """The controllers known, and the one tried first (the leader, as far as known)."""

    urls: list[str]
    current: str = ""
    #: How many of ``urls`` were given (the rest: learned from redirects, at most one).
    given: int = 0

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("no controller URL")
        self.current = self.current or self.urls[0]
        self.given = self.given or len(self.urls)

    def order(self) -> list[str]:
        """The order one request tries them in: the current one, then the others as given."""
        return [self.current, *(u for u in self.urls if u != self.current)]

    def settle(self, url: str) -> bool:
        """``url`` answered: try it first from now on (learned from a redirect, it joins the
        list). True if that is a switch."""
        if url not in self.urls:
            if len(self.urls) > self.given:  # one learned address kept, the newest
                self.urls.pop()
            self.urls.append(url)
        switched, self.current = url != self.current, url
        return switched


@dataclass
class Walk:
    """One request's way through the controllers: which URL to try next after each
    outcome; None when none is left."""

    order: Sequence[str]
    max_hops: int = MAX_HOPS
    hops: int = 0
    tried: list[str] = field(default_factory=list)

    def next(self) -> str | None:
        """The next controller not tried yet (the first at the start; after a refused or
        timed-out connection, or a 503)."""
        for url in self.order:
            if url not in self.tried:
                self.tried.append(url)
                return url
        return None

    def redirected(self, location: str, base: str) -> str | None:
        """``base`` answered a redirect to ``location``: its origin, unless that was tried
        already (a loop) or the hops are used up, in which case the next untried one."""
        to = origin(location, base)
        if to is None or to in self.tried or self.hops >= self.max_hops:
            return self.next()
        self.hops += 1
        self.tried.append(to)
        return to


@dataclass(frozen=True, slots=True)
class ControllerAnswer:
    """A controller's answer, read whole: its status, the base URL that answered, the body."""

    status: int
    url: str
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; ControllerUnreachable if it is not (a proxy's error page)."""
        try:
            return json.loads(self.body)
        except ValueError:
            raise ControllerUnreachable(
                f"controller {self.url} answered {self.status} without JSON: {self.text()[:200]!r}"
            ) from None


class Controllers:
    """Requests to whichever controller answers, following a standby's 307 to the leader.

    ``what`` names the URLs in errors (``--controller``, ``controller``); a switch to
    another controller is logged once on ``log`` at ``switch_level``."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        what: str = "controller",
        log: logging.Logger | None = None,
        switch_level: int = logging.WARNING,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self.known = ControllerSet(list(controller_urls(urls, what)))
        self._log = log or logging.getLogger("srtm.controllers")
        self._level = switch_level
        self._connect_s = connect_timeout_s

    @property
    def current(self) -> str:
        """The controller tried first: the last that answered."""
        return self.known.current

    @property
    def urls(self) -> list[str]:
        return list(self.known.urls)

    async def request(
        self,
        session: aiohttp.ClientSession,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> ControllerAnswer:
        """``method path`` at the first controller that answers (see the module's rule).
        A 503 from every one is returned (the last; it says why); ControllerUnreachable if
        none answered at all."""
        walk = Walk(self.known.order())
        url = walk.next()
        unavailable: ControllerAnswer | None = None
        failures: list[str] = []
        while url is not None:
            try:
                reply = await self._once(session, method, url, path, params, json, headers,
                                          timeout_s)  # fmt: skip
            except (aiohttp.ClientError, TimeoutError) as exc:
                failures.append(f"{url}: {str(exc) or type(exc).__name__}")
                url = walk.next()
                continue
            if reply.status == 503:
                unavailable = reply.answer
                url = walk.next()
            elif reply.status in REDIRECTS and reply.location:
                failures.append(f"{url}: {reply.status} to {reply.location}")
                url = walk.redirected(reply.location, url)
            else:
                return self._answered(reply.answer)
        if unavailable is not None:
            return unavailable
        raise ControllerUnreachable("no controller answered: " + "; ".join(failures))

    def _answered(self, answer: ControllerAnswer) -> ControllerAnswer:
        was = self.known.current
        if self.known.settle(answer.url):
            self._log.log(self._level, "now talking to controller %s (was %s)", answer.url, was)
        return answer

    async def _once(
        self,
        session: aiohttp.ClientSession,
        method: str,
        base: str,
        path: str,
        params: Mapping[str, str] | None,
        body: Any,
        headers: Mapping[str, str] | None,
        timeout_s: float | None,
    ) -> _Reply:
        total = timeout_s if timeout_s is not None else session.timeout.total
        connect = self._connect_s if total is None else min(self._connect_s, total)
        timeout = aiohttp.ClientTimeout(total=total, sock_connect=connect)
        async with session.request(
            method, base + path, params=params, json=body, headers=headers,
            timeout=timeout, allow_redirects=False,
        ) as resp:  # fmt: skip
            data = await resp.read()
            return _Reply(ControllerAnswer(resp.status, base, data), resp.headers.get("Location"))


@dataclass(frozen=True, slots=True)
class _Reply:
    answer: ControllerAnswer
    location: str | None

    @property
    def status(self) -> int:
        return self.answer.status
