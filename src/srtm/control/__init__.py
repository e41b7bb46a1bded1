"""The controller: broker registry, topics with SLOs, plans, the TB Adaptor, persistence."""

from srtm.control.state import ControlError, Controller, Hold, PlanChanged, SetBucket

__all__ = ["ControlError", "Controller", "Hold", "Migrate", "PlanChanged", "SetBucket"]
