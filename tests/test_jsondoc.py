"""The one wording both HTTP APIs and the command line refuse bad JSON in
(``srtm.jsondoc``): where the text stops being JSON, by line and column, or what it is
instead of an object."""

from __future__ import annotations

import pytest

from srtm.jsondoc import parse, parse_object


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "x is empty, not JSON"),
        (b" \n ", "x is empty, not JSON"),
        ('{\n  "a": 1,\n  "b": tru\n}', "x is not JSON: expecting value at line 3 column 8"),
        ('{"a": 1}\n{"b": 2}', "x is not JSON: extra data at line 2 column 1"),
        ("[1, 2", "x is not JSON: expecting ',' delimiter at line 1 column 6"),
        (b'["\xc3"]', "x is not JSON: not UTF-8 text at byte 2"),
        ("[" * 5_000, "x is nested too deeply to be read as JSON"),
        ("9" * 5_000, "x cannot be read as JSON: an integer in it has more than 4300 digits"),
    ],
)
def test_text_that_is_not_json_is_refused_saying_where(text: str | bytes, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse(text, "x")
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("text", "kind"),
    [("[]", "an array"), ("null", "null"), ("true", "true"), ("1.5", "a number"),
     ('"s"', "a string"), ("NaN", "a number")],
)  # fmt: skip
def test_json_that_is_not_an_object_is_refused_saying_what_it_is(text: str, kind: str) -> None:
    assert parse(text) is not None or kind == "null"
    with pytest.raises(ValueError, match=f"^body must be a JSON object, got {kind}$"):
        parse_object(text)


def test_an_object_is_returned_as_parsed() -> None:
    assert parse_object(b'{"a": [1, 2.5, null], "b": {"c": "d"}}') == {
        "a": [1, 2.5, None],
        "b": {"c": "d"},
    }
