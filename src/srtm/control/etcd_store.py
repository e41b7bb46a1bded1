"""``StateStore`` on etcd v3 (``EtcdStore``), spoken through etcd's JSON gateway
(``/v3/kv/range``, ``/v3/kv/txn``; keys and values base64) with the standard library.

Synchronous like ``SqliteStore``: the service calls a store off its event loop, from its
single writer thread. Each request has a timeout; an endpoint that refuses the connection
or does not answer in time is left for the next one, and the store keeps using the one that
answered. A batch is one transaction (its puts and deletes as the transaction's success
operations), so one etcd revision. etcd counts only changes: a batch that changes nothing
(empty, or deleting keys that are not there) leaves the revision where it was, where
SQLite's would count one; revisions only grow either way.

The requests are built by ``srtm.etcd``'s pure functions and the answers read by
``entries_of`` and ``header_revision``; only ``EtcdStore._call`` (through
``_post``) does I/O."""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from srtm.control.store import (
    BROKERS_KEY,
    BUCKETS_PREFIX,
    LEGACY_KEY,
    TOPIC_PREFIX,
    Batch,
    Entry,
    SqliteStore,
    StateStore,
)
from srtm.etcd import Compare, Op, check_prefix, endpoint_urls, range_body, txn_body

if TYPE_CHECKING:
    from srtm.control.options import ControllerOptions

#: Seconds one request may take before the next endpoint is tried.
REQUEST_TIMEOUT_S = 2.0


class StoreError(RuntimeError):
    """etcd could not be used: no endpoint answered, or one refused the request."""


class Fenced(StoreError):
    """The write's fence failed: this controller is no longer the leader it wrote as."""


def header_revision(answer: dict[str, Any]) -> int:
    # The gateway writes int64s as strings and leaves out fields that are zero.
    try:
        return int(answer["header"].get("revision", 0))
    except (KeyError, AttributeError, TypeError, ValueError) as e:
        raise StoreError(f"etcd answered without a header revision: {answer!r:.200}") from e


def entries_of(answer: dict[str, Any], strip: str) -> list[Entry]:
    """A range's keys (``strip`` cut off their front) in the order they were first written:
    by ``create_revision``. The keys one batch created share it; they come by key."""
    found = []
    for kv in answer.get("kvs", []):
        key = base64.b64decode(kv["key"]).decode()
        doc = base64.b64decode(kv.get("value", "")).decode()
        created, modified = int(kv.get("create_revision", 0)), int(kv.get("mod_revision", 0))
        found.append((created, key, Entry(key.removeprefix(strip), doc, modified)))
    return [entry for _, _, entry in sorted(found, key=lambda f: (f[0], f[1]))]


def unique_keys(batch: Batch, full: str) -> dict[str, str | None]:
    """A batch as etcd takes it: a transaction may name a key once, so a key's last
    change in the batch is the one written (as applying the batch in order would)."""
    return {full + key: doc for key, doc in batch}


class EtcdStore:
    """``StateStore`` under ``prefix`` in an etcd cluster: the key ``k`` is ``prefix/k``.
    ``revision`` is etcd's (the cluster's) revision after the last write, or when opened."""

    def __init__(
        self,
        endpoints: list[str],
        prefix: str = "/srtm",
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        if not endpoints:
            raise ValueError("EtcdStore needs at least one endpoint (http://host:port)")
        for url in endpoints:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"etcd endpoint {url!r} is not http://host:port")
        self._endpoints = [url.rstrip("/") for url in endpoints]
        self._full = prefix.rstrip("/") + "/"
        self._timeout_s = timeout_s
        self._closed = False
        #: A leader's fence (``Compare.created`` on its leader key): every write is
        #: conditional on it, and fails with ``Fenced`` once it no longer holds.
        self.fence: Compare | None = None
        self._revision = header_revision(self._call("range", range_body(self._full)))

    @property
    def revision(self) -> int:
        return self._revision

    def get(self, key: str) -> Entry | None:
        found = entries_of(self._call("range", range_body(self._full + key)), self._full)
        return found[0] if found else None

    def list(self, prefix: str) -> list[Entry]:
        answer = self._call("range", range_body(self._full + prefix, prefix=True))
        return entries_of(answer, self._full)

    def put(self, key: str, doc: str) -> None:
        self.write([(key, doc)])

    def delete(self, key: str) -> None:
        self.write([(key, None)])

    def write(self, batch: Batch) -> None:
        keys = unique_keys(batch, self._full)  # the whole batch first: nothing sent if it fails
        if not keys:
            return
        ops = [Op(key, doc) for key, doc in keys.items()]
        fence = self.fence
        answer = self._call("txn", txn_body([] if fence is None else [fence], ops, []))
        if answer.get("succeeded") is not True:
            if fence is not None:
                raise Fenced(f"not written: {fence.key} is no longer this leader's")
            raise StoreError(f"etcd did not apply the transaction: {answer!r:.200}")
        self._revision = header_revision(answer)

    def close(self) -> None:
        self._closed = True  # HTTP requests hold no connection open between calls

    def _call(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``/v3/kv/<method>`` to the first endpoint that answers, starting with the
        one that answered last. A write whose answer timed out may have been applied; the
        next endpoint applies it again, which leaves the same keys (a revision later)."""
        if self._closed:
            raise StoreError("the etcd store is closed")
        failures = []
        for url in list(self._endpoints):
            try:
                answer = self._post(url, method, body)
            except urllib.error.HTTPError as e:  # it answered: no failover
                detail = e.read().decode(errors="replace")[:200]
                raise StoreError(f"etcd at {url} refused /v3/kv/{method}: {e} {detail}") from e
            except ValueError as e:
                raise StoreError(f"etcd at {url} answered /v3/kv/{method} with {e}") from e
            except (urllib.error.URLError, OSError) as e:
                reason = e.reason if isinstance(e, urllib.error.URLError) else e
                failures.append(f"{url}: {str(reason) or type(reason).__name__}")
                continue
            if url != self._endpoints[0]:  # keep to the endpoint that answers
                self._endpoints.remove(url)
                self._endpoints.insert(0, url)
            return answer
        raise StoreError(f"no etcd endpoint answered /v3/kv/{method}: " + "; ".join(failures))

    def _post(self, url: str, method: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{url}/v3/kv/{method}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                answer = json.loads(response.read())
        except TimeoutError as e:  # connected, but no answer in time
            raise OSError(f"no answer in {self._timeout_s} s") from e
        if not isinstance(answer, dict):
            raise ValueError(f"not a JSON object: {answer!r:.200}")
        return answer


def open_store(opts: ControllerOptions) -> StateStore:
    """The controller's store: etcd with ``--etcd-endpoints`` (``--db`` unused), else
    SQLite in ``--db``. etcd not answering at start is a ConnectionError naming the
    endpoints: a controller that cannot load its state must not serve an empty one."""
    if opts.etcd_endpoints is None:
        return SqliteStore(opts.db)
    urls = endpoint_urls(opts.etcd_endpoints)
    check_prefix(opts.etcd_prefix)
    try:
        store = EtcdStore(urls, opts.etcd_prefix)
        claim_prefix(store, opts.etcd_prefix, opts.token)
    except StoreError as e:
        raise ConnectionError(f"cannot reach etcd at {', '.join(urls)}: {e}") from None
    return store


#: The key that marks a prefix as one SRTM cluster's: its format and whose it is.
CLUSTER_KEY = "cluster"
CLUSTER_FORMAT = 1
#: The keys an SRTM cluster keeps under its prefix (the state rows, the leader, the
#: brokers' liveness): anything else means the prefix is someone else's.
OWN_KEYS = (CLUSTER_KEY, LEGACY_KEY, BROKERS_KEY, "leader")
OWN_PREFIXES = (TOPIC_PREFIX, BUCKETS_PREFIX, "live/")


def token_fingerprint(token: str | None) -> str | None:
    """Whose cluster a prefix holds, without keeping the token: controllers of one
    cluster share its token."""
    return None if token is None else hashlib.sha256(token.encode()).hexdigest()[:16]


def cluster_doc(token: str | None) -> str:
    return json.dumps({"format": CLUSTER_FORMAT, "token_sha256": token_fingerprint(token)})


def foreign_keys(store: EtcdStore) -> list[str]:
    keys = [e.key for e in store.list("")]
    return [k for k in keys if k not in OWN_KEYS and not k.startswith(OWN_PREFIXES)]


def claim_prefix(store: EtcdStore, prefix: str, token: str | None) -> None:
    """Refuse (ValueError naming the prefix) a prefix that holds another cluster's state:
    keys SRTM does not write, a marker of another format, or one made with another
    ``--token``; mark an unmarked prefix as this cluster's."""
    marker = store.get(CLUSTER_KEY)
    if marker is None:
        strange = foreign_keys(store)
        if strange:
            shown = ", ".join(repr(k) for k in strange[:3])
            raise ValueError(
                f"--etcd-prefix {prefix}: etcd holds keys there that are not an SRTM "
                f"cluster's ({shown}{', ...' if len(strange) > 3 else ''}); give another prefix"
            )
        store.put(CLUSTER_KEY, cluster_doc(token))
        return
    try:
        doc = json.loads(marker.doc)
        format_, owner = doc["format"], doc["token_sha256"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"--etcd-prefix {prefix}: its {CLUSTER_KEY!r} key is not SRTM's") from None
    if format_ != CLUSTER_FORMAT:
        raise ValueError(
            f"--etcd-prefix {prefix}: the state there is in format {format_!r}, "
            f"this controller reads format {CLUSTER_FORMAT}"
        )
    if owner != token_fingerprint(token):
        raise ValueError(
            f"--etcd-prefix {prefix}: etcd holds another cluster's state there (made with "
            "another --token); give this cluster's token or another prefix"
        )
