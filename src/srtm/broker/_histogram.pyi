from typing import Any

def record(
    counts: Any,
    values: Any,
    lowest: int,
    highest: int,
    unit_magnitude: int,
    half_count_magnitude: int,
    sub_bucket_mask: int,
    /,
) -> tuple[int, int]: ...
