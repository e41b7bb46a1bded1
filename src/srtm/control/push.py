"""What the controller sends brokers over HTTP: its actions carried out (share changes
without a hole in a topic's ``(r, b)``, handoffs, routes, migration orders, unmanaged
topics), admission orders, measurement rounds and the ping that tells a dead broker."""

from __future__ import annotations

import asyncio
import errno
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from yarl import URL

from srtm.control.actions import (
    Action,
    DropRoute,
    HandoffPlan,
    Hold,
    Migrate,
    PlanChanged,
    SetBucket,
    SetRoute,
    Unmanage,
    forwarding_first,
    handoff,
    phases,
)
from srtm.control.etcd_store import Fenced
from srtm.control.fitting_run import as_result
from srtm.control.leadership import EPOCH_HEADER
from srtm.control.model import BrokerInfo
from srtm.control.state import Controller
from srtm.httpkit import ORDER_HEADER
from srtm.placement import RoundResult
from srtm.security import bearer_header

log = logging.getLogger("srtm.controller")


class Pusher:
    """The controller's HTTP client to brokers, and the order its share changes go in."""

    def __init__(self, ctrl: Controller, token: str | None, retry_s: float) -> None:
        self.ctrl = ctrl
        self.token = token
        #: Open between the service's start and stop.
        self.session: aiohttp.ClientSession | None = None
        #: How soon a decrease a broker did not take is tried again (s).
        self.retry_s = retry_s
        #: Off only to show what the order prevents (tests/test_no_holes.py): every share
        #: change pushed at once, as before.
        self.ordered = True
        #: Per topic: held while its share changes are carried out, so that changes of
        #: two plans never interleave (one plan's increase after the next one's decrease).
        self._shares: dict[str, asyncio.Lock] = {}
        #: The leader's epoch, sent with every request (None: the only controller).
        self.epoch: int | None = None
        #: Whether this controller acts now: nothing is sent to brokers when not.
        self.acting: Callable[[], bool] = lambda: True
        #: How long a change waits for a gaining broker's subscribers (``_readers_found``).
        self.subscriber_wait_s = 0.0
        #: The number of the last order sent (``next_order``).
        self._last_order = 0

    def open(self) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    def next_order(self) -> tuple[int, int]:
        """The next order's place, ``(epoch, number)``: numbers go up within this
        process and, being at least the wall clock in ns, past a restarted one's too
        (on SQLite, where there is no epoch). Brokers refuse a share change older than
        one they took or than their registration answer (``srtm.httpkit.push_order``)."""
        self._last_order = max(self._last_order + 1, time.time_ns())
        return self.epoch or 0, self._last_order

    def _headers(self) -> dict[str, str]:
        """What the controller sends to brokers: the cluster token, if any, the
        leader's epoch (brokers refuse a deposed leader's: 409 ``STALE_LEADER``) and the
        request's number in its order (``next_order``)."""
        headers = bearer_header(self.token)
        epoch, number = self.next_order()
        if self.epoch is not None:
            headers[EPOCH_HEADER] = str(epoch)
        headers[ORDER_HEADER] = str(number)
        return headers

    # -- actions -------------------------------------------------------------------------
    async def carry_out(self, actions: list[Action], written: asyncio.Future[None] | None) -> None:
        if written is not None:
            # Brokers hear of a plan once it would survive a restart; if it cannot be
            # written (logged), the controller still runs on the plan it holds, unless
            # another controller leads now (fenced): that one's plans go out.
            try:
                await written
            except Fenced:
                return
            except Exception:
                pass
        by_topic: dict[str, list[Action]] = {}
        for a in actions:
            if isinstance(a, SetBucket | Hold | SetRoute | DropRoute):
                by_topic.setdefault(a.topic, []).append(a)
        await asyncio.gather(*(self._change_shares(t, acts) for t, acts in by_topic.items()))
        await asyncio.gather(*(self._unmanage(a) for a in actions if isinstance(a, Unmanage)))
        for a in actions:
            if isinstance(a, Migrate):
                await self._order_migration(a)
            elif isinstance(a, PlanChanged):
                log.info("plan of %s is now version %d", a.topic, a.version)

    async def _change_shares(self, topic: str, actions: list[Action]) -> None:
        """Carry out one topic's share changes without a hole in its ``(r, b)``: every
        decrease first, each retried until its broker took it or is down (its lease then
        lapsed: it holds everything); only then the increases still in the plan."""
        routed = [a for a in actions if isinstance(a, SetRoute | DropRoute)]
        if not self.ordered:
            shares = [a for a in actions if isinstance(a, SetBucket | Hold)]
            await asyncio.gather(*(self._push_share(a) for a in shares))
            for r in routed:
                await self._route(r)
            return
        lock = self._shares.setdefault(topic, asyncio.Lock())
        async with lock:
            down, up = phases(actions)
            await self._readers_found(topic, [a.broker for a in up])
            # A broker losing publishers forwards before its share shrinks: what they
            # still send it meanwhile is shaped by their new broker, not its drain share.
            first, routed = forwarding_first(routed, down)
            # One source, one destination: the destination is armed first, then the
            # source's decrease (with its forwarding route, one step) hands the share
            # over on their relay link, so what it forwards is shaped at once, not held
            # there until our own increase push (docs/controller.md, "Push order").
            plan, rest = handoff(down, up, first)
            push = None if plan is None else await self._arm(plan)
            if push is not None:
                first = rest
            for r in first:
                await self._route(r)
            await asyncio.gather(
                *(self._decrease(a, push if push and a is push.plan.source else None) for a in down)
            )
            # Every increase still in the plan, the handed-over one too (the same bucket:
            # a handoff lost with its link or its source costs only today's wait).
            await asyncio.gather(*(self._push_share(a) for a in up if self._current(a)))
            # Other routes once the shares are in place (a broker relays only to brokers
            # shaping with their new share), one by one in the order given (a broker
            # gaining a channel's home hears before the one losing it).
            for r in routed:
                await self._route(r)
        if topic not in self.ctrl.topics and not lock.locked():
            self._shares.pop(topic, None)  # no lock kept per topic ever deleted

    async def _readers_found(self, topic: str, gaining: list[str]) -> None:
        """Make-before-break for subscribers (Dynamoth's: subscribe to the new server,
        then leave the old one): before a broker gains the topic's traffic, wait until it
        carries every channel the topic has elsewhere, i.e. each channel's subscriber
        found it in /lookup (the plan already lists it) and SUBscribed, or until
        ``subscriber_wait_s``. A broker with no subscriber holds what it gets: a move to a
        broker not yet read held tens of messages there for 60-175 ms, until the
        subscribers' next lookup (docs/results/dynamoth.md)."""
        if self.subscriber_wait_s <= 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.subscriber_wait_s
        reg = self.ctrl.registry

        def unread() -> list[str]:
            return [b for b in gaining if b in self.ctrl.brokers
                    and not self.ctrl.brokers[b].down and reg.unread(topic, b)]  # fmt: skip

        while waiting := unread():
            if loop.time() >= deadline:
                log.info("topic %s: no subscriber read %s after %g s; moving on", topic,
                         ", ".join(waiting), self.subscriber_wait_s)  # fmt: skip
                return
            await asyncio.sleep(0.01)

    def _current(self, action: SetBucket) -> bool:
        """Is this increase still what the topic's plan gives the broker? (A later plan
        or adaptation replaced it: that one's own changes carry it out.)"""
        topic = self.ctrl.topics.get(action.topic)
        return topic is not None and topic.buckets.get(action.broker) == action.bucket

    async def _arm(self, plan: HandoffPlan) -> _HandoffPush | None:
        """Arm the destination of ``plan`` with its new share under a fresh token; None
        if it did not take it (the change then goes as without a handoff)."""
        dest = plan.dest
        info = self.ctrl.brokers.get(dest.broker)
        if info is None or info.down:
            return None
        token = secrets.token_hex(16)
        params = {"topic": dest.topic, "rate": repr(dest.bucket.rate),
                  "burst": repr(dest.bucket.burst), "token": token}  # fmt: skip
        if not await self._post_to_broker(dest.broker, "/srtm/bucket/arm", params, dest.topic):
            return None
        return _HandoffPush(plan, info.tcp_address, token)

    async def _decrease(self, action: SetBucket | Hold, push: _HandoffPush | None = None) -> None:
        while not await self._push_share(action, push):
            info = self.ctrl.brokers.get(action.broker)
            if info is None or info.down or action.topic not in self.ctrl.topics:
                return  # down: its lease lapsed, it holds every topic
            await asyncio.sleep(self.retry_s)

    async def _push_share(self, action: SetBucket | Hold, push: _HandoffPush | None = None) -> bool:
        """Push one share change; True once the broker has it (or holds the topic). With
        ``push``: the source's decrease, which sets its forwarding route and hands its
        share over to the armed destination in the same step."""
        extra: dict[str, str] = {}
        body = None
        if push is not None:
            extra = {"handoff": push.to, "token": push.token}
            body = None if push.plan.route is None else push.plan.route.doc
        if isinstance(action, Hold):
            params = {"topic": action.topic, **extra}
            # A refused route (400) would be refused again, a stale hold (409) is older
            # than what the broker took since: taken, logged.
            return await self._post_to_broker(
                action.broker, "/srtm/bucket/hold", params, action.topic,
                taken=(200, 400, 409), body=body,
            )  # fmt: skip
        return await self._push_bucket(action, extra, body)

    async def _order_migration(self, action: Migrate) -> None:
        params = {"topic": action.topic, "publisher": action.publisher, "to": action.to,
                  "version": str(action.version)}  # fmt: skip
        await self._post_to_broker(action.broker, "/srtm/migrate", params, "a migration")

    async def _push_bucket(
        self,
        action: SetBucket,
        extra: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> bool:
        params = {
            k: repr(v) if isinstance(v, float) else str(v)
            for k, v in self.ctrl.bucket_doc(action.topic, action.bucket).items()
        }
        params = {"topic": action.topic, **params, **(extra or {})}  # fmt: skip
        return await self._post_to_broker(
            action.broker, "/srtm/bucket", params, action.topic, taken=(200, 400, 409),
            body=body,
        )  # fmt: skip

    async def _route(self, action: SetRoute | DropRoute) -> None:
        """Push one route (``POST /srtm/route``) or drop it (``DELETE``; 404: none there).
        A broker that does not take it is logged; it gets its routes again when it
        registers."""
        info = self.ctrl.brokers.get(action.broker)
        if info is None or self.session is None or info.down or not self.acting():
            return
        try:
            url = _broker_url(info, "/srtm/route")
            if isinstance(action, SetRoute):
                request = self.session.post(url, json=action.doc, headers=self._headers())
            else:
                params = {"topic": action.topic}
                request = self.session.delete(url, params=params, headers=self._headers())
            async with request as r:
                if r.status not in (200, 404) or (r.status == 404 and isinstance(action, SetRoute)):
                    log.warning("broker %s refused the route of %s: %s", action.broker,
                                action.topic, await r.text())  # fmt: skip
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("broker %s unreachable for the route of %s: %s",
                        action.broker, action.topic, exc)  # fmt: skip

    async def _unmanage(self, action: Unmanage) -> None:
        """The broker drops the topic's sub-bucket and releases what it holds of it (404:
        it never had the topic, nothing to drop)."""
        params = {"topic": action.topic}
        await self._post_to_broker(
            action.broker, "/srtm/bucket", params, action.topic, "DELETE", fine=(200, 404)
        )

    async def _post_to_broker(
        self,
        broker: str,
        path: str,
        params: dict[str, str],
        what: str,
        method: str = "POST",
        fine: tuple[int, ...] = (200,),
        taken: tuple[int, ...] = (200,),
        body: dict[str, Any] | None = None,
    ) -> bool:
        """Send an order to a broker (``fine``: statuses not worth a warning); a refusal
        or an unreachable broker is logged, not raised (a re-registering broker gets its
        sub-buckets again). True when the answer's status is in ``taken``: nothing to try
        again (a bucket refused as invalid (400) never will be; a broker whose lease
        lapsed (409) holds the topic; one that took a newer order (409) has it)."""
        info = self.ctrl.brokers.get(broker)
        if info is None or self.session is None or not self.acting():
            return True  # nothing to retry: a controller not acting sends nothing
        try:
            url = _broker_url(info, path)
            request = self.session.request(
                method, url, params=params, json=body, headers=self._headers()
            )
            async with request as r:
                if r.status not in fine:
                    log.warning("broker %s refused %s: %s", broker, params, await r.text())
                return r.status in taken
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("broker %s unreachable for %s: %s", broker, what, exc)
            return False

    # -- other requests ------------------------------------------------------------------
    async def post_admission(self, broker: str, topic: str, body: dict[str, Any]) -> None:
        info = self.ctrl.brokers.get(broker)
        if info is None or self.session is None or info.down or not self.acting():
            return
        try:
            url = _broker_url(info, "/srtm/admission")
            request = self.session.post(
                url, params={"topic": topic}, json=body, headers=self._headers()
            )
            async with request as r:
                if r.status != 200:
                    log.warning("broker %s refused admission of %s: %s", broker, topic,
                                await r.text())  # fmt: skip
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("broker %s unreachable for admission of %s: %s", broker, topic, exc)

    async def measure(
        self, topic: str, broker: str, publishers: Sequence[str], window_s: float
    ) -> RoundResult:
        info = self.ctrl.brokers.get(broker)
        if info is None or self.session is None or not self.acting():
            return RoundResult(float("nan"), 0)
        params = {"topic": topic, "window_ms": repr(window_s * 1000)}
        timeout = aiohttp.ClientTimeout(total=window_s + 10)
        try:
            url = _broker_url(info, "/srtm/measure")
            async with self.session.post(
                url,
                params=params,
                json={"publishers": list(publishers)},
                timeout=timeout,
                headers=self._headers(),
            ) as resp:
                return as_result(await resp.json())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("measurement on %s failed: %s", broker, exc)
            return RoundResult(float("nan"), 0)

    async def refuses(self, info: BrokerInfo) -> bool:
        """Does the broker's address refuse connections (nothing listens there)? An
        answer, a timeout or any other error: False."""
        if self.session is None:
            return False
        try:
            timeout = aiohttp.ClientTimeout(total=1.0)
            async with self.session.get(_broker_url(info, "/ping"), timeout=timeout) as r:
                await r.read()
            return False
        except aiohttp.ClientConnectorError as exc:
            return getattr(exc.os_error, "errno", None) == errno.ECONNREFUSED
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False


@dataclass(frozen=True, slots=True)
class _HandoffPush:
    """A handoff with its destination armed: where the source sends HANDOFF, and the
    token it carries."""

    plan: HandoffPlan
    to: str
    token: str


def _broker_url(info: BrokerInfo, path: str) -> URL:
    """A URL on a broker's HTTP API built from its parsed host and port (never pasted
    from the registered text, which could carry a path, user info or another host)."""
    host, port = info.http_endpoint()
    return URL.build(scheme="http", host=host, port=port, path=path)
