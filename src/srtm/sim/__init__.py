"""Simulator of publishers → sub-buckets → broker queues, calibrated on the real broker.

Pure and vectorised (numpy): ``arrivals`` (the workload's processes in bulk), ``engine``
(token waits, processing queues, latency per message), ``model`` (broker models as JSON;
``calibrated``, measured, and ``paper``, chosen, ship; ``at_paper_speed``), ``placing``
and ``predict`` (placements, model-assisted fitting), and ``scenario`` (live scenarios and
replays). No I/O: the models are measured on a real broker
by ``srtm.experiments.calibrate``.
"""

from srtm.sim.arrivals import Trace, from_schedule, generate, homogeneous
from srtm.sim.engine import Background, Share, SimResult, Stats, simulate
from srtm.sim.model import BrokerModel, Dist, at_paper_speed, calibrated, load, paper, save
from srtm.sim.placing import on_brokers, shares_of, topic_of, validated
from srtm.sim.predict import BrokerSim, Predictor, SimRounds, predictor_for_topic, run_fitting
from srtm.sim.probe import capacity_at_slo, probe

__all__ = [
    "Background",
    "BrokerModel",
    "BrokerSim",
    "Dist",
    "Predictor",
    "Share",
    "SimResult",
    "SimRounds",
    "Stats",
    "Trace",
    "at_paper_speed",
    "calibrated",
    "capacity_at_slo",
    "from_schedule",
    "generate",
    "homogeneous",
    "load",
    "on_brokers",
    "paper",
    "predictor_for_topic",
    "probe",
    "run_fitting",
    "save",
    "shares_of",
    "simulate",
    "topic_of",
    "validated",
]
