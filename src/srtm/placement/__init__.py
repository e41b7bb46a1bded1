"""Pure load distribution: policies, online fitting, the TB Adaptor's rule."""

from srtm.placement.model import (
    RATE_MARGIN,
    Assignment,
    Broker,
    Placement,
    Publisher,
    Topic,
    parse_brokers,
    parse_topic,
)
from srtm.placement.policies import POLICIES, Policy, place

__all__ = [
    "POLICIES",
    "RATE_MARGIN",
    "Assignment",
    "Broker",
    "Placement",
    "Policy",
    "Publisher",
    "Topic",
    "parse_brokers",
    "parse_topic",
    "place",
]
