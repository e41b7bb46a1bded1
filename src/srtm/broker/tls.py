"""TLS for NSQ's TCP protocol (IDENTIFY ``tls_v1``) and the HTTPS API, nsqd's way; and
the client side the relay's links to other brokers use (``RelaySecurity``: TLS, AUTH).

The TCP side stays on the broker's raw-socket reader: a ``TlsSession`` is a sans-I/O
``ssl.SSLObject`` over two memory BIOs, fed the ciphertext each ``recvmsg`` returns (so
kernel receive timestamps keep working) and handing back the ciphertext to send.
"""

from __future__ import annotations

import contextlib
import ssl
from dataclasses import dataclass
from typing import Any

from srtm.broker.options import BrokerOptions, RelayTls, TlsClientAuthPolicy, TlsRequired
from srtm.protocol.session import DEFAULT_CLASS, Keys, is_valid_class

_READ_SIZE = 64 * 1024


def server_context(opts: BrokerOptions) -> ssl.SSLContext | None:
    """The broker's server-side context, or None when no certificate is configured.

    Raises ValueError naming the bad option (missing key, unreadable file, bad policy)."""
    if opts.tls_required not in TlsRequired.__members__.values():
        raise ValueError(
            f"--tls-required must be one of {', '.join(TlsRequired)}, not {opts.tls_required!r}"
        )
    if opts.tls_client_auth_policy not in TlsClientAuthPolicy.__members__.values():
        raise ValueError(
            "--tls-client-auth-policy must be 'require' or 'require-verify', "
            f"not {opts.tls_client_auth_policy!r}"
        )
    if opts.tls_cert is None and opts.tls_key is None:
        if (
            opts.tls_required != TlsRequired.FALSE
            or opts.tls_client_auth_policy
            or opts.https_port is not None
        ):
            raise ValueError(
                "--tls-required, --tls-client-auth-policy and --https-address need "
                "--tls-cert and --tls-key"
            )
        return None
    if opts.tls_cert is None or opts.tls_key is None:
        raise ValueError("--tls-cert and --tls-key go together")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(opts.tls_cert, opts.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"--tls-cert/--tls-key: cannot load {opts.tls_cert}: {exc}") from exc
    if opts.tls_root_ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=opts.tls_root_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"--tls-root-ca-file: cannot load {opts.tls_root_ca_file}: {exc}"
            ) from exc
    if opts.tls_client_auth_policy:
        # Python's ssl cannot ask for a certificate without verifying it, so nsqd's
        # "require" (any certificate) is as strict as "require-verify" here.
        ctx.verify_mode = ssl.CERT_REQUIRED
        if opts.tls_root_ca_file is None:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    return ctx


@dataclass(frozen=True, slots=True)
class RelaySecurity:
    """How a relay link talks to a peer: TLS (``context`` None: never asked for) and the
    AUTH secret sent to a peer that answers ``auth_required`` (None: none)."""

    tls: RelayTls = RelayTls.FALSE
    context: ssl.SSLContext | None = None
    secret: str | None = None
    #: The cluster token: sent as AUTH to a peer that checks relay links itself
    #: (IDENTIFY's answer ``srtm_relay_auth``) when no relay secret is set.
    token: str | None = None

    def proof(self, peer_checks: bool) -> str | None:
        """What to AUTH with: the relay secret; else the token, to a peer that checks it
        itself (never to a peer's auth server, which has no business knowing it)."""
        if self.secret is not None:
            return self.secret
        return self.token if peer_checks else None

    def __repr__(self) -> str:  # never a secret, in a log or a traceback
        return (
            f"RelaySecurity(tls={self.tls.value!r}, auth={self.secret is not None}, "
            f"token={self.token is not None})"
        )


def relay_security(opts: BrokerOptions) -> RelaySecurity:
    """The relay's TLS context and AUTH secret from --relay-*. Raises ValueError naming
    the bad option (unreadable file, a key without its certificate, both secrets)."""
    if opts.relay_tls not in RelayTls.__members__.values():
        raise ValueError(
            f"--relay-tls must be one of {', '.join(RelayTls)}, not {opts.relay_tls!r}"
        )
    if (opts.relay_tls_cert is None) != (opts.relay_tls_key is None):
        raise ValueError("--relay-tls-cert and --relay-tls-key go together")
    return RelaySecurity(
        RelayTls(opts.relay_tls), _relay_context(opts), _relay_secret(opts), opts.token
    )


def identity_keys(opts: BrokerOptions, relay_secret: str | None) -> Keys:
    """What proves an identity here: the token and relay secret (a relay link, any
    class), and --class-secret's. Raises ValueError naming the bad entry."""
    classes: dict[str, str] = {}
    for entry in opts.class_secret:
        klass, sep, secret = entry.partition("=")
        if not sep or not secret:
            raise ValueError(f"--class-secret wants CLASS=SECRET, not {klass!r}")
        if not is_valid_class(klass) or klass == DEFAULT_CLASS:
            raise ValueError(f"--class-secret: {klass[:40]!r} is not a class above default")
        if klass in classes:
            raise ValueError(f"--class-secret: class {klass!r} given twice")
        classes[klass] = secret
    operator = tuple(k for k in (opts.token, relay_secret) if k)
    return Keys(operator, classes)


def _relay_context(opts: BrokerOptions) -> ssl.SSLContext | None:
    if opts.relay_tls == RelayTls.FALSE:
        return None
    cafile = opts.relay_tls_root_ca_file
    try:
        # Verifies the peer's certificate and that it names the host of its address.
        ctx = ssl.create_default_context(cafile=None if cafile is None else str(cafile))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"--relay-tls-root-ca-file: cannot load {cafile}: {exc}") from exc
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if opts.relay_tls_cert is not None and opts.relay_tls_key is not None:
        try:
            ctx.load_cert_chain(opts.relay_tls_cert, opts.relay_tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"--relay-tls-cert/--relay-tls-key: cannot load {opts.relay_tls_cert}: {exc}"
            ) from exc
    return ctx


def _relay_secret(opts: BrokerOptions) -> str | None:
    path = opts.relay_auth_secret_file
    if path is None:
        return opts.relay_auth_secret or None
    if opts.relay_auth_secret:
        raise ValueError("give --relay-auth-secret or --relay-auth-secret-file, not both")
    try:
        secret = path.read_text().rstrip("\r\n")
    except (OSError, UnicodeError) as exc:
        raise ValueError(f"--relay-auth-secret-file: cannot read {path}: {exc}") from exc
    if not secret:
        raise ValueError(f"--relay-auth-secret-file: {path} is empty")
    return secret


def tcp_requires_tls(opts: BrokerOptions) -> bool:
    """nsqd turns --tls-required on when a client-certificate policy is set."""
    return opts.tls_required != TlsRequired.FALSE or bool(opts.tls_client_auth_policy)


def http_requires_tls(opts: BrokerOptions) -> bool:
    return opts.tls_required == TlsRequired.TRUE or (
        bool(opts.tls_client_auth_policy) and opts.tls_required == TlsRequired.FALSE
    )


class TlsSession:
    """The server side of one connection's TLS, without I/O: ciphertext in, plaintext out,
    plaintext in, ciphertext out. Plaintext written before the handshake completes (the
    OK nsqd sends after the upgrade) waits and leaves right after the handshake."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.established = False
        #: The peer sent close_notify: send what is due, then close.
        self.peer_closed = False
        self._early = bytearray()

    def receive(self, data: bytes) -> bytes:
        """Feed ciphertext from the peer; returns the plaintext it completes. What must be
        sent back (handshake, tickets, close_notify) is collected by the next ``wrap``.
        Raises ssl.SSLError when the handshake or a record fails."""
        self._incoming.write(data)
        if not self.established:
            try:
                self._ssl.do_handshake()
            except ssl.SSLWantReadError:
                return b""
            self.established = True
            if self._early:
                self._ssl.write(self._early)
                self._early.clear()
        plain = bytearray()
        while True:
            try:
                chunk = self._ssl.read(_READ_SIZE)
            except ssl.SSLWantReadError:
                break
            if not chunk:
                # The peer's close_notify (read() then gives b""): answer with ours, for
                # the peer's shutdown waits for it.
                self.peer_closed = True
                with contextlib.suppress(ssl.SSLError):
                    self._ssl.unwrap()
                break
            plain += chunk
        return bytes(plain)

    def wrap(self, data: bytes) -> bytes:
        """Queue plaintext for the peer; returns all ciphertext now ready to send."""
        if data:
            if self.established:
                self._ssl.write(data)
            else:
                self._early += data
        return self._outgoing.read()

    def close_notify(self) -> bytes:
        """Our close_notify, to send before closing (best effort; b"" when not due)."""
        if not self.established or self.peer_closed:
            return b""
        with contextlib.suppress(ssl.SSLError):
            self._ssl.unwrap()
        self.peer_closed = True
        return self._outgoing.read()

    @property
    def version(self) -> str | None:
        return self._ssl.version() if self.established else None

    @property
    def cipher(self) -> str | None:
        info = self._ssl.cipher() if self.established else None
        return info[0] if info else None

    @property
    def common_name(self) -> str:
        """The client certificate's subject CN ("" without a verified certificate)."""
        if not self.established:
            return ""
        cert = self._ssl.getpeercert() or {}
        subject: Any = cert.get("subject", ())
        for rdn in subject:
            for pair in rdn:
                if pair[0] == "commonName":
                    return str(pair[1])
        return ""
