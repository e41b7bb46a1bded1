"""The controller: broker registry, topics with SLOs, plans, the TB Adaptor, persistence."""

from srtm.control.actions import Hold, Migrate, PlanChanged, SetBucket
from srtm.control.state import ControlError, Controller

__all__ = ["ControlError", "Controller", "Hold", "Migrate", "PlanChanged", "SetBucket"]
