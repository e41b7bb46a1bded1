"""Disk queues: messages in checksummed append-only segment files (docs/durability.md).

``codec`` is the record format, ``io`` the file work and the disk thread, ``segments``
what a queue knows of its files, ``buffer`` its pushes not written yet, ``ahead`` what it
read and has not handed out, ``queue`` the ``DiskQueue`` itself, ``reserve`` the space
claimed for a graceful stop on a full disk.
"""

from srtm.broker.disk.io import DiskIO
from srtm.broker.disk.queue import DiskQueue
from srtm.broker.disk.reserve import Reserve

__all__ = ["DiskIO", "DiskQueue", "Reserve"]
