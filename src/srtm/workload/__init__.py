"""Publisher emulation: schedules of Poisson or periodic senders, batches, correlated groups."""

from srtm.workload.schedule import PublisherSpec, Schedule, build

__all__ = ["PublisherSpec", "Schedule", "build"]
