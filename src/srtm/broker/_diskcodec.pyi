from srtm.broker.message import Origin
from srtm.broker.queue import Record

def encode_batch(records: list[Record], /) -> bytes: ...
def decode_batch(
    buf: bytes, pos: int, want: int, max_bytes: int, version: int, origin: Origin | None, /
) -> tuple[list[Record], int, str | None]: ...
