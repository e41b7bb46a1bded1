"""SRTM's client library: a plan-aware publisher that migrates without loss, a subscriber
of every broker of a topic, and the measurement header."""

from srtm.client.header import Header
from srtm.client.publisher import Publisher
from srtm.client.subscriber import Received, Subscriber

__all__ = ["Header", "Publisher", "Received", "Subscriber"]
