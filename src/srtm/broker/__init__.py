"""The SRTM broker: nsqd's protocol and semantics, plus per-topic token-bucket shaping."""

from srtm.broker.broker import Broker
from srtm.broker.options import BrokerOptions

__all__ = ["Broker", "BrokerOptions"]
