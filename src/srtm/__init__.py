"""SRTM: scalable real-time pub/sub messaging with DRL-aware load distribution."""

from srtm.version import __version__

__all__ = ["__version__"]
