"""NSQ error codes, and which of them end the connection."""

from __future__ import annotations

E_INVALID = "E_INVALID"
E_BAD_BODY = "E_BAD_BODY"
E_BAD_TOPIC = "E_BAD_TOPIC"
E_BAD_CHANNEL = "E_BAD_CHANNEL"
E_BAD_MESSAGE = "E_BAD_MESSAGE"
E_PUB_FAILED = "E_PUB_FAILED"
E_MPUB_FAILED = "E_MPUB_FAILED"
E_DPUB_FAILED = "E_DPUB_FAILED"
E_FIN_FAILED = "E_FIN_FAILED"
E_REQ_FAILED = "E_REQ_FAILED"
E_TOUCH_FAILED = "E_TOUCH_FAILED"
E_AUTH_FAILED = "E_AUTH_FAILED"
E_UNAUTHORIZED = "E_UNAUTHORIZED"

#: nsqd keeps the connection open after these; every other error closes it.
NON_FATAL = frozenset({E_FIN_FAILED, E_REQ_FAILED, E_TOUCH_FAILED})


class ProtocolError(Exception):
    """An error to send to the client as an error frame: ``"<code> <message>"``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    @property
    def fatal(self) -> bool:
        return self.code not in NON_FATAL

    def __str__(self) -> str:
        return f"{self.code} {self.message}" if self.message else self.code
