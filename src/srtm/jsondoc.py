"""JSON text from outside (request bodies, files named on the command line) parsed into
Python values, or a ``ValueError`` that says where the text went wrong: both HTTP APIs
and the command line refuse bad JSON in the same words, naming the line and column.

Stdlib only, so that the broker, the controller and the command line can all share it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["parse", "parse_object"]


def parse(text: str | bytes, what: str = "body") -> Any:
    """``text`` parsed as JSON (bytes as UTF-8, -16 or -32, as ``json.loads`` reads them);
    a ValueError naming ``what`` and, for a syntax error, the line and column (1-based) of
    the first character that is not JSON. Whether numbers are finite is the caller's to
    check (``NaN`` and ``1e999`` are read as Python reads them): a field's validator can
    name the field."""
    if not text.strip():
        raise ValueError(f"{what} is empty, not JSON")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        why = exc.msg[:1].lower() + exc.msg[1:]
        raise ValueError(
            f"{what} is not JSON: {why} at line {exc.lineno} column {exc.colno}"
        ) from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} is not JSON: not UTF-8 text at byte {exc.start}") from None
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply to be read as JSON") from None
    except ValueError:  # the only other ValueError json raises: int()'s digit limit
        raise ValueError(
            f"{what} cannot be read as JSON: an integer in it has more than "
            f"{sys.get_int_max_str_digits()} digits"
        ) from None


def parse_object(text: str | bytes, what: str = "body") -> dict[str, Any]:
    """``parse``, then a ValueError unless the value is a JSON object."""
    doc = parse(text, what)
    if not isinstance(doc, dict):
        raise ValueError(f"{what} must be a JSON object, got {kind(doc)}")
    return doc


def kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words: "an array", "a string", "null"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
