"""SRTM's client library: a plan-aware publisher that migrates without loss, and a
subscriber of every broker of a topic."""

from srtm.client.publisher import Publisher, PublishRefused
from srtm.client.subscriber import Received, Subscriber
from srtm.nsq_connection import BrokerError, HandshakeError
from srtm.protocol.header import Header

__all__ = [
    "BrokerError",
    "HandshakeError",
    "Header",
    "PublishRefused",
    "Publisher",
    "Received",
    "Subscriber",
]
