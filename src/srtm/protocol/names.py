"""Topic and channel name rules (nsqd's)."""

from __future__ import annotations

import re

EPHEMERAL_SUFFIX = "#ephemeral"
MAX_NAME_LENGTH = 64
_NAME = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?")


def is_valid_name(name: str) -> bool:
    """1–64 characters of ``[.a-zA-Z0-9_-]``, optionally ending in ``#ephemeral``."""
    return 0 < len(name) <= MAX_NAME_LENGTH and _NAME.fullmatch(name) is not None


def is_ephemeral(name: str) -> bool:
    return name.endswith(EPHEMERAL_SUFFIX)


_TOKEN = re.compile(r"[0-9A-Za-z_-]{1,64}")


def is_valid_token(token: str) -> bool:
    """A handoff token (HANDOFF, /srtm/bucket/arm): 1-64 characters of [0-9A-Za-z_-]."""
    return _TOKEN.fullmatch(token) is not None
