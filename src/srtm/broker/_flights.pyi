from typing import Any

def fin_flights(
    flights: dict[bytes, Any], mids: list[bytes], consumer: object, /
) -> tuple[int, list[bytes], list[tuple[Any, int]], int]: ...
def fly(
    flights: dict[bytes, Any], recs: list[Any], consumer: object, deadline: int, /
) -> list[bytes]: ...
