"""The controller's typed state reads and writes the JSON it always did: fitting progress
as saved by the old code comes back the same (running: interrupted), a broker's resources
from its report."""

from __future__ import annotations

from typing import Any

from srtm.control.model import FitState, FittingProgress, Resources

OLD_DONE: dict[str, Any] = {
    "state": "done", "iteration": 1, "round": 2, "rounds": [3, 2], "full": ["b1"],
    "steps": [
        {"iteration": 0, "round": 0, "broker": "b0", "publishers": 4, "p99_ms": 3.5,
         "samples": 900, "verdict": "ok"},
        {"iteration": 1, "round": 2, "broker": "b1", "publishers": 2, "p99_ms": None,
         "samples": 0, "verdict": "unknown"},
    ],
    "iteration_brokers": ["b0", "b1"], "outcome": "fitted", "note": "",
}  # fmt: skip


def test_fitting_progress_keeps_its_json() -> None:
    for doc in (OLD_DONE, {"state": "running"}, {"state": "failed"}):
        assert FittingProgress.from_json(doc).to_json() == doc
    assert FittingProgress().to_json() == {"state": "running"}
    assert FittingProgress(started=True).to_json() == {
        "state": "running", "iteration": 0, "round": 0, "rounds": [], "steps": [], "full": [],
    }  # fmt: skip
    assert FittingProgress.from_json(OLD_DONE | {"state": "running"}).state is FitState.RUNNING


def test_resources_from_a_report() -> None:
    doc = {"cpu": 0.5, "egress_bps": 2e6, "congested": {"cpu": True, "network": False}}
    r = Resources.from_json(doc)
    assert (r.cpu, r.egress_bps, r.congested) == (0.5, 2e6, frozenset({"cpu"}))
    assert Resources.from_json({}) == Resources()
