"""nsqd's limits, as one value the codec and the broker share."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Limits:
    max_msg_size: int = MIB
    max_body_size: int = 5 * MIB
    max_rdy_count: int = 2500
    min_msg_timeout_ms: int = 1_000
    max_msg_timeout_ms: int = 15 * 60_000
    max_req_timeout_ms: int = 60 * 60_000
    #: Longest command line accepted; a longer one is garbage, not a command.
    max_line: int = 1024
