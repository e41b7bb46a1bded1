"""SRTM: scalable real-time pub/sub messaging with DRL-aware load distribution."""

__version__ = "0.1.0"
